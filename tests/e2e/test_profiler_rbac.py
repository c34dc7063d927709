"""The shipped RBAC is enough: agent and aggregator each run as their own ServiceAccount of
deploy/kustomize/base/profiler, with a token from the TokenRequest API, and do their whole job
(label a node, profile and record a Job, run a TrialJob, annotate owners)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml
from nats.aio.msg import Msg

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.events import JobEvent, decode
from alnair.common.kube import JOBS, NAMESPACES, NODES, TRIALJOBS, Conflict, KubeClient
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import load_manifests
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.app import start_agent, start_aggregator
from alnair.profiler.settings import ProfilerSettings
from profiler_support import bind_pending_pods, profiler_settings

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


async def service_account_kubeconfig(
    cp: ControlPlane, kube: KubeClient, account: str, path: Path
) -> Path:
    with contextlib.suppress(Conflict):
        await kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "alnair-system"}},
        )
    base = REPO / "deploy/kustomize/base/profiler"
    # The sim variant's RBAC: the aggregator's, the node agent's and the sim agent's own.
    for manifest in (
        base / "common/rbac.yaml",
        base / "agent-rbac/rbac.yaml",
        base / "sim/rbac-sim.yaml",
    ):
        for doc in load_manifests(manifest):
            await kube.apply(doc)
    token = await kube.service_account_token("alnair-system", account)
    assert cp.pki is not None
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": cp.server, "certificate-authority": str(cp.pki.ca_cert)},
            }
        ],
        "users": [{"name": "profiler", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "profiler"}}],
    }
    await asyncio.to_thread(path.write_text, yaml.safe_dump(doc))
    return path


async def test_profiler_works_with_only_its_own_rbac(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_url: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    agent_config = await service_account_kubeconfig(
        control_plane, kube, "alnair-profiler-agent", tmp_path / "agent.kubeconfig"
    )
    aggregator_config = await service_account_kubeconfig(
        control_plane, kube, "alnair-profiler-aggregator", tmp_path / "aggregator.kubeconfig"
    )
    node = f"rbac-{namespace}"
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", res.GPU: "4"}
    await kube.create(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "labels": {
                    "kubernetes.io/hostname": node,
                    "type": "kwok",
                    res.LABEL_GPU_MODEL: "P100",
                },
                "annotations": {res.ANN_KWOK_NODE: "fake"},
            },
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        },
    )

    def settings(kubeconfig: Path, **over: Any) -> ProfilerSettings:
        return profiler_settings(kubeconfig, nats_url, redis_url, node, **over)

    listener = await Bus.connect(nats_url, name="rbac-listener")
    finished: asyncio.Queue[JobEvent] = asyncio.Queue()

    async def on_job(msg: Msg) -> None:
        await finished.put(decode(msg.data, JobEvent).data)

    await listener.nc.subscribe(f"alnair.jobs.*.{namespace}.>", cb=on_job)
    agent = await start_agent(settings(agent_config))
    aggregator = await start_aggregator(settings(aggregator_config, role="aggregator"))
    binder = asyncio.create_task(bind_pending_pods(kube, namespace, lambda _pod: node))
    redis = aioredis.from_url(redis_url)
    try:
        labels = (await kube.get(NODES, node))["metadata"]["labels"]
        assert labels[res.LABEL_GPU_COUNT] == "4"
        assert labels[res.LABEL_GPU_COMPUTE_CAPABILITY] == "6.0"

        model = {res.ANN_MODEL_NAME: "ResNet-18", res.ANN_BATCH_SIZE: "128"}
        job = await kube.create(
            JOBS,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "plain", "namespace": namespace, "annotations": model},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"annotations": {res.ANN_DURATION: "5s"}},
                        "spec": {
                            "nodeName": node,
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "t",
                                    "image": "example.invalid/t:1",
                                    "resources": {"limits": {res.GPU: "1"}},
                                }
                            ],
                        },
                    },
                },
            },
            namespace,
        )
        await kube.create(
            TRIALJOBS,
            {
                "apiVersion": "alnair.io/v1alpha1",
                "kind": "TrialJob",
                "metadata": {"name": "try", "namespace": namespace, "annotations": model},
                "spec": {
                    "durationSeconds": 5,
                    "candidates": [{"gpuModel": "P100", "gpuCount": 2}],
                    "template": {
                        "spec": {"containers": [{"name": "t", "image": "example.invalid/t:1"}]}
                    },
                },
            },
            namespace,
        )
        names: set[str] = set()
        async with asyncio.timeout(60):
            while names != {"plain", "try-p100-x2"}:
                names.add((await finished.get()).name)
        store = RecordStore(redis)
        plain = await store.get(namespace, "plain", job["metadata"]["uid"])
        assert plain is not None
        assert (plain.gpu_model, plain.gpu_count) == ("P100", 1)
        annotated = await kube.get(JOBS, "plain", namespace)
        assert "alnair.io/profile-gpu-util-max-pct" in annotated["metadata"]["annotations"]
        trial = await kube.get(TRIALJOBS, "try", namespace)
        status: dict[str, Any] = trial.get("status") or {}
        version = trial["metadata"]["resourceVersion"]
        async with asyncio.timeout(30):
            while status.get("phase") != "Succeeded":
                async for _kind, obj in kube.watch(TRIALJOBS, namespace, resource_version=version):
                    version = obj["metadata"]["resourceVersion"]
                    status = obj.get("status") or {}
                    if status.get("phase") == "Succeeded":
                        break
        assert status["trials"][0]["throughputStepsPerS"] > 0
    finally:
        binder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await binder
        await redis.aclose()
        await aggregator.stop()
        await agent.stop()
        await listener.close()
        with contextlib.suppress(Exception):
            await kube.delete(NODES, node)
