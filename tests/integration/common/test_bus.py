"""The bus against a real nats-server with JetStream: durability, dead letters, reconnects."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from alnair.common.bus import Bus, RemoteError, not_ready
from alnair.common.errors import PermanentError, TemporaryError
from alnair.common.events import (
    DeadLetter,
    Envelope,
    GpuHealthChanged,
    JobEvent,
    JobPhase,
    PodMetric,
    encode,
    wrap,
)
from alnair.common.tasks import within
from alnair.dev.localstack import NatsServer
from alnair.dev.waiting import consumed, wait_for

pytestmark = pytest.mark.integration


def job(i: int, phase: JobPhase = JobPhase.COMPLETED) -> JobEvent:
    return JobEvent(phase=phase, namespace="team-a", kind="Job", name=f"job-{i}", uid=f"uid-{i}")


async def dead_letters(bus: Bus, durable: str, n: int, timeout_s: float = 10) -> list[DeadLetter]:
    psub = await bus.js.pull_subscribe(f"alnair.dlq.{durable}", durable=f"dlq-reader-{durable}")
    got: list[DeadLetter] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            for msg in await psub.fetch(n - len(got), timeout=timeout_s):
                got.append(DeadLetter.model_validate_json(msg.data))
                await msg.ack()
    return got


async def _gone(bus: Bus, durable: str) -> bool:
    return durable not in await _consumers(bus, JobEvent.STREAM or "")


async def test_durable_consumer_restart_gets_every_event_exactly_once(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")
    handled: Counter[str] = Counter()
    seen_all = asyncio.Event()

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        handled[ev.name] += 1
        if len(handled) == 30:
            seen_all.set()

    sub = await bus.subscribe(JobEvent, handler, durable="predictor")
    for i in range(10):
        await bus.publish(job(i), source="test")
    async with asyncio.timeout(10):
        while len(handled) < 10:
            await asyncio.sleep(0.02)
    await sub.stop()

    # Published while the consumer is down: must arrive after the restart.
    for i in range(10, 30):
        await bus.publish(job(i), source="test")
    # A publisher retry of an already-stored event (same id) must not be handled twice.
    dup = job(5)
    env = await bus.publish(dup, source="test", event_id="fixed-id")
    await bus.publish(dup, source="test", event_id=env.id)

    bus2 = await Bus.connect(nats_url, name="test-restarted")
    await bus2.subscribe(JobEvent, handler, durable="predictor")
    await within(seen_all.wait(), 10)
    await consumed(bus2, JobEvent, "predictor")  # a duplicate would have been handled now
    assert set(handled) == {f"job-{i}" for i in range(30)}
    assert handled["job-5"] == 2  # the original and the one fixed-id copy, never three
    assert all(count == 1 for name, count in handled.items() if name != "job-5")
    await bus2.close()
    await bus.close()


async def test_redelivered_event_id_is_not_handled_again(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")
    calls: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        calls.append(env.id)

    await bus.subscribe(JobEvent, handler, durable="dedupe")
    env = await bus.publish(job(1), source="test")
    # The same event id published again after the duplicate window would normally be handled
    # twice; the consumer's handled-id record stops that, even across a new connection.
    await bus.js.publish(env.subject or "", env.model_dump_json().encode())
    await consumed(bus, JobEvent, "dedupe")
    assert calls == [env.id]
    await bus.close()


async def test_malformed_and_invalid_messages_go_to_dead_letter(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")
    handled: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        if ev.name == "poison":
            raise PermanentError("poison job", name=ev.name)
        handled.append(ev.name)

    await bus.subscribe(JobEvent, handler, durable="dlq-test")
    subject = "alnair.jobs.default.team-a.Job"
    await bus.js.publish(subject, b"{not json")
    bad = json.loads((await bus.publish(job(1), source="t")).model_dump_json())
    bad["data"]["phase"] = "exploded"
    await bus.js.publish(subject, json.dumps(bad).encode())
    poison = JobEvent(phase=JobPhase.FAILED, namespace="team-a", kind="Job", name="poison", uid="p")
    await bus.publish(poison, source="t")

    letters = await dead_letters(bus, "dlq-test", 3)
    reasons = sorted(dl.reason for dl in letters)
    assert any("not JSON" in r for r in reasons)
    assert any("data.phase" in r for r in reasons)
    assert any('"exploded"' in dl.payload for dl in letters)  # the original bytes are kept
    assert any("poison job" in r for r in reasons)
    assert all(dl.consumer == "dlq-test" and dl.subject == subject for dl in letters)
    assert handled == ["job-1"]
    await bus.close()


async def test_temporary_error_is_retried_after_its_delay(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")
    attempts: list[float] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        attempts.append(loop.time())
        if len(attempts) < 3:
            raise TemporaryError("redis down", delay_s=0.3)
        done.set()

    await bus.subscribe(JobEvent, handler, durable="retry")
    await bus.publish(job(1), source="t")
    await within(done.wait(), 10)
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.25
    await bus.close()


async def test_server_restart_under_connected_client(nats_server: NatsServer) -> None:
    bus = await Bus.connect(nats_server.url, name="test")
    got: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        got.append(ev.name)

    await bus.subscribe(JobEvent, handler, durable="restart")
    await bus.publish(job(0), source="t")
    nats_server.restart()
    # Publishing resumes on the same connection once the client has reconnected by itself.
    await bus.publish(job(1), source="t", publish_timeout_s=20)
    async with asyncio.timeout(20):
        while sorted(got) != ["job-0", "job-1"]:
            await asyncio.sleep(0.05)
    assert bus.nc.is_connected
    await bus.close()


async def test_core_metrics_are_delivered_to_one_member_of_a_queue_group(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")
    a: list[str] = []
    b: list[str] = []

    async def ha(ev: PodMetric, env: Envelope[PodMetric]) -> None:
        a.append(ev.pod)

    async def hb(ev: PodMetric, env: Envelope[PodMetric]) -> None:
        b.append(ev.pod)

    await bus.subscribe(PodMetric, ha, durable="aggregator")
    await bus.subscribe(PodMetric, hb, durable="aggregator")
    for i in range(20):
        await bus.publish(
            PodMetric(node="n1", namespace="a", pod=f"p{i}", pod_uid=str(i)), source="t"
        )
    async with asyncio.timeout(5):
        while len(a) + len(b) < 20:
            await asyncio.sleep(0.02)
    assert sorted(a + b, key=lambda p: int(p[1:])) == [f"p{i}" for i in range(20)]
    # At-most-once samples leave nothing in the handled-id bucket (one entry per sample,
    # kept a week, was the growth the soak found).
    handled = await bus.js.stream_info("KV_alnair-handled")
    assert handled.state.messages == 0
    await bus.close()


class Ask(BaseModel):
    x: int


class Answer(BaseModel):
    doubled: int


async def test_request_reply_and_bad_request(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="test")

    async def double(req: Ask) -> Answer:
        return Answer(doubled=req.x * 2)

    await bus.serve("alnair.test.double", Ask, double)
    assert (await bus.request("alnair.test.double", Ask(x=21), Answer)).doubled == 42

    class Wrong(BaseModel):
        x: str

    with pytest.raises(RemoteError, match="x"):
        await bus.request("alnair.test.double", Wrong(x="nope"), Answer)
    await bus.close()


async def _consumers(bus: Bus, stream: str) -> set[str]:
    return {c.name for c in await bus.js.consumers_info(stream)}


async def test_replica_durables_are_reused_across_restarts_and_dropped_when_the_replica_is_gone(
    nats_url: str,
) -> None:
    async def ignore(_e: JobEvent, _env: Envelope[JobEvent]) -> None:
        return None

    bus = await Bus.connect(nats_url, name="replicas")
    try:
        before = await _consumers(bus, JobEvent.STREAM or "")
        # Five restarts of a replica named as its pod is: one durable, not five.
        for _ in range(5):
            sub = await bus.subscribe(JobEvent, ignore, durable="sched-jobs-pod-a", inactive_s=2)
            await sub.stop()
        assert await _consumers(bus, JobEvent.STREAM or "") - before == {"sched-jobs-pod-a"}
        info = await bus.js.consumer_info(JobEvent.STREAM or "", "sched-jobs-pod-a")
        assert info.config.inactive_threshold == pytest.approx(2.0)
        # A shared durable (no inactive_s), stopped at the same time, stays for the service's
        # next start.
        sub = await bus.subscribe(JobEvent, ignore, durable="dispatcher-shared")
        await sub.stop()
        # Its pod replaced for good: the server deletes the per-replica durable once it sat
        # idle that long, and only that one.
        await wait_for(
            lambda: _gone(bus, "sched-jobs-pod-a"), 20, 0.5, what="the idle durable deleted"
        )
        assert "dispatcher-shared" in await _consumers(bus, JobEvent.STREAM or "")
    finally:
        await bus.close()


async def test_garbage_of_twice_the_byte_limit_leaves_the_jobs_stream_writable_and_bounded(
    nats_url: str,
) -> None:
    limit = 64 * 1024
    bus = await Bus.connect(nats_url, name="flood", ensure_streams=False)
    try:
        await bus.ensure_streams(max_bytes=limit, dlq_max_bytes=limit)
        garbage = b"x" * 4000
        for i in range(2 * limit // len(garbage) + 1):
            await bus.js.publish(
                "alnair.jobs.flood.garbage", garbage, headers={"Nats-Msg-Id": f"g{i}"}
            )
            await bus.js.publish("alnair.dlq.flood", garbage, headers={"Nats-Msg-Id": f"d{i}"})
        for stream in (JobEvent.STREAM or "", "DLQ"):
            state = (await bus.js.stream_info(stream)).state
            assert state.bytes <= limit, (stream, state.bytes)
        # Still writable: a real event goes in and is there.
        await bus.publish(job(1), source="test")
        info = await bus.js.stream_info(JobEvent.STREAM or "")
        last = await bus.js.get_last_msg(JobEvent.STREAM or "", job(1).subject())
        assert info.state.bytes <= limit and b"uid-1" in last.data
    finally:
        await bus.close()


async def test_a_thousand_health_flips_of_one_gpu_always_end_as_the_last_one_said(
    nats_url: str,
) -> None:
    """The scheduler's health subscription applies one GPU's flips in order (issue 26)."""
    from datetime import timedelta

    from alnair.common.events import GpuHealthChanged, encode, wrap
    from alnair.scheduler import handlers

    class Recorder:
        def __init__(self) -> None:
            self.healthy: dict[tuple[str, int], bool] = {}
            self.applied = 0

        def on_gpu_health(self, node: str, gpu: int, healthy: bool) -> None:
            self.healthy[(node, gpu)] = healthy
            self.applied += 1

        def on_gpu_util(self, *_a: object) -> None:
            return None

        def on_job_finished(self) -> None:
            return None

    bus = await Bus.connect(nats_url, name="health-order")
    recorder = Recorder()
    try:
        subs = await handlers.subscribe(bus, recorder, "order-test")  # type: ignore[arg-type]
        for i in range(1000):
            for healthy in (False, True):
                await bus.publish(
                    GpuHealthChanged(node="n1", gpu_index=0, gpu_uuid="GPU-0", healthy=healthy,
                                     xid=None if healthy else 79),
                    source="test", event_id=f"flip-{i}-{healthy}",
                )  # fmt: skip
        async with asyncio.timeout(60):
            while recorder.applied < 2000:
                await asyncio.sleep(0.1)
        assert recorder.healthy[("n1", 0)] is True
        # An "unhealthy" the agent observed before the last flip reaches the bus late (spooled
        # through an outage): it is not applied over the newer "healthy".
        late = wrap(
            GpuHealthChanged(node="n1", gpu_index=0, gpu_uuid="GPU-0", healthy=False, xid=79),
            source="test", event_id="late-one",
        )  # fmt: skip
        late = late.model_copy(update={"time": late.time - timedelta(minutes=5)})
        await bus.js.publish(late.subject or "", encode(late), headers={"Nats-Msg-Id": late.id})
        await consumed(bus, GpuHealthChanged, subs[0].name)  # the health durable
        assert recorder.healthy[("n1", 0)] is True and recorder.applied == 2000
        for sub in subs:
            await sub.stop()
    finally:
        await bus.close()


async def test_a_message_on_a_subject_its_payload_does_not_name_is_dead_lettered_and_counted(
    nats_url: str,
) -> None:
    """Node A's agent, allowed the health and metric subjects, sends node A's payload on node
    B's subject: every consumer dead-letters it as `wrong_subject` and counts it; node B's own
    event, on its own subject, is still handled."""
    bus = await Bus.connect(nats_url, name="test")
    registry = CollectorRegistry()
    bus.export_metrics(registry)
    health: list[str] = []
    samples: list[str] = []

    async def on_health(ev: GpuHealthChanged, env: Envelope[GpuHealthChanged]) -> None:
        health.append(ev.node)

    async def on_metric(ev: PodMetric, env: Envelope[PodMetric]) -> None:
        samples.append(ev.node)

    await bus.subscribe(GpuHealthChanged, on_health, durable="health-subject")
    await bus.subscribe(PodMetric, on_metric, durable="metric-subject")
    forged = GpuHealthChanged(node="node-a", gpu_index=0, gpu_uuid="GPU-a0", healthy=False)
    await bus.js.publish("alnair.health.node-b.0", encode(wrap(forged, source="agent-a")))
    sample = PodMetric(node="node-a", namespace="ns", pod="p", pod_uid="u")
    await bus.publish_raw("alnair.metrics.pod.node-b", encode(wrap(sample, source="agent-a")))
    real = GpuHealthChanged(node="node-b", gpu_index=0, gpu_uuid="GPU-b0", healthy=False)
    await bus.publish(real, source="agent-b")
    await bus.publish(PodMetric(node="node-b", namespace="ns", pod="p", pod_uid="u"), source="b")

    (letter,) = await dead_letters(bus, "health-subject", 1)
    assert letter.subject == "alnair.health.node-b.0"
    assert "belongs on 'alnair.health.node-a.0'" in letter.reason, letter.reason
    (metric_letter,) = await dead_letters(bus, "metric-subject", 1)
    assert metric_letter.subject == "alnair.metrics.pod.node-b"
    async with asyncio.timeout(10):
        while not (health and samples):
            await asyncio.sleep(0.02)
    assert health == ["node-b"] and samples == ["node-b"]
    for consumer in ("health-subject", "metric-subject"):
        count = registry.get_sample_value(
            "alnair_bus_dead_letters_total", {"consumer": consumer, "cause": "wrong_subject"}
        )
        assert count == 1, consumer
    await bus.close()


async def test_a_wiped_store_is_made_again_and_consumers_resume_not_ready_until_then(
    nats_server: NatsServer,
) -> None:
    """The server comes back without its store (a lost volume): every stream, bucket and
    durable consumer is made again on the reconnect (no timer), `ready` is false until then,
    and events published afterwards reach the same consumer."""
    bus = await Bus.connect(nats_server.url, name="test")
    got: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        got.append(ev.name)

    await bus.subscribe(JobEvent, handler, durable="wiped")
    await bus.publish(job(0), source="t")
    async with asyncio.timeout(10):
        while got != ["job-0"]:
            await asyncio.sleep(0.05)
    assert bus.ready
    nats_server.stop()
    async with asyncio.timeout(10):
        while bus.ready:
            await asyncio.sleep(0.02)
    shutil.rmtree(nats_server.store)
    nats_server.start()
    async with asyncio.timeout(30):
        while not bus.ready:
            await asyncio.sleep(0.05)
    assert bus.recoveries == 1
    names = {s.config.name for s in await bus.js.streams_info()}
    assert {"JOBS", "HEALTH", "DLQ", "KV_alnair-handled", "KV_gpu-inventory"} <= names
    assert "wiped" in {c.name for c in await bus.js.consumers_info("JOBS")}
    await bus.publish(job(1), source="t", publish_timeout_s=20)
    async with asyncio.timeout(20):
        while got != ["job-0", "job-1"]:
            await asyncio.sleep(0.05)
    await bus.close()


async def test_a_stream_deleted_under_a_running_server_is_made_again(nats_url: str) -> None:
    """No reconnect tells anyone when a stream (and its consumers) is deleted while the server
    stays up: the pull loop's failing fetches ask, the consumer is found gone, and everything
    is made again; the next event (its first publish meets no stream and makes it again too)
    reaches the same consumer. Against the code before, the fetches failed for ever and the
    event never arrived."""
    bus = await Bus.connect(nats_url, name="test")
    admin = await Bus.connect(nats_url, name="admin")
    got: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        got.append(ev.name)

    await bus.subscribe(JobEvent, handler, durable="deleted")
    await bus.publish(job(0), source="t")
    async with asyncio.timeout(10):
        while got != ["job-0"]:
            await asyncio.sleep(0.05)
    before = bus.recoveries
    await admin.js.delete_stream("JOBS")
    async with asyncio.timeout(20):
        while bus.recoveries == before:
            await asyncio.sleep(0.05)
    assert bus.ready
    assert "deleted" in {c.name for c in await bus.js.consumers_info("JOBS")}
    await bus.publish(job(1), source="t", publish_timeout_s=20)
    async with asyncio.timeout(20):
        while got != ["job-0", "job-1"]:
            await asyncio.sleep(0.05)
    await bus.close()
    await admin.close()


async def test_a_bus_that_cannot_be_reached_at_start_fails_clearly_in_time() -> None:
    """nats-py retries a first connection for ever; a service would hang unready with no word
    of why. Within `connect_within_s` it fails, naming the URL, and leaves nothing running."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{probe.getsockname()[1]}"
    before = asyncio.all_tasks()
    started = asyncio.get_running_loop().time()
    with pytest.raises(TemporaryError, match=f"NATS at {url} not reachable within 1 s"):
        await Bus.connect(url, name="nowhere", connect_within_s=1.0)
    assert asyncio.get_running_loop().time() - started < 5
    await asyncio.sleep(0.3)
    assert asyncio.all_tasks() - before == set()


async def test_a_consumer_whose_pull_loop_ended_makes_the_bus_not_ready(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="stopped-consumer")
    handled: list[str] = []

    async def handler(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        handled.append(ev.name)

    try:
        kept = await bus.subscribe(JobEvent, handler, durable="kept")
        left = await bus.subscribe(JobEvent, handler, durable="left")
        assert bus.ready and not_ready(bus) is None
        # Stopped on purpose: still ready.
        await left.stop()
        assert bus.ready and not_ready(bus) is None
        # The pull loop ends without a stop (what a bug in it would do): not ready, named.
        (loop,) = kept.tasks
        loop.cancel()
        await asyncio.wait({loop})
        assert not bus.ready
        assert not_ready(bus) == "the bus consumer kept stopped consuming"
    finally:
        await bus.close()
