"""The C intercept shim and the Python vGPU registry together: a CUDA program (the shim's own
test program, over the fake libcuda) runs with the environment Allocate gives a fractional
container; the registry sees it register, and reads its limit, peak and release from the
region the shim wrote, so both sides agree on the protocol and the binary layout."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from alnair.common.tasks import within
from alnair.deviceplugin import region
from alnair.deviceplugin.allocation import Layout, grant_fraction
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.registry import VgpuRecord, VgpuRegistry

pytestmark = pytest.mark.integration

NATIVE = Path(__file__).resolve().parents[3] / "native" / "intercept"
BUILD = NATIVE / "build"
MIB = 1 << 20


@pytest.fixture(scope="module")
def shim_build() -> Path:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("no C toolchain to build the intercept shim")
    targets = ["all", "build/tests/test_paths"]
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE), *targets], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return BUILD


async def test_shim_registers_and_its_region_reads_back(shim_build: Path, tmp_path: Path) -> None:
    layout = Layout(
        shim_host_path=str(shim_build / "libalnair-intercept.so"), state_dir=str(tmp_path)
    )
    vgpus = VgpuRegistry(layout)
    metrics = DevicePluginMetrics(CollectorRegistry())
    metrics.watch_vgpus(vgpus)
    await vgpus.start()
    try:
        grant = grant_fraction(
            uuid="GPU-1", gpu_index=1, vgpu_id="v1", memory_mib=64, compute_pct=None, layout=layout
        )
        vgpus.record(VgpuRecord("v1", 1, "GPU-1", 64, None, "ml", "infer", "main"))
        # what the container would see, with its mounts resolved to the host paths
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin"),
            "LD_LIBRARY_PATH": str(shim_build / "fake"),
            "LD_PRELOAD": layout.shim_host_path,
            "FAKE_CUDA_DEVICES": "2",
            "ALNAIR_GPU_MEMORY_LIMIT_MIB": grant.envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"],
            "ALNAIR_VGPU_ID": grant.envs["ALNAIR_VGPU_ID"],
            "ALNAIR_VGPU_REGION": str(Path(layout.vgpu_host_dir("v1")) / "region"),
            "ALNAIR_REGISTRY_SOCKET": str(vgpus.socket_for("v1")),
        }
        proc = await asyncio.create_subprocess_exec(
            str(shim_build / "tests" / "test_paths"),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await within(proc.communicate(), 60)
        text = out.decode()
        assert proc.returncode == 0, text
        assert "FAIL" not in text
    finally:
        await vgpus.stop()

    (reg,) = vgpus.seen
    assert (reg.vgpu_id, reg.pid, reg.memory) == ("v1", proc.pid, "64MiB")
    snap = region.read(Path(layout.vgpu_host_dir("v1")) / "region")
    assert snap is not None
    for gpu in (0, 1):  # the program allocates on both of its fake devices
        usage = snap.device(gpu)
        assert usage.limit_bytes == 64 * MIB
        assert usage.peak_bytes == 64 * MIB
        assert usage.used_bytes == 0
    assert snap.device(0).oom_count > 0  # every path is driven past the limit on device 0
    # an exited process keeps its slot until the next process of the container reclaims it
    assert snap.live_pids == (proc.pid,)
    assert snap.registered == 1
    scraped = generate_latest(metrics.registry).decode()
    assert (
        'alnair_deviceplugin_vgpu_memory_limit_bytes{container="main",gpu="1",namespace="ml",'
        'pod="infer",vgpu="v1"} 6.7108864e+07'
    ) in scraped
