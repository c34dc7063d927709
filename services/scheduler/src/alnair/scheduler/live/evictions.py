"""Preemption as the live scheduler acts on it: DefaultPreemption (or Coscheduling, for a gang)
chose the victims and the node; this deletes them and tells everyone concerned.

The cycle records the nomination (the victims' room is promised to the pod from then on:
`Nominations`), writes the Events, parks the pod and hands the nominatedNodeName patch and
the victims' deletes to a background task; the next cycle starts at once. The victims'
DELETED events wake the pod as its room frees. A failed delete ends the nomination, says so on
the preemptor and requeues it, so it never waits for a pod that stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from alnair.common.kube import PODS, KubeClient, NotFound, Obj
from alnair.common.tasks import in_flight
from alnair.scheduler.cluster.pods import LivePod
from alnair.scheduler.framework import Nomination, ScheduleResult
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.live.queue import QueuedPod, SchedulingQueue
from alnair.scheduler.live.reporting import Reporter
from alnair.scheduler.metrics import SchedulerMetrics

log = logging.getLogger(__name__)

Victims = list[tuple[str, Obj]]


class Evictions:
    def __init__(
        self,
        kube: KubeClient,
        cache: SchedulerCache,
        queue: SchedulingQueue,
        reporter: Reporter,
        metrics: SchedulerMetrics,
        *,
        slots: asyncio.Semaphore,
        in_flight: set[asyncio.Task[Any]],
        pod_by_uid: Callable[[str], Obj | None],
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.queue = queue
        self.reporter = reporter
        self.metrics = metrics
        self._slots = slots
        """Shared with the Bindings (`max_binds_in_flight`): when that many writes are in
        flight the cycle waits for one to end instead of piling more up."""
        self._in_flight = in_flight
        """Shared with the Bindings: `stop` waits for both."""
        self._pod_by_uid = pod_by_uid

    async def preempt(
        self, entry: QueuedPod, req: LivePod, result: ScheduleResult, nomination: Nomination
    ) -> None:
        """Act on the nomination without waiting for the API server."""
        nominations = self.cache.nominations
        if nomination.gang is not None:
            message = nomination.message
            by = f"gang {nomination.gang}"
            nominations.evicting(nomination.victims, nomination.gang)
        else:
            message = _preempting(result, nomination)
            by = entry.key
            nominations.nominate(req, nomination.node_name, nomination.victims)
        if message != entry.last_message:
            self.reporter.event(entry.obj, "Normal", "Preempting", message)
            if nomination.gang is None:
                self.reporter.condition(entry.obj, "Unschedulable", message)
        entry.last_message = message
        victims: Victims = []
        for uid in nomination.victims:
            victim = self._pod_by_uid(uid)
            if victim is None:  # gone meanwhile: nothing to delete, nothing in flight
                nominations.stays(uid)
                continue
            victims.append((uid, victim))
            self.reporter.event(
                victim, "Normal", "Preempted", f"Preempted by {by} (priority {req.priority})"
            )
        self.metrics.preemptions.inc(len(nomination.victims))
        # The victims' deletion events move this pod back to active.
        self.queue.unschedulable_now(entry)
        status = entry.obj.get("status") or {}
        patch = nomination.gang is None and status.get("nominatedNodeName") != nomination.node_name
        if not victims and not patch:
            return
        await self._slots.acquire()
        evicting = self._evict(entry, req, nomination, victims, patch)
        in_flight(evicting, name=f"scheduler.preempt.{entry.key}", into=self._in_flight)

    async def _evict(
        self,
        entry: QueuedPod,
        req: LivePod,
        nomination: Nomination,
        victims: Victims,
        patch: bool,
    ) -> None:
        """Every victim's DELETE and the nominatedNodeName patch at once (a 404 is success:
        the pod is gone)."""
        try:
            writes = [self._delete(uid, v, uid in nomination.graceful) for uid, v in victims]
            if patch:
                writes.append(self.reporter.nominated_node(entry.obj, nomination.node_name))
            outcomes = await asyncio.gather(*writes, return_exceptions=True)
            outcomes = outcomes[: len(victims)]
        finally:
            self._slots.release()
        failed = [
            (victims[i][1]["metadata"]["name"], exc)
            for i, exc in enumerate(outcomes)
            if isinstance(exc, BaseException)
        ]
        if failed:
            self._failed(entry, req, nomination, failed)

    async def _delete(self, uid: str, victim: Obj, graceful: bool) -> None:
        vm = victim["metadata"]
        try:
            # Elastic surplus gets its own grace period (SIGTERM, time to checkpoint).
            await self.kube.delete(
                PODS, vm["name"], vm["namespace"], grace_period_s=None if graceful else 0
            )
        except NotFound:
            return  # gone already: what the delete was for
        except BaseException:
            self.cache.nominations.stays(uid)
            raise

    def _failed(
        self,
        entry: QueuedPod,
        req: LivePod,
        nomination: Nomination,
        failed: list[tuple[str, BaseException]],
    ) -> None:
        names = ", ".join(f"{name} ({exc})" for name, exc in failed)
        message = (
            f"Preemption on {nomination.node_name or 'several nodes'} failed: could not delete "
            f"{names}; nomination cleared, the pod is scheduled again."
        )
        log.warning("preemption failed", extra={"pod": entry.key, "victims": names})
        self.metrics.preemption_failures.inc()
        waiting = [x.pod.key for x in self.cache.nominations.on_node(nomination.node_name)]
        self.cache.nominations.clear(req.key)
        self.cache.reservations.release(req.key)
        entry.last_message = message
        self.reporter.event(entry.obj, "Warning", "PreemptionFailed", message)
        if nomination.gang is None:
            self.reporter.background(self.reporter.nominated_node(entry.obj, None))
        self.queue.requeue(entry.uid)
        for uid in waiting:  # pods sharing the room that will not be freed: look again
            self.queue.requeue(uid)


def _preempting(result: ScheduleResult, nomination: Nomination) -> str:
    """What a single pod's preemption says to its user."""
    if not nomination.victims:  # the same words every cycle: one Event and condition
        return (
            f"Waiting for {len(nomination.awaiting)} pod(s) being preempted on "
            f"{nomination.node_name}."
        )
    against = (
        f", {nomination.budget_violations} against a PodDisruptionBudget."
        if nomination.budget_violations
        else "."
    )
    return (
        f"{result.message()} Preempting {len(nomination.victims)} lower-priority "
        f"pod(s) on {nomination.node_name}{against}"
    )
