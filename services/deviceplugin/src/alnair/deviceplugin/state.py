"""The plugin's one owner of node state: the GPU inventory and the GPUs' health.

The inventory watcher and the health subscriber write here; ListAndWatch streams and
Allocate read immutable snapshots. Every change bumps a version and wakes the readers, so a
stream sends a new device list the moment a GPU's health flips, and never on a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory, GpuLink, now
from alnair.deviceplugin.devices import Device, build_devices
from alnair.deviceplugin.health import HealthBook, HealthStatus, Outcome


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    gpus: tuple[GpuDevice, ...] = ()
    topology: tuple[tuple[GpuLink, ...], ...] = ()
    health: HealthBook = field(default_factory=lambda: HealthBook(""))
    version: int = 0

    def devices(self, resource: str) -> list[Device]:
        flags = [self.health.healthy(g.uuid) for g in self.gpus]
        return build_devices(resource, self.gpus, flags)

    def gpu(self, index: int) -> GpuDevice | None:
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def uuid_to_index(self) -> dict[str, int]:
        return {g.uuid: g.index for g in self.gpus}


class NodeDevices:
    """Owner of the node's snapshot; the only writer."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._snap = NodeSnapshot(node, health=HealthBook(node))
        self._wake = asyncio.Event()

    @property
    def snapshot(self) -> NodeSnapshot:
        return self._snap

    def _publish(self, snap: NodeSnapshot) -> None:
        self._snap = snap
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def set_inventory(self, inventory: GpuInventory) -> list[HealthStatus]:
        """Adopt a new inventory (GPUs, topology, and its health flags as observations)."""
        snap = self._snap
        book, statuses = snap.health.apply_inventory(inventory.gpus, inventory.ts)
        self._publish(
            NodeSnapshot(
                self.node,
                tuple(sorted(inventory.gpus, key=lambda g: g.index)),
                tuple(tuple(row) for row in inventory.topology),
                book,
                snap.version + 1,
            )
        )
        return statuses

    def set_gpus(self, gpus: Sequence[GpuDevice], observed: datetime | None = None) -> None:
        """Adopt GPUs without topology (a node run from a static list)."""
        self.set_inventory(GpuInventory(node=self.node, gpus=list(gpus), ts=observed or now()))

    def apply_health(self, event: GpuHealthChanged) -> HealthStatus:
        snap = self._snap
        book, status = snap.health.apply(event)
        if status.outcome in {Outcome.CHANGED, Outcome.UNCHANGED}:
            self._publish(NodeSnapshot(snap.node, snap.gpus, snap.topology, book, snap.version + 1))
        return status

    async def changes(self) -> AsyncIterator[NodeSnapshot]:
        """The current snapshot, then every later one (intermediate ones may be skipped)."""
        seen = -1
        while True:
            wake = self._wake
            snap = self._snap
            if snap.version != seen:
                seen = snap.version
                yield snap
                continue
            await wake.wait()
