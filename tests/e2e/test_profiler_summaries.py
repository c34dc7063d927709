"""A pod that runs while NATS is down still gets its execution record (issue 16).

Samples travel on core NATS, so a run inside a bus outage leaves none; the agent's pod summary
(JetStream, spooled on disk) carries the run instead. Real nats-server, redis-server and
control plane with a KWOK GPU node; the sim agent and the aggregator as in `make up`:
- a Job that starts and ends while nats-server is stopped gets its record (and the owner its
  annotations) once the server is back, and the same summary folded again (a replay with the
  same id, or a copy with a new id) changes neither the stats nor the number of records;
- an agent SIGKILLed while its spool holds the summary publishes it when it starts again;
- a GPU Job no sample of which ever reached the aggregator (no agent ran while it did) is
  recorded without usage `late_samples_s` after its end, and its completion is announced.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.events import Envelope, GpuInventory, JobEvent, JobPhase, PodSummary
from alnair.common.kube import JOBS, KubeClient
from alnair.common.records import RECORDS_INDEX
from alnair.dev.localstack import ControlPlane, NatsServer
from alnair.dev.waiting import consumed, wait_for
from alnair.profiler.agent.summaries import SPOOL_FILE
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.aggregator.store import P
from alnair.profiler.app import Running, start_agent, start_aggregator
from alnair.profiler.settings import ProfilerSettings
from profiler_support import profiler_settings

pytestmark = pytest.mark.e2e

RUN_S = 6


def job_manifest(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": {res.ANN_MODEL_NAME: "ResNet-50"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        res.ANN_DURATION: res.duration_value(RUN_S),
                        res.ANN_GPU_INDICES: "0,1",
                    }
                },
                "spec": {
                    "nodeName": node,  # no scheduler runs here
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.invalid/train:1",
                            "resources": {"limits": {res.GPU: "2"}, "requests": {"cpu": "2"}},
                        }
                    ],
                },
            },
        },
    }


async def job_complete(kube: KubeClient, name: str, namespace: str) -> bool:
    job = await kube.get(JOBS, name, namespace)
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def spooled(state_dir: Path) -> dict[str, list[dict[str, Any]]]:
    path = state_dir / SPOOL_FILE
    if not path.is_file():
        return {"pending": [], "running": []}
    doc: dict[str, list[dict[str, Any]]] = json.loads(path.read_text())
    return doc


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_run_inside_a_nats_outage_is_recorded_once(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_server: NatsServer,
    redis_url: str,
    redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=f"sum-{namespace}"
    )
    kubeconfig, nats_url = control_plane.kubeconfig, nats_server.url
    state = tmp_path / "agent-state"
    agent = await start_agent(
        profiler_settings(kubeconfig, nats_url, redis_url, node, state_dir=str(state))
    )
    aggregator: Running = await start_aggregator(
        profiler_settings(kubeconfig, nats_url, redis_url, node, role="aggregator")
    )
    assert agent.agent is not None and aggregator.aggregator is not None
    try:
        nats_server.stop()
        job = await kube.create(JOBS, job_manifest("dark", node), namespace)
        uid = job["metadata"]["uid"]
        await wait_for(
            lambda: job_complete(kube, "dark", namespace), 90, 0.5, what="the job to finish"
        )

        # The agent saw the run, sent no sample, and holds the summary on disk.
        async def pending() -> list[dict[str, Any]]:
            return [s for s in spooled(state)["pending"] if s["namespace"] == namespace]

        (held,) = await wait_for(pending, 20, 0.5, what="the spooled summary")
        assert held["owner_kind"] == "Job" and held["owner_uid"] == uid
        assert held["gpu_model"] == "V100M32" and len(held["gpus"]) == 2
        assert held["ticks"] >= RUN_S - 2
        assert held["gpu_mem_used_mib"]["count"] == 2 * held["ticks"]
        assert not await redis.exists(f"{P}owner:{uid}:pods")  # nothing reached the aggregator
        assert await RecordStore(redis).get(namespace, "dark", uid) is None

        nats_server.start()  # same port and store

        async def recorded() -> Any:
            return await RecordStore(redis).get(namespace, "dark", uid)

        record = await wait_for(recorded, 60, 0.5, what="the record")
        assert record.gpu_model == "V100M32" and record.gpu_count == 2
        assert record.peak_gpu_mem_mib == pytest.approx(held["gpu_mem_used_mib"]["max"], abs=0.01)
        mean = held["gpu_util_pct"]["total"] / held["gpu_util_pct"]["count"]
        assert record.mean_gpu_util_pct == pytest.approx(mean, abs=0.01)
        assert RUN_S - 2 <= record.duration_s <= RUN_S + 10
        annotated = await kube.get(JOBS, "dark", namespace)
        ann = annotated["metadata"]["annotations"]
        assert float(ann["alnair.io/profile-gpu-mem-max-mib"]) == pytest.approx(
            held["gpu_mem_used_mib"]["max"], abs=0.01
        )
        await wait_for(lambda: _spool_empty(state), 20, 0.5, what="the spool to empty")

        # Duplicates: the same summary again (same id: dropped by the stream or the consumer)
        # and a copy under a new id (folded again): nothing changes.
        pod_uid = held["pod_uid"]
        stats_before = await redis.hgetall(f"{P}pod:{pod_uid}:stats")
        folded_before = _folded(aggregator)
        summary = PodSummary.model_validate(held)
        async with _bus(nats_url) as bus:
            await bus.publish(summary, source="test", event_id=summary.event_id())
            await bus.publish(summary, source="test", event_id="a-new-id")

        async def folded_again() -> bool:
            return _folded(aggregator) >= folded_before + 1

        await wait_for(folded_again, 20, 0.5, what="the copy to be folded")
        async with _bus(nats_url) as bus:  # both copies met the aggregator's consumer
            await consumed(bus, PodSummary, f"{AGGREGATOR_DURABLE}-summaries")
        assert _folded(aggregator) == folded_before + 1
        assert await redis.hgetall(f"{P}pod:{pod_uid}:stats") == stats_before
        keys = [k.decode() for k in await redis.zrange(RECORDS_INDEX, 0, -1)]
        assert keys.count(record.key) == 1
        assert [k async for k in redis.scan_iter(f"alnair:record:{namespace}/*")] == [
            record.key.encode()
        ]
    finally:
        await aggregator.stop()
        await agent.stop()


AGGREGATOR_DURABLE = ProfilerSettings.model_fields["durable"].default


def _folded(running: Running) -> float:
    value = running.metrics.registry.get_sample_value("alnair_profiler_pod_summaries_folded_total")
    return value or 0.0


async def _spool_empty(state: Path) -> bool:
    return not spooled(state)["pending"]


class _bus:
    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> Bus:
        self.bus = await Bus.connect(self.url, name="test-publisher")
        return self.bus

    async def __aexit__(self, *_exc: object) -> None:
        await self.bus.close()


def _start_agent_process(
    kubeconfig: Path, nats_url: str, redis_url: str, node: str, state: Path, log: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ALNAIR_NATS_URL": nats_url,
        "ALNAIR_REDIS_URL": redis_url,
        "ALNAIR_KUBECONFIG": str(kubeconfig),
        "ALNAIR_LOG_JSON": "false",
        "ALNAIR_PROFILER_HTTP_PORT": "0",
        "ALNAIR_PROFILER_SIM_NODE_SELECTOR": f"kubernetes.io/hostname={node}",
        "ALNAIR_PROFILER_STATE_DIR": str(state),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "alnair.profiler", "agent", "--backend", "sim"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def test_agent_killed_holding_summaries_publishes_them_when_back(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_server: NatsServer,
    redis_url: str,
    redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=f"kill-{namespace}"
    )
    kubeconfig, nats_url = control_plane.kubeconfig, nats_server.url
    state, log = tmp_path / "agent-state", tmp_path / "agent.log"
    aggregator = await start_aggregator(
        profiler_settings(kubeconfig, nats_url, redis_url, node, role="aggregator")
    )
    proc = _start_agent_process(kubeconfig, nats_url, redis_url, node, state, log)
    try:
        async with _bus(nats_url) as watcher:
            inventory = await watcher.kv(GpuInventory.BUCKET)

            async def agent_up() -> bool:
                try:
                    return (await inventory.get(node)).value is not None
                except Exception:
                    return False

            await wait_for(agent_up, 60, 0.5, what="the agent's inventory")

        nats_server.stop()
        job = await kube.create(JOBS, job_manifest("killed", node), namespace)
        uid = job["metadata"]["uid"]
        await wait_for(
            lambda: job_complete(kube, "killed", namespace), 90, 0.5, what="the job to finish"
        )

        async def pending() -> list[dict[str, Any]]:
            return [s for s in spooled(state)["pending"] if s["owner_uid"] == uid]

        await wait_for(pending, 20, 0.5, what="the spooled summary")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

        nats_server.start()
        proc = _start_agent_process(kubeconfig, nats_url, redis_url, node, state, log)

        async def recorded() -> Any:
            return await RecordStore(redis).get(namespace, "killed", uid)

        record = await wait_for(recorded, 90, 0.5, what="the record")
        assert record.gpu_model == "V100M32" and record.gpu_count == 2
        assert (record.peak_gpu_mem_mib or 0) > 0 and (record.mean_gpu_util_pct or 0) > 0
        assert "pod summaries taken from the spool" in log.read_text()
        await wait_for(lambda: _spool_empty(state), 30, 0.5, what="the spool to empty")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        await aggregator.stop()


async def test_a_job_no_sample_reached_is_recorded_without_usage_and_announced(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_server: NatsServer,
    redis_url: str,
    redis: aioredis.Redis,
) -> None:
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=f"dark-{namespace}"
    )
    late_s = 3.0
    aggregator = await start_aggregator(
        profiler_settings(
            control_plane.kubeconfig, nats_server.url, redis_url, node,
            role="aggregator", late_samples_s=late_s,
        )
    )  # fmt: skip
    announced: list[JobEvent] = []
    try:
        async with _bus(nats_server.url) as bus:

            async def heard(event: JobEvent, _env: Envelope[JobEvent]) -> None:
                if event.namespace == namespace:
                    announced.append(event)

            sub = await bus.subscribe(JobEvent, heard, durable=f"test-{namespace}")
            try:
                manifest = job_manifest("unseen", node)
                manifest["spec"]["template"]["spec"]["nodeSelector"] = {
                    res.LABEL_GPU_MODEL: "V100M32"
                }
                job = await kube.create(JOBS, manifest, namespace)
                uid = job["metadata"]["uid"]
                await wait_for(
                    lambda: job_complete(kube, "unseen", namespace),
                    90,
                    0.5,
                    what="the job to finish",
                )
                ended = time.time()

                async def recorded() -> Any:
                    return await RecordStore(redis).get(namespace, "unseen", uid)

                record = await wait_for(recorded, 60, 0.5, what="the record")
                # Not before its samples had time to arrive.
                assert time.time() - ended >= late_s - 1.0
                assert record.peak_gpu_mem_mib is None and record.mean_gpu_util_pct is None
                assert record.gpu_count == 2 and record.gpu_model == "V100M32"
                assert record.outcome == "succeeded"
                assert RUN_S - 2 <= record.duration_s <= RUN_S + 10
                fields = await redis.hgetall(record.key)
                assert b"peak_gpu_mem_mib" not in fields and b"mean_gpu_util_pct" not in fields

                async def completed() -> list[JobEvent]:
                    return [e for e in announced if e.phase == JobPhase.COMPLETED]

                (event,) = await wait_for(completed, 20, 0.5, what="the completion event")
                assert event.uid == uid and event.detail["record"] == record.key
                assert event.detail["peak_gpu_mem_mib"] is None
                assert await redis.exists(f"{P}done:{uid}")
                assert [k async for k in redis.scan_iter(f"alnair:record:{namespace}/*")] == [
                    record.key.encode()
                ]
                # (Other tests' finished Jobs, replayed by this aggregator's relist into a
                # fresh Redis, may be recorded the same way: at least this one is counted.)
                unprofiled = aggregator.metrics.registry.get_sample_value(
                    "alnair_profiler_records_unprofiled_total"
                )
                assert unprofiled is not None and unprofiled >= 1.0
            finally:
                await sub.stop()
    finally:
        await aggregator.stop()


async def test_a_completion_inside_a_60s_bus_outage_is_announced_when_the_bus_is_back(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_server: NatsServer,
    redis_url: str,
    redis: aioredis.Redis,
) -> None:
    """Longer than the bus client's own publish retries (30 s): the aggregator keeps the
    completion (its record, without the done marker) and publishes it once NATS is back."""
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=f"out-{namespace}"
    )
    aggregator = await start_aggregator(
        profiler_settings(
            control_plane.kubeconfig, nats_server.url, redis_url, node,
            role="aggregator", late_samples_s=2.0,
        )
    )  # fmt: skip
    announced: list[JobEvent] = []
    try:
        async with _bus(nats_server.url) as bus:

            async def heard(event: JobEvent, _env: Envelope[JobEvent]) -> None:
                if event.namespace == namespace and event.phase == JobPhase.COMPLETED:
                    announced.append(event)

            sub = await bus.subscribe(JobEvent, heard, durable=f"outage-{namespace}")
            nats_server.stop()
            down_at = time.monotonic()
            try:
                job = await kube.create(JOBS, job_manifest("during", node), namespace)
                uid = job["metadata"]["uid"]
                await wait_for(
                    lambda: job_complete(kube, "during", namespace),
                    90,
                    0.5,
                    what="the job to finish",
                )

                async def recorded() -> Any:
                    return await RecordStore(redis).get(namespace, "during", uid)

                await wait_for(recorded, 30, 0.5, what="the record")
                assert not await redis.exists(f"{P}done:{uid}")  # not announced yet
                await asyncio.sleep(max(0.0, 60.0 - (time.monotonic() - down_at)))
            finally:
                nats_server.start()  # same port and store
            (event,) = await wait_for(
                lambda: _async(announced), 90, 0.5, what="the completion event"
            )
            assert event.uid == uid
            await wait_for(lambda: redis.exists(f"{P}done:{uid}"), 10, 0.5, what="the done marker")
            await sub.stop()
    finally:
        await aggregator.stop()


async def _async(items: list[Any]) -> list[Any]:
    return list(items)
