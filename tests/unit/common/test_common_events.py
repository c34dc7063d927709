"""Event models, the envelope and decoding errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alnair.common.events import (
    BY_TYPE,
    DecodeError,
    GpuHealthChanged,
    JobEvent,
    JobPhase,
    PodMetric,
    ScaleEvent,
    ScalePhase,
    decode,
    encode,
    json_schemas,
    main,
    subject_token,
    wrap,
)


def test_subjects_follow_the_design() -> None:
    assert PodMetric(node="n1", namespace="a", pod="p", pod_uid="u").subject() == (
        "alnair.metrics.pod.n1"
    )
    health = GpuHealthChanged(node="n1", gpu_index=3, gpu_uuid="GPU-1", healthy=False)
    assert health.subject() == "alnair.health.n1.3"
    job = JobEvent(phase=JobPhase.COMPLETED, namespace="ml", kind="Job", name="j", uid="u")
    assert job.subject() == "alnair.jobs.default.ml.Job"
    scale = ScaleEvent(phase=ScalePhase.REQUESTED, namespace="ml", job="ej", replicas=4)
    assert scale.subject() == "alnair.scale.ml.ej"


@given(st.text(max_size=40))
def test_subject_token_never_contains_separators_or_wildcards(value: str) -> None:
    token = subject_token(value)
    assert token
    assert not any(c in token for c in ".*> \t\n")


def test_round_trip_keeps_id_type_and_data() -> None:
    ev = JobEvent(phase=JobPhase.STARTED, namespace="ml", kind="Job", name="j", uid="u")
    env = wrap(ev, source="/test", event_id="abc")
    back = decode(encode(env), expected=JobEvent)
    assert back.id == "abc"
    assert back.type == "io.alnair.jobs.lifecycle.v1"
    assert back.specversion == "1.0"
    assert back.data == ev


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"type": "io.nobody.v9"}', "unknown event type 'io.nobody.v9'"),
    ],
)
def test_decode_names_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(raw)


def test_decode_names_the_invalid_field_and_value() -> None:
    env = json.loads(encode(wrap(PodMetric(node="n", namespace="a", pod="p", pod_uid="u"), "t")))
    env["data"]["gpu_util_pct"] = 140
    with pytest.raises(DecodeError, match=r"data\.gpu_util_pct"):
        decode(json.dumps(env).encode())


def test_decode_refuses_a_different_type_than_expected() -> None:
    env = wrap(PodMetric(node="n", namespace="a", pod="p", pod_uid="u"), "t")
    with pytest.raises(DecodeError, match="expected"):
        decode(encode(env), expected=JobEvent)


def test_schema_command_writes_one_schema_per_type(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["schema", "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"{t}.schema.json" for t in BY_TYPE)
    schema = json.loads((tmp_path / "io.alnair.metrics.pod.v1.schema.json").read_text())
    assert "data" in schema["properties"]
    assert set(json_schemas()) == set(BY_TYPE)


def test_an_inventory_is_read_only_under_its_own_nodes_key() -> None:
    from alnair.common.events import GpuDevice, GpuInventory

    gpu = GpuDevice(index=0, uuid="GPU-0", model="V100M32", memory_mib=32768)
    inv = GpuInventory(node="ip-10-0-0-1.ec2.internal", gpus=[gpu])
    raw = inv.model_dump_json().encode()
    assert GpuInventory.read(inv.kv_key(), raw) == inv
    with pytest.raises(DecodeError, match="of node 'ip-10-0-0-1.ec2.internal' stored under 'b'"):
        GpuInventory.read("b", raw)  # one node's agent writing another node's key
    with pytest.raises(DecodeError, match="unreadable GPU inventory at 'b'"):
        GpuInventory.read("b", b"{}")
