"""Kueue's waitForPodsReady, in the dispatcher: an admitted workload whose pods are not all
ready within `pods_ready_timeout_s` gives its quota back and is queued again after a backoff of
one timeout; after `pods_ready_retries` such tries it stays out until someone removes the
annotation that counts them. A quota held by pods that cannot start (an image that does not
pull, a node that never comes) is the quota other teams wait for.

The count and the time it may be queued again are annotations on the workload
(`alnair.io/not-ready-evictions`, `alnair.io/requeue-at`), so a restarted dispatcher goes on
where the last one stopped; the end of a timeout or a backoff is a deadline the loop wakes for,
not a poll.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.parsing import (
    ANN_NOT_READY_EVICTIONS,
    ANN_PODS_READY_AT,
    ANN_REQUEUE_AT,
    Workload,
)
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.dispatcher.writing import WorkloadWriter


class PodsReady:
    """Takes back the admission of a workload whose pods did not all become ready in time."""

    def __init__(
        self,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics,
        writer: WorkloadWriter,
        remember: Callable[[Workload, Obj], None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.writer = writer
        self.remember = remember

    async def taken_back(
        self, wl: Workload, kind: WorkloadKind, admitted_at: float, now: float,
        deadlines: list[float],
    ) -> bool:  # fmt: skip
        """True when the workload's admission was taken back now. A workload still within its
        timeout adds the timeout's end to `deadlines`; one found ready is marked so, for good
        (serving workloads run for good: nothing records "was ready" on them)."""
        timeout = self.settings.pods_ready_timeout_s
        if not timeout or not kind.writable or ANN_PODS_READY_AT in wl.annotations:
            return False
        if kind.status_writes is not None:
            return False  # a Kueue Workload's pods are its job's, which says when they are ready
        if kind.ready(wl):
            updated = await self.writer.note(
                wl, {"metadata": {"annotations": {ANN_PODS_READY_AT: f"{now:.3f}"}}}
            )
            if updated is not None:
                self.remember(wl, updated)
            return False
        if now < admitted_at + timeout:
            deadlines.append(admitted_at + timeout)
            return False
        tries = _count(wl.annotations.get(ANN_NOT_READY_EVICTIONS)) + 1
        self.metrics.not_ready_evictions.inc()
        await self.writer.preempt(
            wl, f"its pods were not all ready {timeout:.0f} s after admission "
            f"(try {tries} of {self.settings.pods_ready_retries})", "its queue",
            cause="PodsNotReady",
            extra={ANN_NOT_READY_EVICTIONS: str(tries),
                   ANN_REQUEUE_AT: f"{now + timeout:.3f}"},
        )  # fmt: skip
        return True


def backing_off(wl: Workload, now: float, retries: int) -> tuple[str, float | None] | None:
    """Why a held workload is not queued yet after its pods were not ready (and until when),
    or None when it is queued."""
    tries = _count(wl.annotations.get(ANN_NOT_READY_EVICTIONS))
    if not tries:
        return None
    if tries >= retries:
        return (
            f"deactivated: its pods were not all ready after {tries} admissions; remove "
            f"the annotation {ANN_NOT_READY_EVICTIONS} to queue it again",
            None,
        )
    until = _float(wl.annotations.get(ANN_REQUEUE_AT))
    if until is not None and until > now:
        return f"backing off after its pods were not ready, until {until:.0f}", until
    return None


def _count(raw: str | None) -> int:
    """A count we wrote in an annotation (nonsense reads as none)."""
    try:
        return max(0, int(raw or 0))
    except ValueError:
        return 0


def _float(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
