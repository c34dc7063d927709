"""The live scheduler loop: watch, queue, place through the framework, bind, explain.

One scheduling cycle at a time (like upstream, so every cycle sees the previous one's
reservation), many bindings in flight at once. A cycle:
1. pop the highest-priority pod; parse its request (an invalid request gets a Warning Event and
   waits for the pod to change);
2. gang pods: PreFilter the whole gang (see `gang`);
3. `Framework.schedule` on the cache's snapshot; on success assume the placement at once (the
   assumed-pod cache), then Permit: a gang member waits for its gang, others bind right away;
4. bind asynchronously through the Binding subresource, with the chosen GPU indices and share
   as annotations written in the same request; on failure the reservation is forgotten and the
   pod backs off;
5. on failure, PostFilter: preempt lower-priority pods when that makes room; otherwise write the
   reason ("0/40 nodes are available: 32 Insufficient whole GPUs, 8 GPU unhealthy.") into the
   PodScheduled condition and a FailedScheduling Event, and park the pod until an event can
   change the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    NODES,
    PODDISRUPTIONBUDGETS,
    PODGROUPS,
    PODS,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
)
from alnair.common.tasks import spawn
from alnair.common.topology import Topology
from alnair.scheduler.framework import (
    FilterPlugin,
    Framework,
    Profile,
    ScheduleResult,
    WeightedScore,
)
from alnair.scheduler.framework.status import Code
from alnair.scheduler.live.budgets import DisruptionBudgets
from alnair.scheduler.live.cache import TOO_MANY_PODS, LiveSnapshot, SchedulerCache
from alnair.scheduler.live.gang import GangManager, clone_member
from alnair.scheduler.live.plugins import (
    GpuHealth,
    GpuUtilization,
    InterPodAffinity,
    NodeAffinity,
    NodeReservation,
    NodeResourcesExtra,
    NodeSelector,
    PodTopologySpread,
    PreferredInterPodAffinity,
    PreferredNodeAffinity,
    TaintToleration,
    TopologyAwareGpus,
)
from alnair.scheduler.live.pods import (
    InvalidPodError,
    LivePod,
    is_terminal,
    parse_pod,
    wants_us,
)
from alnair.scheduler.live.preemption import select_victims
from alnair.scheduler.live.queue import QueuedPod, SchedulingQueue
from alnair.scheduler.live.reservations import Holder, closest_node
from alnair.scheduler.metrics import SchedulerMetrics
from alnair.scheduler.plugins.fit import GpuFit
from alnair.scheduler.plugins.registry import policy as find_policy
from alnair.scheduler.settings import SchedulerSettings
from alnair.scheduler.snapshot import ClusterSnapshot, Placement

log = logging.getLogger(__name__)
EventType = Literal["Normal", "Warning"]


def for_lack_of_room(why: str) -> bool:
    """A filter reason that evicting pods can cure: the pod count, or any "Insufficient ..."
    (cpu, memory, whole GPUs, GPU share, or another resource)."""
    return why == TOO_MANY_PODS or why.startswith("Insufficient ")


def live_profile(policy_name: str, workload: list[LivePod], util_weight: float) -> Profile:
    """The policy's profile with the live-only filters and the utilization score added."""
    base = find_policy(policy_name).build(workload)
    filters: list[FilterPlugin] = [
        TaintToleration(),
        NodeSelector(),
        NodeAffinity(),
        InterPodAffinity(),
        PodTopologySpread(),
        NodeReservation(),
    ]
    for f in base.filter:
        if isinstance(f, GpuFit):
            filters.append(GpuHealth())
        filters.append(f)
    filters.append(NodeResourcesExtra())
    scores = [
        *base.score,
        WeightedScore(PreferredNodeAffinity()),
        WeightedScore(PreferredInterPodAffinity()),
        WeightedScore(PodTopologySpread()),
    ]
    if util_weight > 0:
        scores.append(WeightedScore(GpuUtilization(), util_weight))
    return replace(
        base,
        name=f"live-{base.name}",
        filter=tuple(filters),
        score=tuple(scores),
        gpu_selector=TopologyAwareGpus(base.gpu_selector),
    )


