"""The live scheduler: one scheduling cycle at a time and the binding cycles it starts.

What it learns from the cluster is `watching`'s; what it tells users (Events, conditions,
PodGroup status) goes through `reporting`; the victims of a preemption are deleted by
`evictions`; `explain` answers why a pod waits.

One scheduling cycle at a time (like upstream, so every cycle sees the previous one's
reservation), many bindings in flight at once. A cycle:
1. pop the highest-priority pod; parse its request (an invalid request gets a Warning Event and
   waits for the pod to change);
2. `Framework.schedule` on the cache's snapshot: every decision (gangs, preemption, node
   reservations, constraints, the policy) is a plugin of the profile `build_profile` makes, the
   same one the simulator runs;
3. on a placement, assume it at once (the assumed-pod cache); Permit WAIT (a gang member) keeps
   it assumed until its gang is complete or its timer withdraws it; otherwise bind
   asynchronously: PreBind plugins, then the Bind plugin (`binding.KubeBinder`); on failure
   Unreserve, forget, and the pod backs off;
4. without one, act on the PostFilter's nomination: delete the victims it chose (`evictions`),
   or tell the pod a node is held for it; write the reason ("0/40 nodes are available: 32
   Insufficient whole GPUs, 8 GPU unhealthy.") into the PodScheduled condition and a
   FailedScheduling Event, and park the pod until an event can change the answer.

DRA (`settings.dra`, see `dra.live`): when on, the claim, slice and class informers sync before
the pods informer; a pod with `spec.resourceClaims` gets its claims' GPU request at the start
of its cycle (one dict lookup for pods without claims), waits without a cycle while a claim is
missing (the claim's event wakes it), and DynamicResources allocates at Reserve and writes the
claims at PreBind; a failed bind's Unreserve takes them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from alnair.common.informer import Informer
from alnair.common.kube import (
    NODES,
    PODDISRUPTIONBUDGETS,
    PODGROUPS,
    PODS,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
)
from alnair.common.tasks import in_flight, spawn
from alnair.scheduler.cluster.pods import (
    LivePod,
)
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.dra.claims import MalformedClaim
from alnair.scheduler.dra.live import DraSupport, unavailable
from alnair.scheduler.framework import Framework, ScheduleResult
from alnair.scheduler.framework.status import Code
from alnair.scheduler.live.binding import KubeBinder
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.live.evictions import Evictions
from alnair.scheduler.live.explain import explain_pod
from alnair.scheduler.live.gang import GangManager
from alnair.scheduler.live.queue import QueuedPod, SchedulingQueue
from alnair.scheduler.live.reporting import Reporter
from alnair.scheduler.live.watching import ClusterWatch
from alnair.scheduler.metrics import SchedulerMetrics
from alnair.scheduler.plugins.interference import ColocationBook
from alnair.scheduler.plugins.registry import ProfileOptions, build_profile
from alnair.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


def live_options(
    settings: SchedulerSettings,
    kube: KubeClient,
    fence: Callable[[], bool] = lambda: True,
    colocation: ColocationBook | None = None,
) -> ProfileOptions:
    """The live additions to every profile: utilization score, co-location interference (the
    predictor's table as `colocation` holds it), starvation guard, Binding (sent only while
    `fence` says this replica leads)."""
    return ProfileOptions(
        utilization_weight=settings.utilization_weight,
        colocation=colocation if colocation is not None else ColocationBook(),
        max_colocation_slowdown=settings.max_colocation_slowdown,
        max_sharing_util_pct=settings.max_sharing_util_pct,
        interference_weight=settings.interference_weight,
        starvation_after_s=settings.starvation_after_s,
        max_reserved_nodes=settings.max_reserved_nodes,
        bind=(KubeBinder(kube, settings.identity, fence),),
    )


class Scheduler(ClusterWatch):
    def __init__(
        self,
        kube: KubeClient,
        settings: SchedulerSettings,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or SchedulerMetrics()
        self.cache = SchedulerCache()
        self.health_listeners: list[Callable[[], None]] = []
        self.queue = SchedulingQueue(settings.initial_backoff_s, settings.max_backoff_s)
        self.gangs = GangManager(self.cache.gangs)
        self.cache.gangs.pending = self._pending_members
        self.cache.reservations.on_change = self._reservations_changed
        self.leading: Callable[[], bool] = lambda: True
        """Whether this replica leads (set to the leader elector's `leading`)."""
        self.colocation = ColocationBook()
        """The predictor's co-location table (`on_colocation` replaces it)."""
        self.options = live_options(settings, kube, self._leads, self.colocation)
        self.rng = np.random.default_rng(settings.seed)
        self.nodes = Informer(kube, NODES, name="nodes")
        self.pods = Informer(kube, PODS, name="pods")
        self.podgroups = Informer(kube, PODGROUPS, name="podgroups")
        self.pdbs = Informer(kube, PODDISRUPTIONBUDGETS, name="poddisruptionbudgets")
        self.budgets = self.cache.budgets
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        self.podgroups.add_handler(self._on_podgroup)
        self.pdbs.add_handler(self._on_pdb)
        self._bind_slots = asyncio.Semaphore(settings.max_binds_in_flight)
        self._binds: set[asyncio.Task[None]] = set()
        self.reporter = Reporter(kube, self.metrics)
        self.evictions = Evictions(
            kube, self.cache, self.queue, self.reporter, self.metrics,
            slots=self._bind_slots, in_flight=self._binds, pod_by_uid=self._pod_by_uid,
        )  # fmt: skip
        self._workload: deque[LivePod] = deque(maxlen=settings.workload_window)
        """The latest pod shapes, for the fragmentation-aware policies (bounded: the window)."""
        self._workload_seen = 0
        """Shapes ever added (the window forgets, the rebuild rule counts)."""
        self._workload_at_build = -1
        self._framework: Framework | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.last_result: dict[str, ScheduleResult] = {}
        self.scheduling = asyncio.Event()
        self.died = asyncio.Event()
        """Set when one of the scheduler's long-lived tasks died: the process must exit."""
        self.dra: DraSupport | None = None
        """ResourceClaim allocation, when `start_watching` turned it on (`settings.dra`)."""

    # --- lifecycle -----------------------------------------------------------------------

    def _on_death(self, _exc: BaseException) -> None:
        self.died.set()

    def informers(self) -> list[Informer]:
        """The caches scheduling decisions are made from (readiness checks each); pods last."""
        dra = self.dra.informers() if self.dra is not None else []
        return [self.nodes, self.podgroups, self.pdbs, *dra, self.pods]

    def _leads(self) -> bool:
        return self.leading()  # (read at each bind: the app sets `leading` after construction)

    async def start_watching(self) -> None:
        """Turn DRA on if wanted, start the informers and wait for the first complete view
        (the pods informer starts once the others have synced, so a bound pod's node and
        claims are known when it is counted)."""
        await self._enable_dra()
        *first, pods = self.informers()
        for inf in first:
            self._tasks.append(
                spawn(inf.run(), name=f"scheduler.informer.{inf.name}", on_death=self._on_death)
            )
        await asyncio.gather(*(inf.synced.wait() for inf in first))
        self._tasks.append(
            spawn(pods.run(), name=f"scheduler.informer.{pods.name}", on_death=self._on_death)
        )
        await pods.synced.wait()

    async def _enable_dra(self) -> None:
        if self.settings.dra == "off" or self.dra is not None:
            return
        if self.settings.dra == "auto":
            why = await unavailable(self.kube)
            if why:
                log.warning("scheduling without DRA", extra={"reason": why})
                return
        self.dra = DraSupport(
            self.kube,
            on_change=self.queue.move_all_to_active,
            on_health=self.on_gpu_health,
            on_node_gpus=self._on_slice_gpus,
        )
        self.cache.claims = self.dra
        self.options = self.dra.options(self.options)
        self._framework = None
        log.info("DRA scheduling on", extra={"mode": self.settings.dra})

    def _on_slice_gpus(self, node: str) -> None:
        assert self.dra is not None
        if self.cache.set_slice_gpus(node, self.dra.node_gpus(node)):
            self.queue.move_all_to_active()

    async def run(self) -> None:
        """Schedule until cancelled (call `start_watching` first; only the leader runs this)."""
        for i in range(self.settings.event_writers):
            writer = self.reporter.events.run()
            self._tasks.append(spawn(writer, name=f"scheduler.events.{i}", on_death=self._on_death))
        self.scheduling.set()
        try:
            while True:
                entry = await self.queue.pop()
                try:
                    await self.schedule_one(entry)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("scheduling cycle failed", extra={"pod": entry.key})
                    self.metrics.attempts.labels(result="error").inc()
                    self.queue.backoff(entry)
                # A cycle awaits nothing, nor does `pop` while pods wait: without this the
                # Bindings it started (and the watch events) would wait for the whole queue
                # to drain, and the first pod would bind only after the last was placed.
                await asyncio.sleep(0)
        finally:
            self.scheduling.clear()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in list(self._binds):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.reporter.drain()
        if self.dra is not None:
            await self.dra.drain()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # --- the cycle -----------------------------------------------------------------------

    def framework(self) -> Framework:
        n = self._workload_seen
        built = self._workload_at_build
        # A profile built before any pod shape was known (claim pods join the workload once
        # placed) is rebuilt as soon as one is.
        if self._framework is None or built <= 0 < n or n >= max(2 * built, 100 + built):
            recent = list(self._workload)
            self._framework = Framework(build_profile(self.settings.policy, recent, self.options))
            self.cache.drop_derived()
            self._workload_at_build = n
        return self._framework

    def _add_shape(self, req: LivePod) -> None:
        self._workload.append(req)
        self._workload_seen += 1

    async def schedule_one(self, entry: QueuedPod) -> None:
        req = entry.request
        if req is None:
            self.queue.unschedulable_now(entry)
            return
        if self.cache.is_placed(entry.uid):
            self.queue.release(entry)
            return
        if self.dra is not None and entry.obj["spec"].get("resourceClaims"):
            claimed = self._with_claims(entry, req)
            if claimed is None:
                return
            req = claimed
        t0 = time.perf_counter()
        framework = self.framework()
        result = framework.schedule(req, self.cache.snapshot(), self.rng)
        self.metrics.algorithm_seconds.observe(time.perf_counter() - t0)
        self.last_result[entry.uid] = result
        if result.placement is None:
            self.metrics.attempts.labels(result="unschedulable").inc()
            nomination = result.nomination
            if nomination is not None and (nomination.victims or nomination.awaiting):
                await self.evictions.preempt(entry, req, result, nomination)
                return
            self.cache.nominations.clear(entry.uid)  # no longer waits for any room
            self._unschedulable(entry, result.message())
            if nomination is not None:  # a node held for a starving pod
                self.reporter.event(entry.obj, "Normal", "NodeReserved", nomination.message)
                log.info("node reserved", extra={"pod": entry.key, "node": nomination.node_name})
            return
        self.cache.assume(req, result.placement)
        self.metrics.attempts.labels(result="scheduled").inc()
        if req is not entry.request and self.dra is not None and entry.uid not in self.dra.typical:
            self.dra.typical.add(entry.uid)  # a claim pod's shape joins once it is placed
            self._add_shape(req)
        if result.status.code is Code.WAIT and req.gang:
            self.gangs.add_waiting(entry, req, result)
            self.queue.release(entry)
            self._arm_gang_timer(req.gang, result.status.timeout_s)
            self._podgroup_status(req.gang)
            return
        if req.gang and req.gang in self.gangs.groups:
            for w_entry, w_req, w_result in self.gangs.take_waiting(req.gang):
                self.gangs.mark_bound(req.gang, w_req.key)
                self._start_bind(w_entry, w_req, w_result, framework)
            self.gangs.mark_bound(req.gang, req.key)
            self._start_bind(entry, req, result, framework)
            self._podgroup_status(req.gang)
            return
        self._start_bind(entry, req, result, framework)

    def _with_claims(self, entry: QueuedPod, req: LivePod) -> LivePod | None:
        """The pod's request with its claims' GPUs; None (and the pod parked with the reason)
        while a claim is missing or cannot be read."""
        assert self.dra is not None
        try:
            claimed, waiting = self.dra.resolve(entry.obj, req)
        except MalformedClaim as exc:
            self.metrics.attempts.labels(result="unschedulable").inc()
            self._unschedulable(entry, str(exc))
            return None
        if waiting:  # the claim's ADDED event wakes the pod (on_change)
            self.metrics.attempts.labels(result="unschedulable").inc()
            self._unschedulable(entry, waiting)
            return None
        return claimed

    def _pending_members(self, gang: str) -> list[PodRequest]:
        """The gang's members in the queue and not placed (what Coscheduling plans with)."""
        return [
            e.request
            for e in self.queue.pods.values()
            if e.request is not None and e.request.gang == gang and not self.cache.is_placed(e.uid)
        ]

    def _start_bind(
        self, entry: QueuedPod, req: LivePod, result: ScheduleResult, framework: Framework
    ) -> None:
        self.queue.binding(entry.uid)
        binding = self._bind(entry, req, result, framework)
        in_flight(binding, name=f"scheduler.bind.{entry.key}", into=self._binds)

    async def _bind(
        self, entry: QueuedPod, req: LivePod, result: ScheduleResult, framework: Framework
    ) -> None:
        """The binding cycle: PreBind plugins, then Bind; Unreserve and forget on failure."""
        placement = result.placement
        assert placement is not None
        async with self._bind_slots:
            self.metrics.binds_in_flight.inc()
            try:
                status = await framework.pre_bind(req, self.cache.snapshot(), result)
                if status.ok:
                    status = await framework.bind(req, result)
                if not status.ok:
                    raise RuntimeError(str(status))
            except (Conflict, NotFound) as exc:
                # Bound meanwhile (another replica before a failover) or deleted: the pod
                # watch shows the truth; our reservation must go.
                framework.unreserve(req, self.cache.snapshot(), result)
                self.cache.forget(entry.uid)
                self.queue.done(entry.uid)
                self.metrics.binds.labels(result="conflict").inc()
                log.info("bind refused", extra={"pod": entry.key, "error": str(exc)})
                return
            except Exception as exc:
                framework.unreserve(req, self.cache.snapshot(), result)
                self.cache.forget(entry.uid)
                if req.gang:
                    self.gangs.member_gone(req.gang, entry.uid)
                self.metrics.binds.labels(result="error").inc()
                log.warning("bind failed", extra={"pod": entry.key, "error": str(exc)})
                self.queue.move_all_to_active()
                self.queue.backoff(entry)
                return
            finally:
                self.metrics.binds_in_flight.dec()
        self.metrics.binds.labels(result="bound").inc()
        if self.dra is not None:
            self.dra.bound(entry.uid)
        if req.created:
            self.metrics.e2e_seconds.observe(max(time.time() - req.created, 0.0))
        self.queue.done(entry.uid)
        self.last_result.pop(entry.uid, None)
        gpus = placement.annotation_indices()
        where = placement.node_name + (f" GPUs {gpus}" if gpus else "")
        if req.is_fractional:
            where += f" ({placement.gpu_milli} milli-GPU)"
        self.reporter.event(
            entry.obj, "Normal", "Scheduled", f"Successfully assigned {entry.key} to {where}"
        )

    # --- failure paths -------------------------------------------------------------------

    def _reservations_changed(self, released: bool) -> None:
        self.metrics.reserved_nodes.set(len(self.cache.reservations))
        if released:  # pods kept off the node may fit now
            # A released hold frees no room: preemptors waiting for their victims stay parked
            # (the victims' deletions wake them), or a wave of preemptions would send every
            # one of them through a cycle each time one of them lands.
            book = self.cache.nominations
            self.queue.move_all_to_active(keep=book.by_pod.__contains__ if len(book) else None)

    def _unschedulable(self, entry: QueuedPod, message: str) -> None:
        if message != entry.last_message:
            entry.last_message = message
            self.reporter.event(entry.obj, "Warning", "FailedScheduling", message)
            self.reporter.condition(entry.obj, "Unschedulable", message)
        self.queue.unschedulable_now(entry)

    def _pod_by_uid(self, uid: str) -> Obj | None:
        bound = self.cache.bound.get(uid)
        if bound is not None:
            return bound[2]
        entry = self.queue.pods.get(uid)
        return entry.obj if entry else None

    def _arm_gang_timer(self, gang: str, timeout_s: float) -> None:
        st = self.gangs.st(gang)
        if st.timer is not None:
            return
        loop = asyncio.get_running_loop()
        st.timer = loop.call_later(timeout_s, self._gang_timeout, gang)

    def _gang_timeout(self, gang: str) -> None:
        st = self.gangs.st(gang)
        st.timer = None
        waiting = self.gangs.take_waiting(gang)
        if not waiting:
            return
        spec = self.gangs.groups.get(gang)
        need = spec.min_member if spec else 0
        message = (
            f"gang {gang} timed out: {len(waiting) + len(st.bound)}/{need} members could be "
            f"placed within {spec.timeout_s if spec else 0:g}s; released every reservation"
        )
        self.metrics.gang_timeouts.inc()
        framework = self.framework()
        for w_entry, w_req, w_result in waiting:
            framework.unreserve(w_req, self.cache.snapshot(), w_result)
            self.cache.forget(w_entry.uid)
            w_entry.last_message = message
            self.reporter.event(w_entry.obj, "Warning", "GangTimeout", message)
            self.reporter.condition(w_entry.obj, "Unschedulable", message)
            self.queue.backoff(w_entry)
        self.queue.move_all_to_active()
        self._podgroup_status(gang, message)

    def _podgroup_status(self, gang: str, message: str | None = None) -> None:
        if gang not in self.gangs.groups:
            return
        # The gang's own bound members (every bound pod with the group's label is marked so),
        # not every bound pod of the cluster: this runs at each member's cycle and event.
        running = 0
        for uid in self.gangs.st(gang).bound:
            known = self.cache.bound.get(uid)
            if known is not None:
                running += (known[2].get("status") or {}).get("phase") == "Running"
        status: dict[str, Any] = self.gangs.status_patch(gang, running)
        if message:
            status["message"] = message
        st = self.gangs.st(gang)
        if status == st.last_status:
            return
        st.last_status = dict(status)
        self.reporter.podgroup(gang, status)

    # --- explanation ---------------------------------------------------------------------

    def explain(self, namespace: str, name: str) -> dict[str, Any]:
        return explain_pod(self, namespace, name)
