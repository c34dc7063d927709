"""Hostile input for every event decoder (issue 16): whatever bytes arrive, `decode` either
returns a valid envelope of the expected type or raises `DecodeError` naming the problem,
which the bus turns into a dead letter. Nothing else may escape: an unexpected exception
would leave the message unacknowledged, redelivered forever and never explained.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alnair.common.events import (
    EVENT_TYPES,
    DecodeError,
    Envelope,
    Event,
    GpuHealthChanged,
    GpuInventory,
    JobEvent,
    JobPhase,
    PodMetric,
    PodSummary,
    ScaleEvent,
    ScalePhase,
    SeriesSummary,
    decode,
    encode,
    wrap,
)

SAMPLES: dict[type[Event], Event] = {
    PodMetric: PodMetric(node="n1", namespace="ml", pod="p", pod_uid="u", gpu_util_pct=50.0),
    PodSummary: PodSummary(
        node="n1",
        namespace="ml",
        pod="p",
        pod_uid="u",
        first_ts=datetime(2025, 1, 1, tzinfo=UTC),
        last_ts=datetime(2025, 1, 1, 0, 1, tzinfo=UTC),
        gpus=["GPU-1"],
        gpu_mem_used_mib=SeriesSummary(count=60, total=60000.0, max=1200.0),
    ),
    GpuInventory: GpuInventory(node="n1", gpus=[]),
    GpuHealthChanged: GpuHealthChanged(node="n1", gpu_index=0, gpu_uuid="G", healthy=False),
    JobEvent: JobEvent(phase=JobPhase.COMPLETED, namespace="ml", kind="Job", name="j", uid="u"),
    ScaleEvent: ScaleEvent(phase=ScalePhase.REQUESTED, namespace="ml", job="ej", replicas=2),
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def check(raw: bytes, expected: type[Event] | None = None) -> None:
    """The property: a valid envelope of the right type, or a DecodeError; nothing else."""
    try:
        env = decode(raw, expected)
    except DecodeError as exc:
        reason = str(exc)
        assert reason  # names what is wrong
        return
    assert isinstance(env, Envelope)
    if expected is not None:
        assert isinstance(env.data, expected)
    for value in env.data.model_dump().values():
        if isinstance(value, float):
            assert math.isfinite(value)


def test_every_event_type_has_a_sample() -> None:
    assert set(SAMPLES) == set(EVENT_TYPES)


@given(st.binary(max_size=512))
def test_arbitrary_bytes(raw: bytes) -> None:
    check(raw)


@given(json_values)
def test_arbitrary_json(value: Any) -> None:
    check(json.dumps(value).encode())


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(SAMPLES, key=lambda c: c.TYPE)),
    st.lists(st.tuples(st.text(max_size=12), json_values), min_size=1, max_size=4),
    st.booleans(),
)
def test_mutated_envelopes(cls: type[Event], changes: list[tuple[str, Any]], in_data: bool) -> None:
    doc = json.loads(encode(wrap(SAMPLES[cls], source="fuzz")))
    target = doc["data"] if in_data else doc
    keys = sorted(target)
    for i, (name, value) in enumerate(changes):
        # overwrite an existing field (by position) or add a new one
        target[keys[i % len(keys)] if name == "" or i % 2 else name] = value
    check(json.dumps(doc).encode(), cls)
    check(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the parser's recursion
        b'{"type": ' + b"9" * 5000 + b"}",  # an integer longer than Python will convert
        b'{"specversion": "1.0", "type": "io.alnair.metrics.pod.v1", "data": NaN}',
        b"\xff\xfe{}",
        b"",
    ],
    ids=["deep-nesting", "huge-integer", "nan", "not-utf8", "empty"],
)
def test_pathological_documents(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(raw)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(constant: str) -> None:
    doc = json.loads(encode(wrap(SAMPLES[PodMetric], source="fuzz")))
    raw = json.dumps(doc).replace('"gpu_util_pct":50.0', f'"gpu_util_pct":{constant}')
    raw = raw.replace('"gpu_util_pct": 50.0', f'"gpu_util_pct": {constant}')
    assert constant in raw
    with pytest.raises(DecodeError, match="not JSON"):
        decode(raw.encode(), PodMetric)
