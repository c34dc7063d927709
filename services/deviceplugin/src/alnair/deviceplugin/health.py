"""GPU health as the device plugin tracks it: a pure state machine over health observations.

Observations come from two places: the profiler's `GpuHealthChanged` events (XID, ECC, lost
GPU, and recovery) and the `healthy` flags in each `GpuInventory` snapshot. Both carry the time
they were observed, and the newer observation of a GPU always wins, whatever order they arrive
in (JetStream redelivers; the inventory KV and the health stream are not ordered with each
other). That is what keeps a device from staying Unhealthy forever when its "healthy again"
event raced with an older inventory, the failure peers' plugins showed. Nothing here does I/O:
`apply` returns the next book and a status saying what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType

from alnair.common.events import GpuDevice, GpuHealthChanged


class Outcome(StrEnum):
    CHANGED = "changed"
    """The GPU's health flipped; ListAndWatch must send a new list."""
    UNCHANGED = "unchanged"
    """Newer observation, same health (reason or time updated)."""
    STALE = "stale"
    """Older than what the book already holds: ignored."""
    OTHER_NODE = "other-node"
    """An event about another node's GPU: ignored."""


@dataclass(frozen=True)
class GpuHealth:
    healthy: bool
    observed: datetime
    reason: str = ""
    xid: int | None = None


@dataclass(frozen=True)
class HealthStatus:
    outcome: Outcome
    gpu_uuid: str
    healthy: bool
    reason: str = ""


@dataclass(frozen=True)
class HealthBook:
    """Health of one node's GPUs by UUID; GPUs never observed count as healthy."""

    node: str
    gpus: Mapping[str, GpuHealth] = field(default_factory=lambda: MappingProxyType({}))

    def healthy(self, uuid: str) -> bool:
        state = self.gpus.get(uuid)
        return True if state is None else state.healthy

    def get(self, uuid: str) -> GpuHealth | None:
        return self.gpus.get(uuid)

    def observe(
        self, uuid: str, healthy: bool, observed: datetime, reason: str = "", xid: int | None = None
    ) -> tuple[HealthBook, HealthStatus]:
        current = self.gpus.get(uuid)
        if current is not None and observed < current.observed:
            return self, HealthStatus(Outcome.STALE, uuid, current.healthy, current.reason)
        before = True if current is None else current.healthy
        changed = before != healthy
        gpus = dict(self.gpus)
        gpus[uuid] = GpuHealth(healthy, observed, reason, xid)
        book = HealthBook(self.node, MappingProxyType(gpus))
        outcome = Outcome.CHANGED if changed else Outcome.UNCHANGED
        return book, HealthStatus(outcome, uuid, healthy, reason)

    def apply(self, event: GpuHealthChanged) -> tuple[HealthBook, HealthStatus]:
        """Fold one health event in."""
        if event.node != self.node:
            return self, HealthStatus(Outcome.OTHER_NODE, event.gpu_uuid, event.healthy)
        return self.observe(event.gpu_uuid, event.healthy, event.ts, event.reason, event.xid)

    def apply_inventory(
        self, gpus: Sequence[GpuDevice], observed: datetime
    ) -> tuple[HealthBook, list[HealthStatus]]:
        """Fold the health flags of an inventory snapshot taken at `observed` in."""
        book = self
        statuses: list[HealthStatus] = []
        for gpu in gpus:
            reason = "" if gpu.healthy else "reported unhealthy in the GPU inventory"
            book, status = book.observe(gpu.uuid, gpu.healthy, observed, reason)
            statuses.append(status)
        return book, statuses
