"""The nvml backend.

Two kinds of test: against the real driver (skipped, saying why, where there is no NVIDIA
driver), and against a small stand-in of the pynvml module for the logic that needs
several GPUs, shared GPUs and XID events, which no single test machine offers on demand.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alnair.common.tasks import within
from alnair.profiler.agent.attribution import pod_shares
from alnair.profiler.agent.node_agent import inventory_event
from alnair.profiler.gpu import BackendUnavailableError, GpuBackend, GpuInfo, NodeInventory
from alnair.profiler.nvml import APPLICATION_XIDS, NvmlBackend, load_nvml, pcie_root_from_sysfs


def _real_nvml_or_reason() -> str | None:
    try:
        nvml = load_nvml()
    except BackendUnavailableError as exc:
        return exc.reason
    nvml.nvmlShutdown()
    return None


NO_GPU = _real_nvml_or_reason()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"no NVIDIA driver here: {NO_GPU}")
def test_real_gpus_inventory_and_sample() -> None:
    backend = NvmlBackend("this-node")
    try:
        inv = backend.inventory("this-node")
        assert inv.gpus
        for gpu in inv.gpus:
            assert gpu.uuid.startswith("GPU-")
            assert gpu.memory_mib > 0
            assert gpu.compute_capability.count(".") == 1
        assert len(inv.links) == len(inv.gpus)
        assert all(inv.links[i][i] == "X" for i in range(len(inv.gpus)))
        sample = backend.sample("this-node", 0.0)
        assert len(sample.gpus) == len(inv.gpus)
        for gpu in sample.gpus:
            assert 0 <= gpu.util_pct <= 100
            assert gpu.mem_used_mib >= 0
    finally:
        backend.close()


# --- a stand-in pynvml for multi-GPU logic --------------------------------------------


class FakeNVMLError(Exception):
    pass


class FakeTimeout(FakeNVMLError):
    pass


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int


@dataclass
class UtilSample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0


@dataclass
class Event:
    device: int
    eventType: int
    eventData: int


def fake_nvml(events: list[Event]) -> types.ModuleType:
    m = types.ModuleType("fake_pynvml")
    n: Any = m
    n.NVMLError = FakeNVMLError
    n.NVMLError_Timeout = FakeTimeout
    n.NVML_FEATURE_ENABLED = 1
    n.NVML_NVLINK_MAX_LINKS = 4
    n.nvmlEventTypeXidCriticalError = 8
    n.nvmlEventTypeDoubleBitEccError = 2
    gib = 1024**3
    n.nvmlDeviceGetCount = lambda: 2
    n.nvmlDeviceGetHandleByIndex = lambda i: i
    n.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    n.nvmlDeviceGetName = lambda h: "Tesla V100-SXM2-32GB"
    n.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=32 * gib, used=(10 if h == 0 else 0) * gib
    )
    n.nvmlDeviceGetCudaComputeCapability = lambda h: (7, 0)
    n.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:0{h}:00.0".encode())

    def nvlink_state(h: int, link: int) -> int:
        if link >= 2:
            raise FakeNVMLError("no such link")
        return 1

    n.nvmlDeviceGetNvLinkState = nvlink_state
    n.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=f"00000000:0{1 - h}:00.0"
    )
    n.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50
    n.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=90 if h == 0 else 0, memory=40
    )
    n.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [Proc(100, 6 * gib), Proc(200, 4 * gib)] if h == 0 else []
    )

    def proc_util(h: int, last_seen: int) -> list[UtilSample]:
        if h != 0:
            raise FakeNVMLError("not found")
        return [UtilSample(100, 5, 60), UtilSample(200, 6, 20), UtilSample(100, 7, 50)]

    n.nvmlDeviceGetProcessUtilization = proc_util
    n.nvmlEventSetCreate = lambda: "set"
    n.nvmlDeviceRegisterEvents = lambda h, mask, s: None

    def wait(s: str, timeout_ms: int) -> Event:
        if events:
            return events.pop(0)
        time.sleep(0.01)  # the real call blocks up to timeout_ms
        raise FakeTimeout("timeout")

    n.nvmlEventSetWait = wait
    n.nvmlEventSetFree = lambda s: None
    n.nvmlShutdown = lambda: None
    return m


def test_inventory_topology_and_per_process_sample() -> None:
    backend = NvmlBackend("gpu-node", nvml=fake_nvml([]))
    assert isinstance(backend, GpuBackend)
    inv = backend.inventory("gpu-node")
    assert [g.uuid for g in inv.gpus] == ["GPU-0", "GPU-1"]
    assert inv.gpus[0].memory_mib == 32768
    assert inv.gpus[0].compute_capability == "7.0"
    assert inv.links == (("X", "NV2"), ("NV2", "X"))
    sample = backend.sample("gpu-node", 1.0)
    gpu0 = sample.gpus[0]
    assert gpu0.util_pct == 90
    by_pid = {p.pid: p for p in gpu0.processes}
    assert by_pid[100].mem_used_mib == 6144
    assert by_pid[100].sm_util_pct == 60  # the highest sample in the window
    # Two pods share GPU 0: 90% splits 60:20, not 90% each.
    shares = {s.pod_uid: s.gpu_util_pct for s in pod_shares(gpu0, {100: "pod-a", 200: "pod-b"})}
    assert shares == {"pod-a": pytest.approx(67.5), "pod-b": pytest.approx(22.5)}
    with pytest.raises(KeyError):
        backend.inventory("another-node")


async def test_critical_xid_marks_unhealthy_application_xid_does_not() -> None:
    assert 13 in APPLICATION_XIDS
    events = [
        Event(device=1, eventType=8, eventData=13),
        Event(device=1, eventType=8, eventData=79),
    ]
    backend = NvmlBackend("gpu-node", nvml=fake_nvml(events), recover_after_s=3600)
    signals = backend.health_signals()
    signal = await within(anext(signals), 10)
    assert (signal.gpu_index, signal.healthy, signal.xid) == (1, False, 79)
    assert not backend.inventory("gpu-node").gpus[1].healthy
    assert backend.inventory("gpu-node").gpus[0].healthy
    backend.close()
    with pytest.raises(StopAsyncIteration):
        await within(anext(signals), 10)


def _fake_sysfs(root: Path) -> Path:
    """A sysfs tree like a two-socket server's: one GPU behind a switch under root complex
    pci0000:3a, one directly under pci0001:00 (a second PCI domain)."""
    devices = root / "devices"
    behind_switch = devices / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    direct = devices / "pci0001:00" / "0001:00:02.0"
    for d in (behind_switch, direct, devices / "platform" / "0000:7f:00.0"):
        d.mkdir(parents=True)
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:3b:00.0").symlink_to(behind_switch)
    (bus / "0001:00:02.0").symlink_to(direct)
    (bus / "0000:7f:00.0").symlink_to(devices / "platform" / "0000:7f:00.0")
    (bus / "0000:80:00.0").symlink_to(root / "elsewhere")  # dangling
    return root


def test_pcie_root_is_the_first_component_under_sys_devices(tmp_path: Path) -> None:
    sysfs = _fake_sysfs(tmp_path)
    # NVML's 8-digit upper-case domain and sysfs's 4-digit lower-case name are the same device
    assert pcie_root_from_sysfs("00000000:3B:00.0", sysfs) == "pci0000:3a"
    assert pcie_root_from_sysfs("0000:3b:00.0", sysfs) == "pci0000:3a"
    assert pcie_root_from_sysfs("00000001:00:02.0", sysfs) == "pci0001:00"


@pytest.mark.parametrize(
    "bus_id",
    [
        "00000000:7F:00.0",  # not under a pci root complex
        "00000000:80:00.0",  # a dangling link
        "00000000:99:00.0",  # no such device
        "not-a-bus-id",
        "",
    ],
)
def test_pcie_root_unknown_is_empty(tmp_path: Path, bus_id: str) -> None:
    assert pcie_root_from_sysfs(bus_id, _fake_sysfs(tmp_path)) == ""


def test_the_inventory_event_carries_the_pcie_root() -> None:
    gpu = GpuInfo(0, "GPU-0", "H100", 81559, "9.0", numa_node=0, pcie_root="pci0000:3a")
    event = inventory_event(NodeInventory("n1", (gpu,), (("X",),)))
    assert event.gpus[0].pcie_root == "pci0000:3a"
