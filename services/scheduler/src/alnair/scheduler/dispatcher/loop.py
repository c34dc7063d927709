"""The reconcile loop the dispatcher and the multi-cluster hub share.

A subclass lists its informers in `informers` and implements `reconcile`; its informer
handlers call `wake`. One guarded task runs `run`: it waits for a wake-up, reconciles once,
and folds wake-ups that arrived meanwhile into the next pass, so a burst of events costs one
reconcile and nothing runs on a timer. An unreachable API server makes it wait the server's
delay and try again; any other error ends the task, and the service with it (crash-only).

With leader election, `leading` is the elector's: a replica that no longer leads reconciles
no more, and `fence` (called right before each decision's write) refuses to write one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from alnair.common.informer import Informer
from alnair.common.kube import Unavailable
from alnair.common.leader import NotLeading
from alnair.common.tasks import spawn

log = logging.getLogger(__name__)


class ReconcileLoop:
    """Informers in, one reconcile per burst of wake-ups out."""

    name = "dispatcher"

    def __init__(self) -> None:
        self.informers: Sequence[Informer] = ()
        self.reconciles = 0
        self.reconciled = 0
        """Reconciles that ended (a test's proof that the state it set up was considered)."""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.watch_died = asyncio.Event()
        """Set when an informer's task died (raised, or returned other than for an optional
        resource the API server does not serve): the service then exits (crash-only)."""
        self.leading: Callable[[], bool] = lambda: True
        self.leader: Callable[[], str | None] = lambda: None
        """Who leads, as this replica last saw the Lease (for followers' answers)."""

    def follower_problem(self) -> str | None:
        """Why this replica cannot explain decisions (it is a follower: it makes none), or None."""
        if self.leading():
            return None
        who = self.leader()
        if who:
            return f"this replica does not decide: ask the leader, {who}"
        return "this replica does not decide, and it knows of no leader yet"

    def fence(self, what: str) -> None:
        """Raise `NotLeading` unless this replica leads now (before a decision is written)."""
        if not self.leading():
            raise NotLeading(f"not the leader any more: {what} not written")

    def wake(self, *_: object) -> None:
        """Ask for a reconcile (an informer handler, a predictor retrain, a test)."""
        self._wake.set()

    async def reconcile(self) -> None:
        raise NotImplementedError

    async def start_watching(self) -> None:
        for informer in self.informers:
            self._tasks.append(
                spawn(
                    informer.run(),
                    name=f"{self.name}.informer.{informer.name}",
                    on_death=lambda _exc: self.watch_died.set(),
                    ends=lambda i=informer: i.unserved,  # type: ignore[misc]
                )
            )
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def run(self) -> None:
        """Reconcile on every wake-up, forever (run as a guarded task)."""
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.fence("reconcile")
            try:
                await self.reconcile()
                self.reconciled += 1
            except Unavailable as exc:
                log.warning(
                    "API server unavailable; retrying", extra={"loop": self.name, "error": str(exc)}
                )
                await asyncio.sleep(exc.delay_s)
                self._wake.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
