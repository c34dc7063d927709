"""The `nvml` GPU backend: real NVIDIA GPUs through NVML (the nvidia-ml-py bindings).

One agent per GPU node (DaemonSet) runs this backend for its own node. NVML answers:
devices (UUID, name, memory, compute capability; NUMA node and PCIe root complex from the PCI
device in sysfs), the pairwise topology (NVLink counts, else the PCIe common ancestor, in
`nvidia-smi topo` words), device utilization and memory, and per-process memory and SM
samples, which is what lets the agent split a shared GPU correctly between pods.

Health: NVML pushes XID and ECC events to an event set; a worker thread blocks in
`nvmlEventSetWait` (the wait has a timeout only so the thread can notice shutdown) and
forwards them. XIDs that an application causes by itself (13, 31, 43, 45, 68, 109: bad
kernels, page faults, killed contexts) say nothing about the GPU and are ignored, as the
NVIDIA device plugin does. Any other critical XID or a double-bit ECC error marks the GPU
unhealthy. NVML has no "recovered" event, so a GPU is declared healthy again when, after a
quiet period, it answers queries at the next regular sample.

pynvml is imported lazily: the module loads on machines without a driver, and the backend
raises BackendUnavailableError with NVML's own message when there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from alnair.common.resources import gpu_model_key
from alnair.profiler.gpu import (
    BackendUnavailableError,
    GpuInfo,
    GpuSample,
    HealthSignal,
    NodeInventory,
    NodeSample,
    ProcessUsage,
)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_MIB = 1024 * 1024

# NVML topology levels (nvmlGpuTopologyLevel_t) in nvidia-smi's vocabulary.
_TOPO_WORDS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def load_nvml() -> ModuleType:
    """Import pynvml and initialise NVML, or say precisely why it cannot be done."""
    try:
        import pynvml  # lazy: the driver may be absent
    except ImportError as exc:
        raise BackendUnavailableError("nvml", f"pynvml not installed ({exc})") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise BackendUnavailableError("nvml", f"NVML init failed: {exc}") from exc
    module: ModuleType = pynvml
    return module


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sysfs_name(bus_id: str) -> str:
    # NVML writes an 8-digit domain ("00000000:3B:00.0"); sysfs uses 4 and lower case.
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pcie_root_from_sysfs(bus_id: str, sysfs: Path = Path("/sys")) -> str:
    """The PCIe root complex of the device at `bus_id`, as `pci<domain>:<bus>` ("pci0000:00"),
    or "" when it cannot be told.

    `/sys/bus/pci/devices/<bdf>` is a link into `/sys/devices`, whose tree follows the hardware:
    `/sys/devices/pci0000:00/0000:00:01.0/.../0000:3b:00.0`. Its first component is the root
    complex, the value upstream's `resource.kubernetes.io/pcieRoot` attribute carries, so two
    drivers on one node name the same root alike.
    """
    name = _sysfs_name(bus_id)
    if not _BDF.match(name):
        return ""
    devices = (sysfs / "devices").resolve()
    try:
        target = (sysfs / "bus" / "pci" / "devices" / name).resolve(strict=True)
    except (OSError, RuntimeError):
        return ""
    if not target.is_relative_to(devices) or target == devices:
        return ""
    root = target.relative_to(devices).parts[0]
    return root if root.startswith("pci") else ""


def _numa_from_sysfs(bus_id: str, sysfs: Path = Path("/sys/bus/pci/devices")) -> int | None:
    name = _sysfs_name(bus_id)
    try:
        value = int((sysfs / name / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if value < 0 else value


class NvmlBackend:
    """The GPUs of the node this process runs on."""

    name = "nvml"

    def __init__(
        self, node: str, nvml: ModuleType | None = None, recover_after_s: float = 60.0
    ) -> None:
        self._nvml = nvml or load_nvml()
        self._node = node
        self._recover_after_s = recover_after_s
        n = self._nvml
        self._handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        self._uuids = [_text(n.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._unhealthy: dict[int, float] = {}  # gpu index -> time of last fault
        self._last_seen_us = [0] * len(self._handles)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals: asyncio.Queue[HealthSignal | None] = asyncio.Queue()
        self._stop = threading.Event()
        self._inventory = self._read_inventory()

    # -- inventory ------------------------------------------------------------------
    def _read_inventory(self) -> NodeInventory:
        n = self._nvml
        gpus = []
        for i, h in enumerate(self._handles):
            major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
            bus_id = _text(n.nvmlDeviceGetPciInfo(h).busId)
            memory_mib = int(n.nvmlDeviceGetMemoryInfo(h).total // _MIB)
            product = _text(n.nvmlDeviceGetName(h))
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=self._uuids[i],
                    # the system's vocabulary (queues, requests, throughput tables), not
                    # NVML's product name; an unknown model keeps its product name
                    model=gpu_model_key(product, memory_mib) or product,
                    memory_mib=memory_mib,
                    compute_capability=f"{major}.{minor}",
                    numa_node=_numa_from_sysfs(bus_id),
                    pcie_root=pcie_root_from_sysfs(bus_id),
                    healthy=i not in self._unhealthy,
                )
            )
        return NodeInventory(self._node, tuple(gpus), self._read_links())

    def _nvlinks_between(self, a: Any, b_bus: str) -> int:
        n = self._nvml
        links = 0
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if n.nvmlDeviceGetNvLinkState(a, link) != n.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(n.nvmlDeviceGetNvLinkRemotePciInfo(a, link).busId)
            except n.NVMLError:
                # Not supported, or past the last link of this GPU.
                break
            if remote.lower().lstrip("0") == b_bus.lower().lstrip("0"):
                links += 1
        return links

    def _read_links(self) -> tuple[tuple[str, ...], ...]:
        n = self._nvml
        buses = [_text(n.nvmlDeviceGetPciInfo(h).busId) for h in self._handles]
        rows = []
        for i, a in enumerate(self._handles):
            row = []
            for j, b in enumerate(self._handles):
                if i == j:
                    row.append("X")
                    continue
                nv = self._nvlinks_between(a, buses[j])
                if nv:
                    row.append(f"NV{nv}")
                    continue
                try:
                    level = int(n.nvmlDeviceGetTopologyCommonAncestor(a, b))
                except n.NVMLError:
                    row.append("SYS")
                    continue
                row.append(_TOPO_WORDS.get(level, "SYS"))
            rows.append(tuple(row))
        return tuple(rows)

    def nodes(self) -> Sequence[str]:
        return [self._node]

    def inventory(self, node: str) -> NodeInventory:
        if node != self._node:
            raise KeyError(node)
        return self._inventory

    # -- sampling -------------------------------------------------------------------
    def _process_sm(self, index: int) -> dict[int, float]:
        n = self._nvml
        try:
            samples = n.nvmlDeviceGetProcessUtilization(
                self._handles[index], self._last_seen_us[index]
            )
        except n.NVMLError:
            return {}  # NOT_FOUND when no process ran a kernel in the window
        sm: dict[int, float] = {}
        for s in samples:
            sm[int(s.pid)] = max(sm.get(int(s.pid), 0.0), float(s.smUtil))
            self._last_seen_us[index] = max(self._last_seen_us[index], int(s.timeStamp))
        return sm

    def sample(self, node: str, now: float) -> NodeSample:
        n = self._nvml
        self._maybe_recover(now)
        out = []
        for i, h in enumerate(self._handles):
            try:
                util = float(n.nvmlDeviceGetUtilizationRates(h).gpu)
                mem = float(n.nvmlDeviceGetMemoryInfo(h).used) / _MIB
                procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            except n.NVMLError:
                continue  # a GPU that stopped answering shows up through health, not here
            sm = self._process_sm(i)
            usage = tuple(
                ProcessUsage(
                    gpu_index=i,
                    mem_used_mib=float(p.usedGpuMemory or 0) / _MIB,
                    sm_util_pct=sm.get(int(p.pid)),
                    pid=int(p.pid),
                )
                for p in procs
            )
            out.append(GpuSample(i, self._uuids[i], util, mem, usage))
        return NodeSample(node, now, tuple(out))

    # -- health ---------------------------------------------------------------------
    def _emit(self, signal: HealthSignal) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._signals.put_nowait, signal)

    def _fault(self, index: int, reason: str, xid: int | None) -> None:
        first = index not in self._unhealthy
        self._unhealthy[index] = time.monotonic()
        if first:
            self._inventory = self._read_inventory()
            self._emit(HealthSignal(self._node, index, self._uuids[index], False, reason, xid))

    def _maybe_recover(self, now: float) -> None:
        n = self._nvml
        for index, since in list(self._unhealthy.items()):
            if time.monotonic() - since < self._recover_after_s:
                continue
            try:
                n.nvmlDeviceGetMemoryInfo(self._handles[index])
            except n.NVMLError:
                continue
            del self._unhealthy[index]
            self._inventory = self._read_inventory()
            self._emit(
                HealthSignal(
                    self._node, index, self._uuids[index], True, "answers again after quiet period"
                )
            )

    def _watch_events(self) -> None:
        n = self._nvml
        event_set = n.nvmlEventSetCreate()
        wanted = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
        for h in self._handles:
            with contextlib.suppress(n.NVMLError):
                n.nvmlDeviceRegisterEvents(h, wanted, event_set)
        try:
            while not self._stop.is_set():
                try:
                    data = n.nvmlEventSetWait(event_set, 1000)
                except n.NVMLError_Timeout:
                    continue
                except n.NVMLError:
                    # A failing wait would otherwise spin; the stop flag still ends us promptly.
                    self._stop.wait(1.0)
                    continue
                uuid = _text(n.nvmlDeviceGetUUID(data.device))
                index = self._uuids.index(uuid) if uuid in self._uuids else -1
                if index < 0:
                    continue
                if data.eventType == n.nvmlEventTypeDoubleBitEccError:
                    self._fault(index, "double-bit ECC error", None)
                elif int(data.eventData) not in APPLICATION_XIDS:
                    self._fault(index, f"XID {int(data.eventData)}", int(data.eventData))
        finally:
            n.nvmlEventSetFree(event_set)

    async def health_signals(self) -> AsyncIterator[HealthSignal]:
        self._loop = asyncio.get_running_loop()
        worker = threading.Thread(target=self._watch_events, name="nvml-events", daemon=True)
        worker.start()
        while True:
            signal = await self._signals.get()
            if signal is None:
                return
            yield signal

    def close(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._signals.put_nowait, None)
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