def _scheduling_relevant_change(old: Obj | None, new: Obj) -> bool:
    """Did anything but status and bookkeeping change (upstream's isPodUpdated)?"""
    if old is None:
        return True
    if old.get("spec") != new.get("spec"):
        return True
    om, nm = old["metadata"], new["metadata"]
    return bool(
        om.get("labels") != nm.get("labels") or om.get("annotations") != nm.get("annotations")
    )


class Scheduler:
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
        self.queue = SchedulingQueue(settings.initial_backoff_s, settings.max_backoff_s)
        self.gangs = GangManager()
        self.rng = np.random.default_rng(settings.seed)
        self.nodes = Informer(kube, NODES, name="nodes")
        self.pods = Informer(kube, PODS, name="pods")
        self.podgroups = Informer(kube, PODGROUPS, name="podgroups")
        self.pdbs = Informer(kube, PODDISRUPTIONBUDGETS, name="poddisruptionbudgets")
        self.budgets = DisruptionBudgets()
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        self.podgroups.add_handler(self._on_podgroup)
        self.pdbs.add_handler(self._on_pdb)
        self._bind_slots = asyncio.Semaphore(settings.max_binds_in_flight)
        self._binds: set[asyncio.Task[None]] = set()
        self._events: asyncio.Queue[tuple[Obj, EventType, str, str]] = asyncio.Queue(10000)
        self._workload: list[LivePod] = []
        self._workload_at_build = -1
        self._framework: Framework | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.last_result: dict[str, ScheduleResult] = {}
        self._pg_pending: dict[str, dict[str, Any]] = {}
        self.scheduling = asyncio.Event()
        self.died = asyncio.Event()
        """Set when one of the scheduler's long-lived tasks died: the process must exit."""

    # --- lifecycle -----------------------------------------------------------------------

    def _on_death(self, _exc: BaseException) -> None:
        self.died.set()

    def informers(self) -> list[Informer]:
        """The caches scheduling decisions are made from (readiness checks each)."""
        return [self.nodes, self.podgroups, self.pdbs, self.pods]

    async def start_watching(self) -> None:
        """Start the informers and wait for the first complete view."""
        for inf in self.informers():
            self._tasks.append(
                spawn(inf.run(), name=f"scheduler.informer.{inf.name}", on_death=self._on_death)
            )
        await asyncio.gather(
            self.nodes.synced.wait(), self.podgroups.synced.wait(), self.pdbs.synced.wait()
        )
        await self.pods.synced.wait()

    async def run(self) -> None:
        """Schedule until cancelled (call `start_watching` first; only the leader runs this)."""
        for i in range(self.settings.event_writers):
            self._tasks.append(
                spawn(self._event_writer(), name=f"scheduler.events.{i}", on_death=self._on_death)
            )
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
        finally:
            self.scheduling.clear()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in list(self._binds):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # --- watch handlers ------------------------------------------------------------------

    def _on_node(self, event: WatchEvent, node: Obj, old: Obj | None) -> None:
        if event is WatchEvent.DELETED:
            self.cache.delete_node(node["metadata"]["name"])
            if self.cache.reservations.drop_node(node["metadata"]["name"]):
                self._report_reservations()
            return
        if self.cache.upsert_node(node):
            self.queue.move_all_to_active()

    def _on_podgroup(self, event: WatchEvent, pg: Obj, old: Obj | None) -> None:
        key = f"{pg['metadata']['namespace']}/{pg['metadata']['name']}"
        if event is WatchEvent.DELETED:
            self.gangs.delete_group(key)
            self.queue.gang_ts.pop(key, None)
            return
        self.gangs.upsert_group(pg)
        ts = pg["metadata"].get("creationTimestamp")
        if ts:
            from alnair.scheduler.live.pods import _ts

            self.queue.gang_ts[key] = _ts(ts)
        if old is None:
            self.queue.move_all_to_active()

    def _on_pdb(self, event: WatchEvent, pdb: Obj, old: Obj | None) -> None:
        if event is WatchEvent.DELETED:
            self.budgets.delete(pdb)
        else:
            self.budgets.upsert(pdb)

    def _on_pod(self, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        gang = (meta.get("labels") or {}).get(r.POD_GROUP_LABEL)
        gang_key = f"{meta.get('namespace')}/{gang}" if gang else None
        if event is WatchEvent.DELETED or is_terminal(pod):
            freed = self.cache.remove_pod(uid)
            self.queue.remove(uid)
            self.last_result.pop(uid, None)  # bounded: nothing kept for pods that are gone
            self._release_reservation(uid)
            if gang_key:
                self.gangs.member_gone(gang_key, uid)
                self._podgroup_status(gang_key)
            if freed:
                self.queue.move_all_to_active()
            return
        if spec.get("nodeName"):
            self.cache.add_bound(pod)
            labels = meta.get("labels") or {}
            if (
                old is None
                or not (old.get("spec") or {}).get("nodeName")
                or (old["metadata"].get("labels") or {}) != labels
            ):
                namespace = meta.get("namespace", "default")
                self.queue.move_to_active(lambda req: req.counts_pod(namespace, labels))
            if uid in self.queue.pods:
                self.queue.done(uid)
            if self.cache.reservations.node_of(uid) is not None:  # bound by another replica
                self._release_reservation(uid)
            if gang_key:
                self.gangs.mark_bound(gang_key, uid)
                if old is None or (old.get("status") or {}).get("phase") != (
                    pod.get("status") or {}
                ).get("phase"):
                    self._podgroup_status(gang_key)
            return
        if not wants_us(pod, self.settings.scheduler_name) or meta.get("deletionTimestamp"):
            return
        if spec.get("schedulingGates"):
            # Gated (a queueing controller such as Kueue holds it; the API server has set
            # PodScheduled=False/SchedulingGated): not ours to place until every gate is gone,
            # which arrives as an update of the spec.
            gates = [g.get("name", "") for g in spec["schedulingGates"]]
            self.queue.hold_gated(uid, pod, gates)
            return
        try:
            req: LivePod | None = parse_pod(pod, self.cache.gpu_memory_table())
        except InvalidPodError as exc:
            req = None
            entry = self.queue.pods.get(uid)
            if entry is None or entry.last_message != str(exc):
                self._emit(pod, "Warning", "InvalidRequest", str(exc))
                self._condition(pod, "InvalidRequest", str(exc))
            self.queue.remove(uid)
            self.queue.pods[uid] = QueuedPod(uid=uid, obj=pod, request=None, last_message=str(exc))
            self.queue.unschedulable.add(uid)
            return
        if old is None and req is not None:
            self._workload.append(req)
        self.queue.add(uid, pod, req, changed=_scheduling_relevant_change(old, pod))

    def on_gpu_health(self, node: str, gpu: int, healthy: bool) -> None:
        if self.cache.set_gpu_health(node, gpu, healthy):
            self.queue.move_all_to_active()

    def on_gpu_util(self, node: str, gpu: int, pct: float) -> None:
        self.cache.set_gpu_util(node, gpu, pct)

    def on_inventory(self, node: str, topology: Topology) -> None:
        """A node's GPU link matrix from the profiler (an empty one forgets it)."""
        if topology:
            self.cache.topology[node] = topology
        else:
            self.cache.topology.pop(node, None)

    def on_job_finished(self) -> None:
        self.queue.move_all_to_active()

    # --- the cycle -----------------------------------------------------------------------

    def framework(self) -> Framework:
        n = len(self._workload)
        if self._framework is None or n >= max(
            2 * self._workload_at_build, 100 + self._workload_at_build
        ):
            recent = self._workload[-self.settings.workload_window :]
            self._framework = Framework(
                live_profile(self.settings.policy, recent, self.settings.utilization_weight)
            )
            self._workload_at_build = n
        return self._framework

    async def schedule_one(self, entry: QueuedPod) -> None:
        req = entry.request
        if req is None:
            self.queue.unschedulable_now(entry)
            return
        if self.cache.is_placed(entry.uid):
            self.queue.release(entry)
            return
        t0 = time.perf_counter()
        framework = self.framework()
        snapshot = self.cache.snapshot()
        if req.gang:
            st = self.gangs.st(req.gang)
            siblings = [
                e.request
                for e in self.queue.pods.values()
                if e.request is not None
                and e.request.gang == req.gang
                and e.uid not in st.waiting
                and not self.cache.is_placed(e.uid)
            ]
            status = self.gangs.check(req, siblings, snapshot, framework, self.rng)
            if not status.ok:
                self.metrics.attempts.labels(result="unschedulable").inc()
                # PostFilter for a gang: each member that finds no room alone preempts for
                # itself (surplus elastic workers first); the gang binds once all have room.
                if self._gang_could_fit(req, snapshot) and await self._try_preempt_gang(
                    entry, req, siblings, snapshot, framework
                ):
                    return
                self._unschedulable(entry, status.reason)
                self._maybe_reserve(entry, req, snapshot, framework)
                return
        result = framework.schedule(req, snapshot, self.rng)
        self.metrics.algorithm_seconds.observe(time.perf_counter() - t0)
        self.last_result[entry.uid] = result
        if result.placement is None:
            self.metrics.attempts.labels(result="unschedulable").inc()
            if await self._try_preempt(entry, req, result):
                return
            self._unschedulable(entry, result.message())
            self._maybe_reserve(entry, req, snapshot, framework)
            return
        self.cache.assume(req, result.placement)
        self._release_reservation(entry.uid)
        self.metrics.attempts.labels(result="scheduled").inc()
        if req.gang and req.gang in self.gangs.groups:
            if not self.gangs.add_waiting(entry, req, result.placement):
                self.queue.release(entry)
                self._arm_gang_timer(req.gang)
                self._podgroup_status(req.gang)
                return
            for w_entry, w_req, w_place in self.gangs.take_waiting(req.gang):
                self.gangs.mark_bound(req.gang, w_req.key)
                self._start_bind(w_entry, w_req, w_place)
            self._podgroup_status(req.gang)
            return
        self._start_bind(entry, req, result.placement)

    def _start_bind(self, entry: QueuedPod, req: LivePod, placement: Placement) -> None:
        self.queue.in_flight.add(entry.uid)
        task = asyncio.create_task(self._bind(entry, req, placement))
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _bind(self, entry: QueuedPod, req: LivePod, placement: Placement) -> None:
        meta = entry.obj["metadata"]
        annotations = {
            r.ANN_GPU_INDICES: placement.annotation_indices(),
            r.ANN_GPU_MILLI: str(placement.gpu_milli if req.num_gpu else 0),
            r.ANN_SCHEDULED_BY: self.settings.identity,
        }
        async with self._bind_slots:
            self.metrics.binds_in_flight.inc()
            try:
                await self.kube.bind(
                    meta["namespace"],
                    meta["name"],
                    placement.node_name,
                    uid=entry.uid,
                    annotations=annotations,
                )
            except (Conflict, NotFound) as exc:
                # Bound meanwhile (another replica before a failover) or deleted: the pod
                # watch shows the truth; our reservation must go.
                self.cache.forget(entry.uid)
                self.queue.done(entry.uid)
                self.metrics.binds.labels(result="conflict").inc()
                log.info("bind refused", extra={"pod": entry.key, "error": str(exc)})
                return
            except Exception as exc:
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
        if req.created:
            self.metrics.e2e_seconds.observe(max(time.time() - req.created, 0.0))
        self.queue.done(entry.uid)
        self.last_result.pop(entry.uid, None)
        gpus = placement.annotation_indices()
        where = placement.node_name + (f" GPUs {gpus}" if gpus else "")
        if req.is_fractional:
            where += f" ({placement.gpu_milli} milli-GPU)"
        self._emit(
            entry.obj, "Normal", "Scheduled", f"Successfully assigned {entry.key} to {where}"
        )

    # --- failure paths -------------------------------------------------------------------

    def _maybe_reserve(
        self, entry: QueuedPod, req: LivePod, snapshot: LiveSnapshot, framework: Framework
    ) -> None:
        """Reserve a node for a pod that has waited past `starvation_after_s` (see
        `reservations`)."""
        after = self.settings.starvation_after_s
        waited = time.time() - req.created if req.created else 0.0
        reservations = self.cache.reservations
        if (
            after <= 0
            or waited < after
            or reservations.node_of(entry.uid) is not None
            or len(reservations) >= self.settings.max_reserved_nodes
        ):
            return
        explained = framework.schedule(req, snapshot, self.rng, explain=True)
        if explained.placement is not None:  # fits alone; its gang does not yet
            node: int | None = explained.placement.node
        else:
            candidates = [n for n, why in explained.node_reasons.items() if for_lack_of_room(why)]
            node = closest_node(req, snapshot, candidates)
        if node is None:
            return
        name = snapshot.names[node]
        taken = reservations.reserve(name, self._holder(entry, req))
        if taken is False:
            return
        if isinstance(taken, Holder):
            log.info("reservation taken over", extra={"node": name, "from": taken.key})
        self._report_reservations()
        self._emit(
            entry.obj,
            "Normal",
            "NodeReserved",
            f"Pending for {waited:.0f} s: node {name} is reserved for this pod; pods that do "
            "not outrank it stay off the node until this pod is placed.",
        )
        log.info("node reserved", extra={"pod": entry.key, "node": name, "waited_s": waited})

    @staticmethod
    def _holder(entry: QueuedPod, req: LivePod) -> Holder:
        return Holder(
            uid=entry.uid,
            key=entry.key,
            priority=req.priority,
            created=req.created,
            gang=req.gang,
            since=time.time(),
        )

    def _hold_for_preemptor(self, entry: QueuedPod, req: LivePod, node: str) -> None:
        """Keep the room being freed for the preemptor: pods that do not outrank it stay off
        the node until it lands (upstream keeps a nominated pod's room the same way)."""
        reservations = self.cache.reservations
        if reservations.node_of(entry.uid) not in (None, node):
            reservations.release(entry.uid)
        if reservations.node_of(entry.uid) is None:
            reservations.reserve(node, self._holder(entry, req))
        self._report_reservations()

    def _report_reservations(self) -> None:
        self.metrics.reserved_nodes.set(len(self.cache.reservations))

    def _release_reservation(self, uid: str) -> None:
        if self.cache.reservations.release(uid) is not None:
            self._report_reservations()
            self.queue.move_all_to_active()

    def _unschedulable(self, entry: QueuedPod, message: str) -> None:
        if message != entry.last_message:
            entry.last_message = message
            self._emit(entry.obj, "Warning", "FailedScheduling", message)
            self._condition(entry.obj, "Unschedulable", message)
        self.queue.unschedulable_now(entry)

    def _gang_could_fit(self, req: LivePod, snapshot: ClusterSnapshot) -> bool:
        """Whether the gang's missing members need no more GPUs than the cluster has at all:
        a gang that can never fit must not evict anyone on its way to failing."""
        if req.gang is None or req.priority <= 0 or req.gang not in self.gangs.groups:
            return False
        st = self.gangs.st(req.gang)
        needed = self.gangs.groups[req.gang].min_member - len(st.bound) - len(st.waiting)
        return needed * req.num_gpu <= int(snapshot.gpu_count.sum())

    async def _try_preempt_gang(
        self,
        entry: QueuedPod,
        req: LivePod,
        siblings: list[LivePod],
        snapshot: ClusterSnapshot,
        framework: Framework,
    ) -> bool:
        """PostFilter for a gang: victims for every missing member at once, chosen on one
        what-if snapshot (each member's victims gone and the member placed before the next is
        considered), so members never pick the same victim and the gang fits when they are gone.
        Nothing is evicted unless the whole gang then fits."""
        assert req.gang is not None
        st = self.gangs.st(req.gang)
        needed = self.gangs.groups[req.gang].min_member - len(st.bound) - len(st.waiting)
        trial = [req, *[s for s in siblings if s.key != req.key][: needed - 1]]
        trial += [clone_member(req, i) for i in range(len(trial), needed)]
        what_if = snapshot.copy()
        victims: dict[str, bool] = {}
        for member in trial:
            placed = framework.schedule(member, what_if, self.rng)
            if placed.placement is None:
                explained = framework.schedule(member, what_if, self.rng, explain=True)
                candidates = [
                    n for n, why in explained.node_reasons.items() if for_lack_of_room(why)
                ]
                nomination = select_victims(
                    member, what_if, candidates, self.gangs.min_members(), self.budgets
                )
                if nomination is None:
                    return False
                for uid in nomination.victims:
                    what_if.forget(uid)
                    victims[uid] = uid in nomination.graceful
                placed = framework.schedule(member, what_if, self.rng)
                if placed.placement is None:
                    return False
            what_if.assume(member, placed.placement)
        if not victims:
            return False
        message = (
            f"gang {req.gang} preempts {len(victims)} lower-priority pod(s) so that its "
            f"{needed} missing member(s) fit together."
        )
        entry.last_message = message
        self._emit(entry.obj, "Normal", "Preempting", message)
        for uid, graceful in victims.items():
            victim = self._pod_by_uid(uid)
            if victim is None:
                continue
            vm = victim["metadata"]
            self._emit(
                victim, "Normal", "Preempted",
                f"Preempted by gang {req.gang} (priority {req.priority})",
            )  # fmt: skip
            with contextlib.suppress(NotFound):
                await self.kube.delete(
                    PODS, vm["name"], vm["namespace"], grace_period_s=None if graceful else 0
                )
        self.metrics.preemptions.inc(len(victims))
        self.queue.unschedulable_now(entry)
        return True

    async def _try_preempt(self, entry: QueuedPod, req: LivePod, result: ScheduleResult) -> bool:
        if req.priority <= 0 or result.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            return False
        snapshot = self.cache.snapshot()
        explained = self.framework().schedule(req, snapshot, self.rng, explain=True)
        candidates = [n for n, why in explained.node_reasons.items() if for_lack_of_room(why)]
        if not candidates:
            return False
        nomination = select_victims(
            req, snapshot, candidates, self.gangs.min_members(), self.budgets
        )
        if nomination is None:
            return False
        victims = [self._pod_by_uid(uid) for uid in nomination.victims]
        message = (
            f"{result.message()} Preempting {len(victims)} lower-priority pod(s) "
            f"on {nomination.node_name}"
            + (
                f", {nomination.budget_violations} against a PodDisruptionBudget."
                if nomination.budget_violations
                else "."
            )
        )
        entry.last_message = message
        self._emit(entry.obj, "Normal", "Preempting", message)
        self._condition(entry.obj, "Unschedulable", message)
        with contextlib.suppress(ApiError):
            await self.kube.patch(
                PODS,
                entry.obj["metadata"]["name"],
                {"status": {"nominatedNodeName": nomination.node_name}},
                entry.obj["metadata"]["namespace"],
                sub="status",
            )
        self._hold_for_preemptor(entry, req, nomination.node_name)
        for uid, victim in zip(nomination.victims, victims, strict=True):
            if victim is None:
                continue
            vm = victim["metadata"]
            self._emit(
                victim, "Normal", "Preempted", f"Preempted by {entry.key} (priority {req.priority})"
            )
            # Elastic surplus gets its own grace period (SIGTERM, time to checkpoint).
            grace = None if uid in nomination.graceful else 0
            with contextlib.suppress(NotFound):
                await self.kube.delete(PODS, vm["name"], vm["namespace"], grace_period_s=grace)
        self.metrics.preemptions.inc(len(victims))
        # The victims' deletion events move this pod back to active.
        self.queue.unschedulable_now(entry)
        return True

    def _pod_by_uid(self, uid: str) -> Obj | None:
        bound = self.cache.bound.get(uid)
        if bound is not None:
            return bound[2]
        entry = self.queue.pods.get(uid)
        return entry.obj if entry else None

    def _arm_gang_timer(self, gang: str) -> None:
        st = self.gangs.st(gang)
        if st.timer is not None:
            return
        spec = self.gangs.groups[gang]
        loop = asyncio.get_running_loop()
        st.timer = loop.call_later(spec.timeout_s, self._gang_timeout, gang)

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
        for w_entry, _req, _placement in waiting:
            self.cache.forget(w_entry.uid)
            w_entry.last_message = message
            self._emit(w_entry.obj, "Warning", "GangTimeout", message)
            self._condition(w_entry.obj, "Unschedulable", message)
            self.queue.backoff(w_entry)
        self.queue.move_all_to_active()
        self._podgroup_status(gang, message)

    # --- writing back where users look -------------------------------------------------

    def _emit(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        try:
            self._events.put_nowait((obj, type_, reason, message))
        except asyncio.QueueFull:
            self.metrics.events_dropped.inc()

    def _condition(self, obj: Obj, reason: str, message: str) -> None:
        meta = obj["metadata"]
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                ]
            }
        }
        self._writes(
            self.kube.patch(
                PODS, meta["name"], patch, meta["namespace"], patch_type="strategic", sub="status"
            )
        )

    def _podgroup_status(self, gang: str, message: str | None = None) -> None:
        if gang not in self.gangs.groups:
            return
        ns, name = gang.split("/", 1)
        running = succeeded = failed = 0
        for _req, _node, pod in self.cache.bound.values():
            labels = pod["metadata"].get("labels") or {}
            if pod["metadata"].get("namespace") == ns and labels.get(r.POD_GROUP_LABEL) == name:
                phase = (pod.get("status") or {}).get("phase")
                running += phase == "Running"
        status: dict[str, Any] = self.gangs.status_patch(gang, running, succeeded, failed)
        if message:
            status["message"] = message
        st = self.gangs.st(gang)
        if status == st.last_status:
            return
        st.last_status = dict(status)
        # One writer per gang, always sending the latest status: concurrent patches could land
        # out of order and leave an older phase behind.
        first = gang not in self._pg_pending
        self._pg_pending[gang] = status
        if first:
            self._writes(self._write_podgroup_status(gang, ns, name))

    async def _write_podgroup_status(self, gang: str, ns: str, name: str) -> None:
        try:
            while gang in self._pg_pending:
                status = self._pg_pending[gang]
                await self.kube.patch(PODGROUPS, name, {"status": status}, ns, sub="status")
                if self._pg_pending.get(gang) is status:
                    del self._pg_pending[gang]
        finally:
            self._pg_pending.pop(gang, None)

    def _writes(self, coro: Any) -> None:
        async def guarded() -> None:
            try:
                await coro
            except (ApiError, InvalidValueError) as exc:
                log.debug("status write failed", extra={"error": str(exc)})
            except Exception as exc:
                log.warning("status write failed", extra={"error": repr(exc)})

        task = asyncio.create_task(guarded())
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _event_writer(self) -> None:
        while True:
            obj, type_, reason, message = await self._events.get()
            try:
                await self.kube.event(
                    obj,
                    reason=reason,
                    message=message,
                    type_=type_,
                    component="alnair-scheduler",
                )
            except Exception as exc:
                log.debug("event write failed", extra={"error": repr(exc)})

    # --- explanation ---------------------------------------------------------------------

    def explain(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.pods.get(f"{namespace}/{name}")
        if pod is None:
            raise NotFound(404, "NotFound", f"pod {namespace}/{name} not found", "explain")
        out: dict[str, Any] = {
            "pod": f"{namespace}/{name}",
            "node": (pod.get("spec") or {}).get("nodeName"),
            "annotations": {
                k: v
                for k, v in ((pod["metadata"].get("annotations") or {}).items())
                if k.startswith(r.DOMAIN)
            },
        }
        try:
            req = parse_pod(pod, self.cache.gpu_memory_table())
        except InvalidPodError as exc:
            out["error"] = str(exc)
            return out
        out["request"] = {
            "cpu_milli": req.cpu_milli,
            "memory_mib": req.memory_mib,
            "num_gpu": req.num_gpu,
            "gpu_milli": req.gpu_milli,
            "gpu_models": sorted(req.gpu_models),
            "priority": req.priority,
            "gang": req.gang,
        }
        entry = self.queue.pods.get(pod["metadata"]["uid"])
        if entry is not None:
            out["queue"] = {"attempts": entry.attempts, "message": entry.last_message}
        if out["node"]:
            out["message"] = f"bound to {out['node']}"
            return out
        snapshot = self.cache.snapshot().copy()
        result = self.framework().schedule(req, snapshot, np.random.default_rng(0), explain=True)
        out["message"] = result.message()
        out["filtered"] = {snapshot.names[n]: why for n, why in sorted(result.node_reasons.items())}
        scores = {
            snapshot.names[int(n)]: {
                "total": float(result.scores[k]),
                **{p: float(v[k]) for p, v in result.plugin_scores.items()},
            }
            for k, n in enumerate(result.feasible)
        }
        out["scores"] = dict(sorted(scores.items(), key=lambda kv: -kv[1]["total"])[:20])
        if result.placement is not None:
            out["would_place"] = {
                "node": result.placement.node_name,
                "gpus": list(result.placement.gpu_indices),
            }
        return out
