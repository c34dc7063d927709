"""Execution records and pod summaries against a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from alnair.common.events import PodMetric
from alnair.common.kube import KubeClient
from alnair.common.kubeconfig import KubeConfig
from alnair.common.records import RECORDS_INDEX, ExecutionRecord, record_key
from alnair.profiler.aggregator.aggregator import Aggregator
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.aggregator.store import P
from alnair.profiler.metrics import ProfilerMetrics

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


def make_record(uid: str = "u1", **over: object) -> ExecutionRecord:
    fields: dict[str, object] = {
        "namespace": "ml",
        "job_name": "train",
        "uid": uid,
        "model_name": "ResNet-50",
        "batch_size": "64",
        "data_size": "1281167",
        "epoch": "3",
        "gpu_model": "V100M32",
        "gpu_count": 2,
        "submit_ts": 1000.0,
        "start_ts": 1010.0,
        "end_ts": 1130.5,
        "peak_gpu_mem_mib": 6200.0,
        "mean_gpu_util_pct": 88.25,
        "outcome": "succeeded",
    }
    fields.update(over)
    return ExecutionRecord.model_validate(fields)


async def test_record_has_the_agreed_redis_shape(redis: aioredis.Redis) -> None:
    store = RecordStore(redis)
    assert await store.write_once(make_record(steps=1200, throughput_steps_per_s=10.0))
    key = record_key("ml", "train", "u1")
    assert key == "alnair:record:ml/train/u1"
    raw = {k.decode(): v.decode() for k, v in (await redis.hgetall(key)).items()}
    assert raw == {
        "model_name": "ResNet-50",
        "batch_size": "64",
        "data_size": "1281167",
        "epoch": "3",
        "gpu_model": "V100M32",
        "gpu_count": "2",
        "submit_ts": "1000",
        "start_ts": "1010",
        "end_ts": "1130.5",
        "duration_s": "120.5",
        "steps": "1200",
        "throughput_steps_per_s": "10",
        "peak_gpu_mem_mib": "6200",
        "mean_gpu_util_pct": "88.25",
        "outcome": "succeeded",
    }
    assert await redis.zscore(RECORDS_INDEX, key) == 1130.5
    back = await store.get("ml", "train", "u1")
    assert back is not None
    assert back.duration_s == pytest.approx(120.5)
    assert back == make_record(steps=1200, throughput_steps_per_s=10.0)


async def test_optional_fields_are_left_out(redis: aioredis.Redis) -> None:
    store = RecordStore(redis)
    await store.write_once(make_record())
    fields = await redis.hkeys(record_key("ml", "train", "u1"))
    assert b"steps" not in fields
    assert b"throughput_steps_per_s" not in fields


async def test_many_concurrent_writers_write_one_record(
    redis: aioredis.Redis, redis_url: str
) -> None:
    # Five aggregator replicas (own connections), each trying four times.
    clients = [aioredis.from_url(redis_url) for _ in range(5)]
    stores = [RecordStore(c) for c in clients]
    try:
        attempts = [
            s.write_once(make_record(mean_gpu_util_pct=float(i)))
            for i, s in enumerate(stores)
            for _ in range(4)
        ]
        results = await asyncio.gather(*attempts)
    finally:
        for c in clients:
            await c.aclose()
    assert sum(results) == 1
    assert await redis.zcard(RECORDS_INDEX) == 1
    # The first write stands; later attempts did not overwrite a single field.
    winner = results.index(True)
    got = await RecordStore(redis).get("ml", "train", "u1")
    assert got is not None
    assert got.mean_gpu_util_pct == float(winner // 4)


async def test_query_filters_by_model_and_gpu_newest_first(redis: aioredis.Redis) -> None:
    store = RecordStore(redis)
    await store.write_once(make_record("a", end_ts=2000.0))
    await store.write_once(make_record("b", end_ts=3000.0, gpu_model="K80"))
    await store.write_once(make_record("c", end_ts=4000.0, model_name="LM"))
    assert [r.uid for r in await store.query()] == ["c", "b", "a"]
    assert [r.uid for r in await store.query(model="ResNet-50")] == ["b", "a"]
    assert [r.uid for r in await store.query(model="ResNet-50", gpu="V100M32")] == ["a"]
    assert [r.uid for r in await store.find("ml", "train")] == ["a", "b", "c"]


def metric(ts: float, gpu: int | None, util: float, mem: float, cpu: float) -> PodMetric:
    return PodMetric(
        node="n1",
        namespace="ml",
        pod="train-0",
        pod_uid="pod-1",
        gpu_uuid=None if gpu is None else f"GPU-{gpu}",
        gpu_index=gpu,
        gpu_util_pct=util,
        gpu_mem_used_mib=mem,
        sm_util_pct=util,
        cpu_util_cores=cpu,
        mem_used_mib=1000.0 + cpu,
        ts=datetime.fromtimestamp(ts, UTC),
    )


async def test_folding_counts_cpu_once_per_tick_and_survives_a_new_aggregator(
    redis: aioredis.Redis,
) -> None:
    # The owner is already known (as after a restart), so no API server is needed.
    await redis.hset(
        f"{P}pod:pod-1:meta",
        mapping={
            "namespace": "ml",
            "name": "train-0",
            "node": "n1",
            "owner_api_version": "batch/v1",
            "owner_kind": "Job",
            "owner_name": "train",
            "owner_uid": "job-1",
        },
    )
    await redis.sadd(f"{P}owner:job-1:pods", "pod-1")
    nowhere = KubeClient(KubeConfig(server="https://127.0.0.1:1", insecure=True))

    def new_aggregator() -> Aggregator:
        return Aggregator(None, nowhere, redis, ProfilerMetrics())  # type: ignore[arg-type]

    first = new_aggregator()
    # Tick 1: a pod on two GPUs reports CPU on both events.
    await first.on_pod_metric(metric(10.0, 0, 80.0, 5000.0, 2.0))
    await first.on_pod_metric(metric(10.0, 1, 60.0, 7000.0, 2.0))
    second = new_aggregator()  # a restarted aggregator carries on from Redis
    await second.on_pod_metric(metric(11.0, 0, 100.0, 5500.0, 4.0))
    await second.on_pod_metric(metric(11.0, 1, 40.0, 6500.0, 4.0))
    # A late duplicate of tick 1 must not count CPU again.
    await second.on_pod_metric(metric(10.0, 0, 80.0, 5000.0, 2.0))
    profile, pods = await second.owner_profile("job-1")
    assert profile.get("gpu_util_pct").count == 5
    assert profile.get("gpu_util_pct").max == 100.0
    assert profile.get("gpu_mem_used_mib").max == 7000.0
    cpu = profile.get("cpu_util_cores")
    assert (cpu.count, cpu.max, cpu.mean) == (2, 4.0, pytest.approx(3.0))
    assert {g.decode() for g in await redis.smembers(f"{P}owner:job-1:gpus")} == {
        "n1/GPU-0",
        "n1/GPU-1",
    }
    assert float(pods[0]["first_ts"]) == 10.0
    assert float(pods[0]["last_ts"]) == 11.0
    assert second.latest[("ml", "train-0")]["GPU-1"].gpu_util_pct == 40.0
    await nowhere.close()
