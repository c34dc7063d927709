"""What the profiler's e2e tests share: settings for a sim-backend profiler, a stand-in binder."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alnair.common.kube import PODS, Conflict, KubeClient
from alnair.profiler.settings import ProfilerSettings


def profiler_settings(
    kubeconfig: Path | str, nats_url: str, redis_url: str, node: str, **over: Any
) -> ProfilerSettings:
    """A sim-backend profiler serving `node` on a free HTTP port; `over` replaces any field."""
    return ProfilerSettings.model_validate(
        {
            "nats_url": nats_url,
            "redis_url": redis_url,
            "kubeconfig": str(kubeconfig),
            "http_host": "127.0.0.1",
            "http_port": 0,
            "backend": "sim",
            "sim_node_selector": f"kubernetes.io/hostname={node}",
            "log_json": False,
            **over,
        }
    )


async def bind_pending_pods(
    kube: KubeClient, namespace: str, node_for: Callable[[dict[str, Any]], str | None]
) -> None:
    """Stands in for the scheduler (not running in these tests): binds every pending pod of the
    namespace, now and as they are created, to the node `node_for` names (None: leave it)."""
    listed = await kube.list(PODS, namespace)
    version = listed["metadata"]["resourceVersion"]
    pods = list(listed["items"])
    while True:
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            node = node_for(pod)
            if node is not None:
                with contextlib.suppress(Conflict):
                    await kube.bind(namespace, pod["metadata"]["name"], node)
        pods = []
        async for kind, pod in kube.watch(PODS, namespace, resource_version=version):
            version = pod["metadata"]["resourceVersion"]
            if kind == "ADDED":
                pods = [pod]
                break
