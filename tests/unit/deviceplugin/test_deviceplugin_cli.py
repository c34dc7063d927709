"""The `alnair deviceplugin` tools: a dry run of the advertised devices, and region decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alnair.deviceplugin import region
from alnair.deviceplugin.cli import main


def test_devices_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["devices", "--gpus", "GPU-a:1024:0,GPU-b:2560"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nvidia.com/gpu"]["count"] == 2
    assert out["alnair.io/gpu-memory-gib"]["count"] == 1 + 2
    assert out["alnair.io/gpu-memory-gib"]["first"] == ["gib-0-0", "gib-1-0", "gib-1-1"]
    assert out["alnair.io/gpu-memory"]["count"] == 1024 + 2560
    assert out["alnair.io/gpu-memory"]["fits_kubelet"] is True
    assert 0 < out["alnair.io/gpu-memory-gib"]["message_bytes"] < 200
    assert out["alnair.io/gpu-compute"]["first"] == ["sm-0-0", "sm-0-1", "sm-0-2"]


def test_devices_names_a_bad_gpu_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--gpus", "GPU-a:lots"]) == 2
    assert "GPU-a:lots" in capsys.readouterr().err


def test_region_decoding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    usage = region.DeviceUsage(64 << 20, 1 << 20, 2 << 20, 3, 0, 0, 0)
    path = tmp_path / "region"
    path.write_bytes(region.build({0: usage}, pids=(9,), registered=1))
    assert main(["region", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"][0]["used_bytes"] == 1 << 20
    assert out["live_pids"] == [9]
    assert main(["region", str(tmp_path / "missing")]) == 1
