"""The GPU backend interface the node agent reads through.

The agent does not care whether GPUs are real (`nvml`) or simulated for KWOK nodes (`sim`):
both backends answer the same questions, per node they serve: which GPUs are there and how
are they linked (inventory), and what is each GPU and each GPU process doing right now
(sample). The nvml backend serves exactly one node (the one it runs on) and reports
processes by pid, which the agent maps to pods through cgroups; the sim backend serves many
fake nodes from one process and already knows which pod each simulated process belongs to.

Health changes are pushed, not polled: a backend hands the agent an async iterator of
`HealthSignal` (NVML XID/ECC events, or node annotations for the sim backend).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from alnair.common.errors import ConfigError


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the inventory describes it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: str
    numa_node: int | None = None
    healthy: bool = True
    pcie_root: str = ""
    """PCIe root complex (`pci0000:00`), "" when unknown."""


@dataclass(frozen=True)
class NodeInventory:
    """A node's GPUs and the link between each pair.

    `links[i][j]` uses the vocabulary of `nvidia-smi topo -m`: "X" (self), "NV<n>" (n NVLinks),
    "PIX", "PXB", "PHB", "NODE", "SYS", so consumers already know how to rank them.
    """

    node: str
    gpus: tuple[GpuInfo, ...]
    links: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class ProcessUsage:
    """One GPU process's use of one GPU during the last sample window.

    Real processes carry a `pid` (mapped to a pod later); simulated ones carry the pod
    directly. `sm_util_pct` is the process's SM share as NVML samples it (None when the
    driver gave no sample for it in the window).
    """

    gpu_index: int
    mem_used_mib: float
    sm_util_pct: float | None
    pid: int | None = None
    pod_uid: str | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU's device-level counters for the last sample window."""

    index: int
    uuid: str
    util_pct: float
    mem_used_mib: float
    processes: tuple[ProcessUsage, ...] = ()


@dataclass(frozen=True)
class SimPodUsage:
    """CPU/memory/IO of a pod as the sim backend invents it (real nodes read cgroups)."""

    cpu_util_cores: float
    mem_used_mib: float
    io_read_bps: float
    io_write_bps: float


@dataclass(frozen=True)
class PodRef:
    """Enough of a pod to label its metrics."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class NodeSample:
    """Everything one node's GPUs did in the last window."""

    node: str
    ts: float
    gpus: tuple[GpuSample, ...]
    # Filled by backends that know pods directly (sim); empty for nvml.
    pods: dict[str, PodRef] = field(default_factory=dict)
    pod_usage: dict[str, SimPodUsage] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthSignal:
    """A GPU became unhealthy, or healthy again."""

    node: str
    gpu_index: int
    gpu_uuid: str
    healthy: bool
    reason: str
    xid: int | None = None


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from a source of GPU facts."""

    name: str

    def nodes(self) -> Sequence[str]:
        """The nodes this backend currently serves."""
        ...

    def inventory(self, node: str) -> NodeInventory:
        """The node's GPUs and topology (raises KeyError for a node not served)."""
        ...

    def sample(self, node: str, now: float) -> NodeSample:
        """Device and per-process usage over the window ending at `now`."""
        ...

    def health_signals(self) -> AsyncIterator[HealthSignal]:
        """Health changes as they happen; the iterator ends when the backend closes."""
        ...


class BackendUnavailableError(ConfigError):
    """The backend cannot run here (no driver, no library); `reason` says why."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"GPU backend {backend!r} unavailable: {reason}", backend=backend)
        self.backend = backend
        self.reason = reason
