"""What the dispatcher's e2e tests share: queue-labelled Jobs, ClusterQueues and LocalQueues,
the dispatcher's settings on a test's own node pool, and how to read what it decided."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from alnair.common import resources as r
from alnair.common.kube import JOBS, KubeClient
from alnair.common.localstack import ControlPlane
from alnair.common.localstack.controlplane import load_manifests
from alnair.scheduler.dispatcher.app import Running as RunningDispatcher
from alnair.scheduler.dispatcher.objects import ANN_ADMITTED_TYPE, LABEL_QUEUE
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.live.binder import Scheduler
from alnair.scheduler.settings import SchedulerSettings
from kube_builders import BASE

POOL = "alnair.io/test-pool"
WEBHOOK_CONFIG = "alnair-dispatcher"
"""The shipped MutatingWebhookConfiguration's name (deploy/kustomize/base/dispatcher)."""


def gpu_job(
    name: str, ns: str, queue: str, gpus: int, *, duration_s: float = 600,
    model: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {LABEL_QUEUE: queue},
            "annotations": dict(model or {}),
        },
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {r.ANN_DURATION: f"{duration_s}s"}},
                "spec": {
                    "schedulerName": r.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "nodeSelector": {POOL: ns},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer",
                            "resources": {"limits": {r.GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def cluster_queue(
    name: str, cohort: str | None, quota: dict[str, int], borrowing: int | None = None
) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    flavors = []
    for model, nominal in quota.items():
        resources = [{"name": r.GPU, "nominalQuota": nominal}]
        if borrowing is not None:
            resources[0]["borrowingLimit"] = borrowing
        flavors.append({"name": model, "resources": resources})
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": [r.GPU], "flavors": flavors}]}
    if cohort:
        spec["cohort"] = cohort
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str, ns: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterQueue": cq},
    }


async def wait_for(predicate: Any, timeout_s: float = 30, interval_s: float = 0.05) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            value = await predicate()
            if value:
                return value
            await asyncio.sleep(interval_s)


async def job(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.get(JOBS, name, ns)


async def admitted_type(kube: KubeClient, ns: str, name: str) -> str | None:
    j = await job(kube, ns, name)
    if j["spec"].get("suspend"):
        return None
    return (j["metadata"].get("annotations") or {}).get(ANN_ADMITTED_TYPE)


def dispatcher_settings(cp: ControlPlane, ns: str, **kw: Any) -> DispatcherSettings:
    base: dict[str, Any] = {
        "kubeconfig": str(cp.kubeconfig),
        "http_port": 0,
        "http_host": "127.0.0.1",
        "nats_enabled": False,
        "node_selector": f"{POOL}={ns}",
        "policy": "alnair",
    }
    base.update(kw)
    return DispatcherSettings(**base)


async def explain(running: RunningDispatcher, ns: str, name: str, ok: Any) -> Any:
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{running.url}/v1/jobs/{ns}/{name}")
    if resp.status_code != 200:
        return None
    doc = resp.json()
    return doc if ok(doc) else None


@contextlib.asynccontextmanager
async def scheduler(kube: KubeClient) -> AsyncIterator[Scheduler]:
    sched = Scheduler(
        kube,
        SchedulerSettings(leader_elect=False, nats_enabled=False, seed=3, identity="disp-e2e"),
    )
    await sched.start_watching()
    task = asyncio.create_task(sched.run())
    try:
        yield sched
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sched.stop()


def url_webhook_config(url: str, namespace: str) -> dict[str, Any]:
    """The shipped configuration, pointed at `url` and limited to the test's namespace (so no
    other test's Jobs depend on this dispatcher)."""
    (config,) = [
        d
        for d in load_manifests(BASE / "dispatcher" / "webhook.yaml")
        if d["kind"] == "MutatingWebhookConfiguration"
    ]
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Fail"
        hook["clientConfig"] = {"url": f"{url}/mutate"}
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return config
