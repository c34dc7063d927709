"""The nvml backend through the real nvidia-ml-py bindings and a C library in NVML's place
(`native/intercept/tests/fake_nvml.c`), which reads the fake driver's per-process counters:
the ctypes layouts, the two-call size protocol, the process and utilization samples and the
XID events are exercised as on a GPU node, with a real program using the fake driver.

The backend runs in a child process: the bindings load `libnvidia-ml.so.1` once per process,
and this one must keep finding no driver (test_profiler_nvml.py skips on that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

NATIVE = Path(__file__).resolve().parents[3] / "native" / "intercept"
FAKE = NATIVE / "build" / "fake"

READER = """
import asyncio, json, sys, time
from alnair.common.tasks import within
from alnair.profiler.nvml import NvmlBackend

async def main():
    backend = NvmlBackend("n1", recover_after_s=0.5)
    inv = backend.inventory("n1")
    out = {"gpus": [[g.uuid, g.model, g.memory_mib, g.compute_capability] for g in inv.gpus],
           "links": [list(r) for r in inv.links], "samples": [], "health": []}
    for _ in range(4):
        s = backend.sample("n1", time.time())
        out["samples"].append([[g.index, g.util_pct, g.mem_used_mib,
                                [[p.pid, p.mem_used_mib, p.sm_util_pct] for p in g.processes]]
                               for g in s.gpus])
        await asyncio.sleep(0.5)
    signals = backend.health_signals()
    waiting = asyncio.ensure_future(signals.__anext__())  # starts the event thread
    await asyncio.sleep(0.5)
    with open(sys.argv[1], "a") as f:
        f.write("1 79\\n")
    first = await within(waiting, 10)
    out["health"].append([first.gpu_index, first.healthy, first.xid])
    await asyncio.sleep(0.6)
    backend.sample("n1", time.time())  # answers after the quiet period: healthy again
    second = await within(signals.__anext__(), 10)
    out["health"].append([second.gpu_index, second.healthy, second.xid])
    backend.close()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def fake_build() -> Path:
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE), "probe"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return FAKE


def test_the_nvml_backend_reads_a_fake_driver_process(fake_build: Path, tmp_path: Path) -> None:
    stats = tmp_path / "probe.stats"
    probe = subprocess.Popen(
        [str(NATIVE / "build" / "tests" / "gpu_probe")],
        env={**os.environ, "LD_LIBRARY_PATH": str(fake_build), "FAKE_CUDA_STATS": str(stats),
             "FAKE_CUDA_KERNEL_US": "200", "PROBE_MAX_MIB": "320", "PROBE_KERNEL_S": "8"},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        xids = tmp_path / "xids"
        xids.write_text("")
        done = subprocess.run(
            [sys.executable, "-c", READER, str(xids)],
            env={**os.environ, "LD_LIBRARY_PATH": str(fake_build), "FAKE_NVML_XID_FILE": str(xids),
                 "FAKE_NVML_DEVICES": "2", "FAKE_NVML_TOTAL_MIB": "16384"},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
    finally:
        probe.kill()
        probe.wait()
    # NVML's "Tesla V100-SXM2-16GB", in the system's vocabulary
    assert seen["gpus"] == [
        ["GPU-fake-0", "V100M16", 16384, "7.0"],
        ["GPU-fake-1", "V100M16", 16384, "7.0"],
    ]
    assert seen["links"] == [["X", "NODE"], ["NODE", "X"]]
    last = seen["samples"][-1]
    (gpu0, gpu1) = last
    assert gpu1[3] == []  # the probe uses device 0 only
    [[pid, mem_mib, sm]] = gpu0[3]
    assert pid == probe.pid and mem_mib == 320
    assert sm == pytest.approx(100, abs=5)  # kernels back to back, no shim
    assert gpu0[1] == pytest.approx(100, abs=5) and gpu0[2] == 320
    assert seen["health"] == [[1, False, 79], [1, True, None]]
