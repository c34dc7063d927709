"""Where users look: the scheduler's Events, the pods' PodScheduled condition and nominated
node, and the PodGroups' status.

Every write happens in the background: a scheduling cycle never waits on the API server to
tell a user something, and a failed write is logged, never raised into the cycle (the next
decision writes again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.common.kube import PODGROUPS, PODS, ApiError, KubeClient, Obj
from alnair.common.recorder import EventRecorder, EventType
from alnair.common.tasks import in_flight
from alnair.scheduler.metrics import SchedulerMetrics

log = logging.getLogger(__name__)


class Reporter:
    def __init__(self, kube: KubeClient, metrics: SchedulerMetrics) -> None:
        self.kube = kube
        self.events = EventRecorder(kube, "alnair-scheduler", on_drop=metrics.events_dropped.inc)
        self._writes: set[asyncio.Task[None]] = set()
        self._podgroups: dict[str, dict[str, Any]] = {}
        """The latest status to write, per gang with a writer running."""

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        self.events.record(obj, reason, message, type_=type_)

    def condition(self, obj: Obj, reason: str, message: str) -> None:
        """PodScheduled=False with `reason` and `message` on the pod."""
        meta = obj["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        patch = {"status": {"conditions": [condition]}}
        self.background(
            self.kube.patch(
                PODS, meta["name"], patch, meta["namespace"], patch_type="strategic", sub="status"
            )
        )

    async def nominated_node(self, obj: Obj, node: str | None) -> None:
        """Show the nominated node on the pod, or clear it (None). For users only: nothing
        waits on it, so a failure is logged at debug level."""
        meta = obj["metadata"]
        try:
            await self.kube.patch(
                PODS,
                meta["name"],
                {"status": {"nominatedNodeName": node}},
                meta["namespace"],
                sub="status",
            )
        except Exception as exc:
            log.debug("nominatedNodeName not written", extra={"error": repr(exc)})

    def podgroup(self, gang: str, status: dict[str, Any]) -> None:
        """Write `status` to the gang's ("namespace/name") PodGroup. One writer per gang,
        always sending the latest status: concurrent patches could land out of order and
        leave an older phase behind."""
        first = gang not in self._podgroups
        self._podgroups[gang] = status
        if first:
            self.background(self._write_podgroup(gang))

    async def _write_podgroup(self, gang: str) -> None:
        ns, name = gang.split("/", 1)
        try:
            while gang in self._podgroups:
                status = self._podgroups[gang]
                await self.kube.patch(PODGROUPS, name, {"status": status}, ns, sub="status")
                if self._podgroups.get(gang) is status:
                    del self._podgroups[gang]
        finally:
            self._podgroups.pop(gang, None)

    def background(self, write: Coroutine[Any, Any, Any]) -> None:
        """Run `write` without waiting for it; its failure is logged."""

        async def guarded() -> None:
            try:
                await write
            except (ApiError, InvalidValueError) as exc:
                log.debug("status write failed", extra={"error": str(exc)})
            except Exception as exc:
                log.warning("status write failed", extra={"error": repr(exc)})

        in_flight(guarded(), name="scheduler.status-write", into=self._writes)

    async def drain(self) -> None:
        """Wait for the writes in flight (at stop)."""
        for t in list(self._writes):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
