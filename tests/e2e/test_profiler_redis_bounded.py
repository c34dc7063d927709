"""The aggregator leaves no Redis key behind forever (issue 16): every working key of a pod
and its owner expires after the last sample, and sooner once the job's record is written;
only the execution records themselves (the product) stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.events import PodMetric
from alnair.common.kube import JOBS, KubeClient
from alnair.common.records import RECORDS_INDEX, record_key
from alnair.profiler.aggregator.aggregator import Aggregator
from alnair.profiler.aggregator.store import P
from alnair.profiler.metrics import ProfilerMetrics

pytestmark = pytest.mark.e2e

IDLE_TTL_S = 600
FINISHED_TTL_S = 60


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def ttls(redis: aioredis.Redis) -> dict[str, int]:
    """Every key but the records and their TTL in seconds (-1: kept forever)."""
    return {
        k.decode(): int(await redis.ttl(k))
        async for k in redis.scan_iter(f"{P}*")
        if not k.decode().startswith(("alnair:record:", RECORDS_INDEX))
    }


async def test_no_working_key_outlives_its_job(
    kube: KubeClient, namespace: str, nats_url: str, redis: aioredis.Redis
) -> None:
    job = await kube.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "annotations": {"alnair.io/model-name": "ResNet-50"}},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "example.com/train:1"}],
                    }
                },
            },
        },
        namespace,
    )
    uid = job["metadata"]["uid"]
    # the pod's owner is known already (as after the first lookup)
    await redis.hset(
        f"{P}pod:pod-1:meta",
        mapping={
            "namespace": namespace,
            "name": "train-0",
            "node": "n1",
            "owner_api_version": "batch/v1",
            "owner_kind": "Job",
            "owner_name": "train",
            "owner_uid": uid,
        },
    )
    await redis.sadd(f"{P}owner:{uid}:pods", "pod-1")
    await redis.set(f"{P}owner-by-name:{namespace}/train", uid)
    bus = await Bus.connect(nats_url, name="aggregator")
    aggregator = Aggregator(
        bus,
        kube,
        redis,
        ProfilerMetrics(CollectorRegistry()),
        live_annotation_interval_s=0,
        idle_ttl_s=IDLE_TTL_S,
        finished_ttl_s=FINISHED_TTL_S,
    )
    try:
        for tick in range(3):
            await aggregator.on_pod_metric(
                PodMetric(
                    node="n1",
                    namespace=namespace,
                    pod="train-0",
                    pod_uid="pod-1",
                    gpu_uuid="GPU-0",
                    gpu_index=0,
                    gpu_util_pct=90.0,
                    gpu_mem_used_mib=6000.0,
                    sm_util_pct=80.0,
                    cpu_util_cores=2.0,
                    mem_used_mib=3000.0,
                    ts=datetime.fromtimestamp(1000.0 + tick, UTC),
                )
            )
        running = await ttls(redis)
        assert f"{P}pod:pod-1:stats" in running and f"{P}owner:{uid}:gpus" in running
        assert all(0 < ttl <= IDLE_TTL_S for ttl in running.values()), running

        record = await aggregator.finalize(job, JOBS, "succeeded", 1100.0)
        assert record is not None
        after = await ttls(redis)
        assert after[f"{P}done:{uid}"] > FINISHED_TTL_S  # outlives the working keys
        working = {k: t for k, t in after.items() if not k.startswith(f"{P}done:")}
        assert working and all(0 < ttl <= FINISHED_TTL_S for ttl in working.values()), working
        # the record is the product: kept, and indexed
        key = record_key(namespace, "train", uid)
        assert await redis.ttl(key) == -1
        assert await redis.zscore(RECORDS_INDEX, key) is not None
        # a late sample after the end does not bring the keys back to the long expiry
        await aggregator.on_pod_metric(
            PodMetric(
                node="n1",
                namespace=namespace,
                pod="train-0",
                pod_uid="pod-1",
                gpu_uuid="GPU-0",
                gpu_index=0,
                gpu_util_pct=10.0,
                ts=datetime.fromtimestamp(1101.0, UTC),
            )
        )
        late = await ttls(redis)
        assert all(t <= FINISHED_TTL_S for k, t in late.items() if k in working), late
    finally:
        await bus.close()


async def test_a_job_that_ends_before_its_samples_arrive_is_still_recorded(
    kube: KubeClient, namespace: str, nats_url: str, redis: aioredis.Redis
) -> None:
    # As when NATS restarts: the agent buffers its samples, the Job completes meanwhile.
    job = await kube.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "late", "annotations": {"alnair.io/model-name": "VGG-16"}},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "example.com/train:1"}],
                    }
                },
            },
        },
        namespace,
    )
    uid = job["metadata"]["uid"]
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    done = {
        **job,
        "status": {
            "startTime": stamp,
            "completionTime": stamp,
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": stamp}],
        },
    }
    bus = await Bus.connect(nats_url, name="aggregator")
    aggregator = Aggregator(
        bus, kube, redis, ProfilerMetrics(CollectorRegistry()), live_annotation_interval_s=0
    )
    try:
        await aggregator.on_owner_event("MODIFIED", done, JOBS)
        key = record_key(namespace, "late", uid)
        assert not await redis.exists(key)  # nothing folded yet: no record, but not given up
        await redis.hset(
            f"{P}pod:pod-late:meta",
            mapping={
                "namespace": namespace,
                "name": "late-0",
                "node": "n1",
                "owner_api_version": "batch/v1",
                "owner_kind": "Job",
                "owner_name": "late",
                "owner_uid": uid,
            },
        )
        await redis.sadd(f"{P}owner:{uid}:pods", "pod-late")
        await aggregator.on_pod_metric(
            PodMetric(
                node="n1",
                namespace=namespace,
                pod="late-0",
                pod_uid="pod-late",
                gpu_uuid="GPU-0",
                gpu_index=0,
                gpu_util_pct=70.0,
                gpu_mem_used_mib=4000.0,
                ts=now,
            )
        )
        async with asyncio.timeout(20):
            while not await redis.exists(key):
                await asyncio.sleep(0.2)
        assert float(await redis.hget(key, "peak_gpu_mem_mib") or 0) == 4000.0
    finally:
        await aggregator.close()
        await bus.close()
