"""Hostile messages against real consumers (issue 16): a JetStream consumer and a core-NATS
queue-group consumer each receive a corpus of malformed, hostile and mutated messages (drawn
with a fixed seed, so CI replays the same corpus; the decoder itself is fuzzed with hypothesis
in tests/unit/common/test_common_events_fuzz.py); every one is dead-lettered with its reason
and the consumers keep going.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from alnair.common.bus import Bus
from alnair.common.events import (
    DeadLetter,
    DecodeError,
    Envelope,
    JobEvent,
    JobPhase,
    PodMetric,
    decode,
    encode,
    wrap,
)

pytestmark = pytest.mark.integration

CORPUS_SIZE = 40
HOSTILE_VALUES: list[Any] = [None, -1, 2**70, "", "x" * 300, [1, 2], "exploded", {"a": 1}, True]


async def dead_letters(bus: Bus, durable: str, n: int, timeout_s: float) -> list[DeadLetter]:
    psub = await bus.js.pull_subscribe(f"alnair.dlq.{durable}", durable=f"dlq-reader-{durable}")
    got: list[DeadLetter] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            for msg in await psub.fetch(n - len(got), timeout=timeout_s):
                got.append(DeadLetter.model_validate_json(msg.data))
                await msg.ack()
    return got


def corpus(template: bytes, seed: int) -> list[bytes]:
    """Bad messages: pathological documents, random bytes, and valid envelopes with fields
    replaced by random JSON values (kept only when they really are invalid)."""
    rng = random.Random(seed)
    out = [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"type": ' + b"9" * 5000 + b"}",
        b"\xff\xfe{}",
        b"null",
        b'{"type": "io.alnair.jobs.lifecycle.v1", "data": {"gpu_util_pct": NaN}}',
    ]
    while len(out) < CORPUS_SIZE:
        if rng.random() < 0.3:
            out.append(rng.randbytes(rng.randrange(1, 200)))
            continue
        doc: dict[str, Any] = json.loads(template)
        target = doc["data"] if rng.random() < 0.7 else doc
        key = rng.choice(sorted(target))
        target[key] = rng.choice(HOSTILE_VALUES)
        raw = json.dumps(doc).encode()
        try:
            decode(raw)
        except DecodeError:
            out.append(raw)
    return out


async def test_jetstream_consumer_dead_letters_every_bad_message(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="fuzz")
    handled: list[str] = []

    async def handler(ev: JobEvent, _env: Envelope[JobEvent]) -> None:
        handled.append(ev.name)

    good = JobEvent(phase=JobPhase.COMPLETED, namespace="ml", kind="Job", name="good", uid="g")
    bad = corpus(encode(wrap(good, source="fuzz")), seed=16)
    try:
        sub = await bus.subscribe(JobEvent, handler, durable="fuzz-jobs")
        subject = good.subject()
        for raw in bad:
            await bus.js.publish(subject, raw)
        await bus.publish(good, source="fuzz")
        letters = await dead_letters(bus, "fuzz-jobs", len(bad), timeout_s=30)
        assert len(letters) == len(bad) and all(dl.reason for dl in letters)
        async with asyncio.timeout(10):
            while handled != ["good"]:
                await asyncio.sleep(0.05)
        assert sub.dead_lettered == len(bad) and sub.handled == 1
        assert not any(t.done() for t in sub.tasks)  # the consumer is alive
    finally:
        await bus.close()


async def test_core_consumer_dead_letters_every_bad_message(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="fuzz-core")
    handled: list[str] = []

    async def handler(ev: PodMetric, _env: Envelope[PodMetric]) -> None:
        handled.append(ev.pod)

    good = PodMetric(node="n1", namespace="ml", pod="good", pod_uid="u", gpu_util_pct=1.0)
    bad = corpus(encode(wrap(good, source="fuzz")), seed=7)
    try:
        sub = await bus.subscribe(PodMetric, handler, durable="fuzz-metrics")
        for raw in bad:
            await bus.publish_raw(good.subject(), raw)
        await bus.publish(good, source="fuzz")
        letters = await dead_letters(bus, "fuzz-metrics", len(bad), timeout_s=30)
        assert len(letters) == len(bad)
        async with asyncio.timeout(10):
            while handled != ["good"]:
                await asyncio.sleep(0.05)
        assert sub.dead_lettered == len(bad)
    finally:
        await bus.close()
