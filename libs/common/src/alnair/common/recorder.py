"""Kubernetes Events about the objects a service decides on, the one way every service writes
them (`kubectl describe` is where users look first).

An Event is an explanation, never a step of the decision: writing one never raises into the
caller. One the API server refuses, or that cannot reach it, is logged with its reason and
counted; the decision it explains stands. Two ways to write, the same body:

- `post`: awaited, for a reconciler that writes a few Events in order with its decisions
  (the dispatcher, the elastic controller);
- `record`: queued and written by `run` off the caller's path, for a hot loop that must not
  wait on the API server (the binder, hundreds of pods a second); a full queue drops the
  Event and counts it rather than slowing the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from alnair.common.kube import KubeClient, Obj

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]


class EventRecorder:
    """Events from one component (`source.component` and `reportingComponent` on each)."""

    def __init__(
        self,
        kube: KubeClient,
        component: str,
        *,
        capacity: int = 10_000,
        on_drop: Callable[[], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.component = component
        self._queue: asyncio.Queue[tuple[Obj, str, str, EventType]] = asyncio.Queue(capacity)
        self._on_drop = on_drop
        self._on_failure = on_failure

    async def post(
        self, obj: Obj, reason: str, message: str, *, type_: EventType = "Normal"
    ) -> bool:
        """Write an Event about `obj` now; whether the API server took it."""
        try:
            await self.kube.event(
                obj, reason=reason, message=message, type_=type_, component=self.component
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an explanation never fails its caller
            if self._on_failure is not None:
                self._on_failure()
            meta = obj.get("metadata") or {}
            log.warning(
                "event not written",
                extra={
                    "object": f"{meta.get('namespace')}/{meta.get('name')}",
                    "reason": reason,
                    "error": repr(exc),
                },
            )
            return False
        return True

    def record(self, obj: Obj, reason: str, message: str, *, type_: EventType = "Normal") -> None:
        """Queue an Event about `obj` for `run` to write; dropped (and counted) when full."""
        try:
            self._queue.put_nowait((obj, reason, message, type_))
        except asyncio.QueueFull:
            if self._on_drop is not None:
                self._on_drop()

    def pending(self) -> int:
        """Events queued and not yet written."""
        return self._queue.qsize()

    async def run(self) -> None:
        """Write queued Events until cancelled (several may run side by side)."""
        while True:
            obj, reason, message, type_ = await self._queue.get()
            await self.post(obj, reason, message, type_=type_)
