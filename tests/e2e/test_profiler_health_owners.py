"""End to end with the sim agent: node labels, GPU health changes, and a CRD owner.

- A KWOK node that only says its GPU model and count gets the other GPU feature labels.
- Failing a simulated GPU (node annotation) publishes GpuHealthChanged and rewrites the
  node's inventory in the KV bucket; bringing it back publishes the recovery.
- Pods of a StatefulSet owned by an ElasticJob are profiled into the ElasticJob, which is
  recorded when its status says it succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.asyncio as aioredis
from nats.aio.msg import Msg

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.events import (
    GpuHealthChanged,
    GpuInventory,
    JobEvent,
    JobPhase,
    PodMetric,
    decode,
)
from alnair.common.kube import ELASTICJOBS, NODES, STATEFULSETS, KubeClient
from alnair.dev.localstack import ControlPlane
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.app import start_agent, start_aggregator
from profiler_support import profiler_settings

pytestmark = pytest.mark.e2e


def bare_gpu_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", res.GPU: "2"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", res.LABEL_GPU_MODEL: "T4"},
            "annotations": {res.ANN_KWOK_NODE: "fake"},
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


async def next_matching(queue: asyncio.Queue[Any], predicate: Any, timeout_s: float = 30) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            item = await queue.get()
            if predicate(item):
                return item


async def test_labels_health_and_crd_owner(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str
) -> None:
    node = f"bare-{namespace}"
    await kube.create(NODES, bare_gpu_node(node))
    watcher = await Bus.connect(nats_url, name="e2e-health")
    health: asyncio.Queue[GpuHealthChanged] = asyncio.Queue()
    jobs: asyncio.Queue[JobEvent] = asyncio.Queue()
    metrics: asyncio.Queue[PodMetric] = asyncio.Queue()

    async def on_health(msg: Msg) -> None:
        await health.put(decode(msg.data, GpuHealthChanged).data)

    async def on_job(msg: Msg) -> None:
        await jobs.put(decode(msg.data, JobEvent).data)

    async def on_metric(msg: Msg) -> None:
        await metrics.put(decode(msg.data, PodMetric).data)

    await watcher.nc.subscribe(f"alnair.health.{node}.>", cb=on_health)
    await watcher.nc.subscribe(f"alnair.jobs.*.{namespace}.>", cb=on_job)
    await watcher.nc.subscribe(f"alnair.metrics.pod.{node}", cb=on_metric)
    agent = await start_agent(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, node)
    )
    aggregator = await start_aggregator(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, node, role="aggregator")
    )
    redis = aioredis.from_url(redis_url)
    try:
        # Labels, as GPU feature discovery would write them.
        labels = (await kube.get(NODES, node))["metadata"]["labels"]
        assert labels[res.LABEL_GPU_MEMORY_MIB] == "15360"
        assert labels[res.LABEL_GPU_COUNT] == "2"
        assert labels[res.LABEL_GPU_COMPUTE_CAPABILITY] == "7.5"

        kv = await watcher.kv(GpuInventory.BUCKET)

        async def inventory() -> GpuInventory:
            entry = await kv.get(node)
            assert entry.value is not None
            return GpuInventory.model_validate_json(entry.value)

        # GPU 1 fails, then comes back.
        await kube.patch(
            NODES, node, {"metadata": {"annotations": {"alnair.io/sim-unhealthy-gpus": "1"}}}
        )
        down = await next_matching(health, lambda e: not e.healthy)
        assert (down.node, down.gpu_index, down.xid) == (node, 1, 79)
        assert [g.healthy for g in (await inventory()).gpus] == [True, False]
        await kube.patch(
            NODES, node, {"metadata": {"annotations": {"alnair.io/sim-unhealthy-gpus": None}}}
        )
        up = await next_matching(health, lambda e: e.healthy)
        assert (up.gpu_index, up.gpu_uuid) == (1, down.gpu_uuid)
        assert [g.healthy for g in (await inventory()).gpus] == [True, True]

        # An ElasticJob owns a StatefulSet owns the worker pod.
        template = {
            "metadata": {
                "labels": {"app": "workers"},
                "annotations": {res.ANN_MODEL_NAME: "Transformer", res.ANN_BATCH_SIZE: "64"},
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "w",
                        "image": "example.invalid/w:1",
                        "resources": {"limits": {res.GPU: "1"}},
                    }
                ],
            },
        }
        ej = await kube.create(
            ELASTICJOBS,
            {
                "apiVersion": "alnair.io/v1alpha1",
                "kind": "ElasticJob",
                "metadata": {
                    "name": "elastic",
                    "namespace": namespace,
                    "annotations": {res.ANN_MODEL_NAME: "Transformer"},
                },
                "spec": {"minReplicas": 1, "maxReplicas": 2, "template": template},
            },
            namespace,
        )
        await kube.create(
            STATEFULSETS,
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {
                    "name": "elastic-workers",
                    "namespace": namespace,
                    "ownerReferences": [
                        {
                            "apiVersion": "alnair.io/v1alpha1",
                            "kind": "ElasticJob",
                            "name": "elastic",
                            "uid": ej["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "replicas": 1,
                    "podManagementPolicy": "Parallel",
                    "serviceName": "elastic",
                    "selector": {"matchLabels": {"app": "workers"}},
                    "template": template,
                },
            },
            namespace,
        )
        for _ in range(4):
            await next_matching(
                metrics, lambda m: m.namespace == namespace and m.gpu_uuid is not None, 60
            )
        assert aggregator.aggregator is not None
        assert (
            await aggregator.aggregator.owner_uid_by_name(namespace, "elastic")
            == ej["metadata"]["uid"]
        )

        await kube.patch(
            ELASTICJOBS, "elastic", {"status": {"phase": "Succeeded"}}, namespace, sub="status"
        )
        event = await next_matching(jobs, lambda e: e.name == "elastic")
        assert (event.phase, event.kind, event.uid) == (
            JobPhase.COMPLETED,
            "ElasticJob",
            ej["metadata"]["uid"],
        )
        record = await RecordStore(redis).get(namespace, "elastic", ej["metadata"]["uid"])
        assert record is not None
        assert (record.model_name, record.gpu_model, record.gpu_count) == ("Transformer", "T4", 1)
        assert record.peak_gpu_mem_mib > 0
        owner = await kube.get(ELASTICJOBS, "elastic", namespace)
        assert "alnair.io/profile-gpu-util-mean-pct" in owner["metadata"]["annotations"]
    finally:
        await redis.aclose()
        await aggregator.stop()
        await agent.stop()
        await watcher.close()
        with contextlib.suppress(Exception):
            await kube.delete(NODES, node)
