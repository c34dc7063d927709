"""The accounting region's binary layout and the shim's registration line."""

from __future__ import annotations

from pathlib import Path

import pytest

from alnair.common.errors import InvalidValueError
from alnair.deviceplugin import region
from alnair.deviceplugin.registry import parse_register


def test_region_round_trip() -> None:
    usage = region.DeviceUsage(
        limit_bytes=1 << 30,
        used_bytes=123,
        peak_bytes=456,
        oom_count=7,
        compute_pct=30,
        launches=99,
        throttled_ns=5_000,
    )
    snap = region.parse(region.build({2: usage}, pids=(41, 42), registered=3))
    assert snap.device(2) == usage
    assert snap.device(0).limit_bytes == 0
    assert snap.live_pids == (41, 42)
    assert snap.registered == 3
    assert region.SIZE == 64 + 16 * 64 + 256 * 144  # the C side asserts the same


def test_region_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="shorter"):
        region.parse(b"\0" * 10)
    with pytest.raises(InvalidValueError, match="magic"):
        region.parse(b"\0" * region.SIZE)
    assert region.read(tmp_path / "absent") is None


def test_register_line() -> None:
    reg = parse_register("REGISTER vgpu=v1 pid=42 region=/r memory=64MiB compute=30\n")
    assert (reg.vgpu_id, reg.pid, reg.region, reg.memory, reg.compute) == (
        "v1",
        42,
        "/r",
        "64MiB",
        "30",
    )


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("HELLO", "HELLO"),
        ("REGISTER vgpu=- pid=1", "ALNAIR_VGPU_ID"),
        ("REGISTER vgpu=v pid=x", "'x'"),
        ("REGISTER vgpu=v pid", "'pid'"),
    ],
)
def test_register_errors(line: str, named: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        parse_register(line)
    assert named in str(err.value)
