"""The dispatcher's reconcile loop: informers in, queueing-policy decisions applied to Jobs.

One loop task waits on a wake-up flag that every informer handler sets (a queued Job created,
changed, finished or deleted; a queue, cohort or GPU node changed; a new predictor model). Each
wake-up runs one reconcile: read the caches into a `QueueSnapshot`, ask the policy, apply its
decisions. Wake-ups that arrive while a reconcile runs fold into the next one, so a burst of
events costs one reconcile, and nothing ever wakes on a timer.

Every decision is written to the Job itself (annotations, Events) before anything else relies on
it, so the informer's copy of the Job is the state: a restarted dispatcher decides from the same
facts, and an admission patch carries the Job's resourceVersion, so the API server refuses a
second write of a decision taken on stale data (409) instead of admitting twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any, get_args

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.colocation import ColocationTable, workload_key
from alnair.common.errors import InvalidValueError
from alnair.common.events import JobPhase
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    NODES,
    PODS,
    TRIALJOBS,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
    Resource,
)
from alnair.common.progress import ANN_PREEMPTIONS
from alnair.scheduler.dispatcher import kueue_queues as kq
from alnair.scheduler.dispatcher.core import (
    QueueCore,
)
from alnair.scheduler.dispatcher.explain import explanation, queue_descriptions
from alnair.scheduler.dispatcher.kinds import KINDS, SERVING
from alnair.scheduler.dispatcher.kueue_queues import kueue_status
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.outside import Inside, OutsidePods
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_AT,
    ANN_BORROWING,
    ANN_FLAVORS,
    ANN_STOPPING,
    GPU,
    LABEL_TRIAL_FOR,
    LABEL_WORKLOAD,
    Workload,
    node_gpus,
    parse_cluster_queue,
    parse_plain_job,
    workload_label,
)
from alnair.scheduler.dispatcher.plain_order import Rank, kueue_order
from alnair.scheduler.dispatcher.plain_preemption import Charge, victims
from alnair.scheduler.dispatcher.pods_ready import PodsReady, backing_off
from alnair.scheduler.dispatcher.predictions import (
    PredictorClient,
)
from alnair.scheduler.dispatcher.progressing import planned_progress, remaining
from alnair.scheduler.dispatcher.queue_status import (
    EMPTY_LOCAL_QUEUE,
    cluster_queue_statuses,
    local_queue_statuses,
)
from alnair.scheduler.dispatcher.resource_quota import NamespaceQuotas, asked_of_queue
from alnair.scheduler.dispatcher.serving import ServingPods
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.sharing import Fraction, SharedGpu, likely_sharing, pack
from alnair.scheduler.dispatcher.trials import ColdStart
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.dispatcher.writing import (
    COMPONENT,
    JobState,
    WorkloadWriter,
    gather_writes,
    ran_s,
)
from alnair.scheduler.queueing import (
    Decisions,
    GpuPool,
    JobSpec,
    QueuePolicy,
    QueueSnapshot,
    RunningJob,
    RuntimeEstimate,
    WaitKind,
    WaitReason,
    queue_policy,
)
from alnair.scheduler.queueing.history import UsageHistory
from alnair.scheduler.queueing.permits import within_rules
from alnair.scheduler.queueing.resources import QueueResources, ResourceLedger

log = logging.getLogger(__name__)
WAIT_KINDS = get_args(WaitKind)
SURPLUS = "#surplus"
Shape = tuple[tuple[str, Decimal], ...]
"""What a workload asks of its queue's quota, sorted: workloads of one shape fit alike."""


def build_policy(settings: DispatcherSettings) -> QueuePolicy:
    """The configured queueing policy, with the options it takes from the settings."""
    if settings.policy.lower() == "alnair":
        return queue_policy(
            "alnair", max_wait_s=settings.max_wait_s, fair_share=settings.fair_share
        )
    return queue_policy(settings.policy)


def _inside(workloads: list[Workload]) -> Inside:
    """Whose pods the queues account for: these workloads' (by uid; a serving workload's or a
    PodGroup's also by the name its pods carry)."""
    return Inside(
        uids=frozenset(wl.uid for wl in workloads),
        members=frozenset(
            (wl.namespace, workload_label(wl.kind, wl.name))
            for wl in workloads
            if not KINDS[wl.kind].writable
        ),
    )


def _held_after(snapshot: QueueSnapshot, decisions: Decisions) -> Counter[str]:
    """GPUs each queue holds once the decisions are applied (the usage history's next
    interval)."""
    stopped = {p.job_id for p in decisions.preemptions}
    by_id = {j.id: j for j in snapshot.pending}
    held: Counter[str] = Counter()
    for run in snapshot.running:
        if run.job.id not in stopped:
            held[run.job.queue] += run.gpus
    for adm in decisions.admissions:
        if adm.job_id in by_id:
            held[by_id[adm.job_id].queue] += adm.gpus
    return held


def _float(raw: str | None) -> float:
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0


def _epoch(ts: str | None) -> float:
    if not ts:
        return time.time()
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class Dispatcher(QueueCore):
    """Admits queued Jobs through ClusterQueues with a queueing policy."""

    component = COMPONENT

    def __init__(
        self,
        kube: KubeClient,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics,
        *,
        bus: Bus | None = None,
        predictor: PredictorClient | None = None,
        policy: QueuePolicy | None = None,
    ) -> None:
        super().__init__(
            kube, settings, metrics, KINDS.values(),
            bus=bus, predictor=predictor, policy=policy or build_policy(settings),
        )  # fmt: skip
        self.nodes = Informer(kube, NODES, label_selector=settings.node_selector, name="nodes")
        self.trials = Informer(kube, TRIALJOBS, label_selector=LABEL_TRIAL_FOR, name="trialjobs")
        watching = self.workload_informers()
        # The pods of serving workloads (gated until their owner is admitted, kinds.py).
        self.serving_pods = Informer(kube, PODS, label_selector=LABEL_WORKLOAD, name="serving-pods")
        self.serving = ServingPods(self.serving_pods)
        watching.append(self.serving_pods)
        # Every bound pod holding GPUs, to take those no admitted workload owns off the pool.
        self.outside = OutsidePods(kube, self._wake.set)
        watching.append(self.outside.informer)
        # Namespaces' ResourceQuotas, asked before admitting (a change wakes it: room freed).
        self.quotas = NamespaceQuotas(kube)
        watching.append(self.quotas.informer)
        self.workloads: dict[str, Workload] = {}
        self.colocation: ColocationTable | None = None
        """The predictor's co-location table (`on_colocation`; None: none published yet)."""
        self._shared: dict[str, list[SharedGpu]] = {}
        """GPU model -> its GPUs shared by running fractions, as planned (`sharing`)."""
        self._gpu_memory: dict[str, float] = {}
        self.queue_report: dict[str, dict[str, Any]] = {}
        """Each ClusterQueue's status as the last reconcile counted it (`queue_status.py`)."""
        self.states: dict[str, JobState] = {}
        self.writer = WorkloadWriter(
            kube, metrics, self.states, self.serving,
            bus=bus, event=self._event, publish=self._publish, remember=self._remember,
            wake=self._wake.set,
        )  # fmt: skip
        self.pods_ready = PodsReady(settings, metrics, self.writer, self._remember)
        self.cold_start = ColdStart(
            kube, settings, self.trials, self.writer, event=self._event, remember=self._remember
        )
        self.last_decisions = Decisions()
        self.history = UsageHistory(settings.fair_share_half_life_s)
        """Each queue's decayed GPU use, for fair sharing by history (in memory)."""
        self._usage = ResourceLedger({})
        """The last reconcile's usage of quota over other resources (queue status)."""
        self._charges: list[Charge] = []
        """What each admitted workload holds of that quota (preemption reads it)."""
        self._ranks: dict[str, tuple[Workload, Rank]] = {}
        """Each parsed workload's place in its queue (`_rank`)."""
        self._looked: dict[str, tuple[str, bool, str | None]] = {}
        """uid -> (resourceVersion, queued, how it finished) as `_looks` last read them (a
        finished object unchanged since is not looked at again)."""
        self._parsed: dict[str, tuple[str, Workload]] = {}
        """Each workload as last parsed, with the resourceVersion it was parsed from."""
        self._asked_of: dict[str, tuple[Workload, Mapping[str, Decimal], Shape]] = {}
        """What each parsed workload asks of its queue's quota (`_asked`), and as a key."""
        for informer in self.referenced.values():
            informer.add_handler(self._references_changed)
        self._flagged: dict[str, str] = {}
        """Kueue objects given an Event for what Alnair cannot honour: uid -> the problem."""
        self._deadline: asyncio.TimerHandle | None = None
        queue_informers = self.queue_informers()
        self.informers = (*queue_informers, self.nodes, self.trials, *watching)
        for informer in (*queue_informers[1:], self.trials, *watching):
            informer.add_handler(self._poke)
        self.cluster_queues.add_handler(self._on_queue)
        self.nodes.add_handler(self._on_node)

    # --- wake-ups -----------------------------------------------------------------------

    def _poke(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        # A deleted workload's state goes in the reconcile this wakes (it keeps only live
        # keys), never here: a reconcile in flight may still hold it.
        if (
            event is WatchEvent.MODIFIED
            and old is not None
            and old["metadata"].get("resourceVersion") == obj["metadata"].get("resourceVersion")
        ):
            return  # our own write coming back (`_remember` stored it), or a relist: no news
        self._wake.set()

    def _on_queue(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        # Our own status writes change only .status: no reason to decide again.
        if (
            old is not None
            and event is WatchEvent.MODIFIED
            and obj.get("spec") == old.get("spec")
            and obj["metadata"].get("labels") == old["metadata"].get("labels")
        ):
            return
        self._wake.set()

    def _on_node(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        if old is not None and event is WatchEvent.MODIFIED and node_gpus(obj) == node_gpus(old):
            return  # heartbeats and unrelated changes: the GPU pool is the same
        self._wake.set()

    # --- one reconcile ------------------------------------------------------------------

    def validate_queue(self, obj: Obj) -> str | None:
        """What is wrong with a ClusterQueue that the CRD schema cannot say (the admission
        webhook refuses it): a cohort that does not exist, a field the policies cannot read,
        a flavor naming a GPU model neither Alnair nor any node it sees knows. None if it is
        fine. (Cohorts have no parents here, so there is no cycle to find.)"""
        cohorts = {c["metadata"]["name"] for c in self.cohorts.values()}
        try:
            spec = parse_cluster_queue(obj, cohorts)
        except InvalidValueError as exc:
            return f"ClusterQueue {obj['metadata'].get('name')}: {exc}"
        seen = {g.model for n in self.nodes.values() if (g := node_gpus(n)) is not None}
        known = seen | set(res.GPU_MODEL_MEMORY_MIB)
        unknown = sorted(m for m in spec.quota if m not in known)
        if unknown:
            return (
                f"ClusterQueue {spec.name}: flavor {unknown[0]!r} names a GPU model no node "
                f"has and Alnair does not know (nodes have: {', '.join(sorted(seen)) or 'none'})"
            )
        return None

    def _node_models(self) -> dict[str, str]:
        return {
            n["metadata"]["name"]: g.model
            for n in self.nodes.values()
            if (g := node_gpus(n)) is not None
        }

    def _capacity(self, running: list[RunningJob], outside: Counter[str]) -> dict[str, GpuPool]:
        """Each model's GPUs: all the pool's, and those free of admitted workloads and of
        pods outside the queues (`outside`, by model)."""
        totals: Counter[str] = Counter()
        memory: dict[str, float] = {}
        for node in self.nodes.values():
            gpus = node_gpus(node)
            if gpus is None:
                continue
            totals[gpus.model] += gpus.gpus
            known = gpus.memory_mib or float(res.GPU_MODEL_MEMORY_MIB.get(gpus.model, 0))
            memory[gpus.model] = min(memory.get(gpus.model, known), known) if known else 0.0
        used: Counter[str] = Counter(outside)
        fractions: dict[str, list[Fraction]] = {}
        for run in running:
            wl = self.workloads.get(run.job.id)
            if wl is not None and wl.request.memory_mib_per_pod is not None:
                work = _workload_of(wl)
                fractions.setdefault(run.gpu_type, []).extend(
                    Fraction(f"{wl.key}#{i}", work, wl.request.memory_mib_per_pod)
                    for i in range(wl.request.pods)
                )
                continue
            used[run.gpu_type] += run.gpus
        # Running fractions take the GPUs they pack into, never two predicted past the cap
        # together (`sharing`).
        cap = self.settings.max_colocation_slowdown
        self._gpu_memory = {m: memory.get(m) or float("inf") for m in totals}
        self._shared = {
            model: pack(found, self._gpu_memory.get(model, float("inf")), self.colocation,
                        model, cap)
            for model, found in fractions.items()
        }  # fmt: skip
        for model, shared in self._shared.items():
            used[model] += len(shared)
        for model in totals:
            self.metrics.outside_gpus.labels(model).set(outside[model])
        return {
            model: GpuPool(
                total=total,
                free=max(0, total - used[model]),
                memory_mib=memory.get(model) or float("inf"),
            )
            for model, total in sorted(totals.items())
        }

    def _job_spec(
        self, wl: Workload, cq: str, state: JobState, arrival_s: float, until_s: float
    ) -> JobSpec:
        """The job as the policy sees it; `until_s` is now for a waiting job and the start of
        its current run for a running one (its wait is the time since arrival not run)."""
        prediction = state.prediction
        peak = prediction.peak_memory_mib if prediction else None
        if wl.request.memory_mib_per_pod is not None and peak is not None:
            # A fractional pod may use only what it asked for: its peak must fit its share.
            peak = peak if peak > wl.request.memory_mib_per_pod else None
        whole = dict(prediction.runtime) if prediction else {}
        # How far it got: a resumed job is planned with what its checkpoint left, and a stop
        # costs the steps since that checkpoint too (`progressing`).
        running_on = state.admitted_type
        progress = planned_progress(wl.annotations, whole, running_on)
        state.progress = progress
        runtime = remaining(whole, progress.kept)
        if running_on is None and wl.request.memory_mib_per_pod is not None:
            runtime = self._shared_runtime(wl, state, runtime)
        return JobSpec(
            id=wl.key,
            queue=cq,
            gpus=wl.request.gpus,
            arrival_s=arrival_s,
            runtime=runtime,
            team=wl.namespace,
            gpu_model=wl.gpu_model,
            priority=self._priority(wl),
            peak_memory_mib=peak,
            restart_cost_s=wl.restart_cost_s + progress.lost_s,
            preemptions=_preemption_count(wl),
            waited_s=max(0.0, until_s - arrival_s - ran_s(wl)),
        )

    def _shared_runtime(
        self, wl: Workload, state: JobState, runtime: dict[str, RuntimeEstimate]
    ) -> dict[str, RuntimeEstimate]:
        """A waiting fraction's runtimes as it will most likely run: beside the running
        fractions it may join, slowed as the table predicts (`sharing`)."""
        assert wl.request.memory_mib_per_pod is not None
        new = Fraction(wl.key, _workload_of(wl), wl.request.memory_mib_per_pod)
        cap = self.settings.max_colocation_slowdown
        state.sharing = {}
        out = dict(runtime)
        for model, estimate in runtime.items():
            found = likely_sharing(
                new, self._shared.get(model, []), self._gpu_memory.get(model, float("inf")),
                self.colocation, model, cap,
            )  # fmt: skip
            state.sharing[model] = found
            if found is not None and found.slowdown > 1.0:
                out[model] = RuntimeEstimate(
                    estimate.expected_s * found.slowdown, estimate.upper_s * found.slowdown
                )
        return out

    def on_colocation(self, table: ColocationTable | None) -> None:
        """A new co-location table (a retrained predictor): plan again with it."""
        self.colocation = table
        self.wake()

    async def reconcile(self) -> None:
        """One pass over every queue. The explanations it writes (Events, wait reasons) go
        out side by side at its end, each workload's in order; admissions are written as
        they are decided, those of workloads without GPUs side by side."""
        self.writer.defer()
        try:
            await self._reconcile()
        except BaseException:
            self.writer.drop()
            raise
        await self.writer.flush()

    async def _reconcile(self) -> None:
        started = time.perf_counter()
        self.reconciles += 1
        queues = self._read_queues()
        plain_quota = self._plain_quota()
        charges: list[
            tuple[str, Workload]
        ] = []  # admitted workloads in queues over other resources
        plain_ws: list[tuple[Workload, str]] = []  # workloads without GPUs, waiting
        now = time.time()
        pending: list[JobSpec] = []
        running: list[RunningJob] = []
        workloads: dict[str, Workload] = {}
        pending_ws: list[Workload] = []
        live_keys: set[str] = set()
        deadlines: list[float] = []  # when a pods-ready timeout or a backoff ends
        ours: list[Workload] = []  # admitted or held: pods they own are the queues' concern
        self.quotas.begin()  # (ResourceQuota room: what is admitted is charged below)
        objects = {name: self._objects(name) for name in self.workload_watches}
        queued: list[tuple[Obj, WorkloadKind, str | None]] = []  # (how it finished)
        for name, stored in objects.items():
            kind = KINDS[name]
            for obj in stored.values():
                is_queued, finished, unchanged = self._looks(kind, obj)
                if finished is not None and unchanged:
                    continue  # finished when last looked at, and unchanged since
                if is_queued and kind.writable:
                    queued.append((obj, kind, finished))
                elif is_queued:
                    seen = self.serving.with_admission(kind, obj)
                    queued.append((seen, kind, self.serving.finished(kind, seen)))
        for obj, kind, finished in queued:
            meta = obj["metadata"]
            key = kind.key_of(obj)
            live_keys.add(key)
            state = self.states.setdefault(key, JobState(key))
            if finished is not None:
                self.states.pop(key, None)  # bounded: a finished job needs nothing from us
                continue
            try:
                wl = self._parse(kind, key, obj)
            except InvalidValueError as exc:
                plain = self._plain_job(kind.kind, obj)
                if plain is not None:
                    wl = plain
                elif state.invalid != str(exc):
                    state.invalid = str(exc)
                    await self._event(
                        kind.ref(obj), "InvalidRequest", f"not queued: {exc}", warning=True
                    )
                    continue
                else:
                    continue
            state.invalid = None
            workloads[key] = wl
            cq = self._cluster_queue_of(wl)
            state.cluster_queue = cq
            admitted = wl.admitted_type
            if admitted is not None:
                state.admitted_type = admitted
                queue = cq or ""
                start = float(wl.annotations.get(ANN_ADMITTED_AT) or now)
                ours.append(wl)
                if await self.pods_ready.taken_back(wl, kind, start, now, deadlines):
                    continue  # its admission was taken back: it holds nothing now
                self.quotas.charge(wl)
                if queue in plain_quota:
                    charges.append((queue, wl))
                if wl.request.gpus == 0:
                    continue  # a workload without GPUs: its quota is all the policy never sees
                if kind.kind in SERVING:
                    await self.writer.ungate(wl, admitted)
                spec = self._job_spec(
                    wl, queue, state, _epoch(meta.get("creationTimestamp")), start
                )
                running.append(
                    RunningJob(
                        job=spec,
                        gpu_type=admitted,
                        start_s=start,
                        borrowing=wl.annotations.get(ANN_BORROWING) == "true",
                    )
                )
                if wl.surplus_gpus:
                    # An elastic job's workers above its minimum hold borrowed quota, and are
                    # what an owner reclaims first (by a scale request, not a suspension).
                    surplus = replace(spec, id=f"{key}{SURPLUS}", gpus=wl.surplus_gpus)
                    running.append(RunningJob(surplus, admitted, start, borrowing=True))
                    workloads[surplus.id] = wl
                continue
            state.admitted_type = None
            if not wl.held:
                continue  # running outside the queue: not ours to admit
            ours.append(wl)  # (pods it still has are leaving: it was suspended or preempted)
            backoff = backing_off(wl, now, self.settings.pods_ready_retries)
            if backoff is not None:
                state.reason = WaitReason("queue", backoff[0])
                await self.writer.wait_event(wl, state)
                if backoff[1] is not None:
                    deadlines.append(backoff[1])
                continue
            if kind.members_first and len(self.serving.live(wl)) < wl.request.pods:
                present = len(self.serving.live(wl))
                state.reason = WaitReason(
                    "queue", f"{present} of its {wl.request.pods} pods exist; admitted when all do"
                )
                await self.writer.wait_event(wl, state)
                continue
            if cq is None:
                state.reason = WaitReason(
                    "queue", f"LocalQueue {wl.namespace}/{wl.local_queue} does not exist"
                )
                await self.writer.wait_event(wl, state)
                continue
            if cq not in queues:
                problem = self.queues.get(cq)
                why = problem.problem if problem and problem.problem else "does not exist"
                state.reason = WaitReason("queue", f"ClusterQueue {cq} is inactive: {why}")
                await self.writer.wait_event(wl, state)
                continue
            refused = self._queue_refuses(cq, wl)
            if refused is not None:
                state.reason = WaitReason("queue", refused)
                await self.writer.wait_event(wl, state)
                continue
            if wl.request.gpus == 0:
                plain_ws.append((wl, cq))
                continue
            pending_ws.append(wl)
            if "submitted" not in state.evented:
                state.evented.add("submitted")
                await self._publish(wl, JobPhase.SUBMITTED, {"queue": cq})
        kept: tuple[dict[str, Any], ...] = (self.states, self._parsed, self._asked_of, self._ranks)
        for cache in kept:  # what is kept per workload goes with it
            for key in [k for k in cache if k not in live_keys]:
                del cache[key]
        if len(self._looked) > 2 * sum(len(held) for held in objects.values()):
            live = {o["metadata"].get("uid") for held in objects.values() for o in held.values()}
            self._looked = {u: v for u, v in self._looked.items() if u in live}
        self.workloads = workloads
        self._wake_at(min(deadlines, default=None))

        held = await self.outside.held(_inside(ours), self._node_models())
        capacity = self._capacity(running, held)
        models = list(capacity)
        states = {wl.key: self.states.setdefault(wl.key, JobState(wl.key)) for wl in pending_ws}
        await asyncio.gather(*(self._predict(wl, models, states[wl.key]) for wl in pending_ws))
        for wl in pending_ws:
            state = states[wl.key]
            if state.prediction_error is not None:
                state.reason = WaitReason(
                    "prediction", f"no usable prediction: {state.prediction_error}"
                )
                await self.writer.wait_event(wl, state)
                continue
            if await self.cold_start.holds(wl, state):
                await self.writer.wait_event(wl, state)
                continue
            if self._over_resource_quota(wl, state):
                await self.writer.wait_event(wl, state)
                continue
            assert state.cluster_queue is not None
            pending.append(
                self._job_spec(
                    wl,
                    state.cluster_queue,
                    state,
                    _epoch(wl.obj["metadata"].get("creationTimestamp")),
                    now,
                )
            )

        snapshot = QueueSnapshot(
            now_s=now, pending=pending, running=running, queues=queues, capacity=capacity,
            usage=self.history.advance(now) if self.settings.fair_share else {},
        )  # fmt: skip
        decisions = within_rules(self.policy.decide(snapshot), snapshot)
        self.last_decisions = decisions
        ledger = self._ledger(plain_quota, charges)
        await self._apply(decisions, snapshot, workloads, ledger)
        self.history.hold(_held_after(snapshot, decisions))
        admitted_plain = await self._admit_plain(plain_ws, ledger, now)
        plain_counts = (
            Counter(cq for _, cq in plain_ws) - admitted_plain,
            Counter(q for q, wl in charges if wl.request.gpus == 0) + admitted_plain,
        )
        await self.writer.flush()
        await self._write_queue_status(snapshot, decisions, plain_counts)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    def _looks(self, kind: WorkloadKind, obj: Obj) -> tuple[bool, str | None, bool]:
        """Whether the object is queued, how it finished (None: not yet), and whether that
        was already known from an earlier pass. A kind read from its object alone is read
        once per resourceVersion: a pass walks every object, and thousands of them are
        unchanged (most of them finished) since the last."""
        meta = obj["metadata"]
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        cacheable = kind.writable and kind.finished_by_pods is None and bool(uid and version)
        if cacheable:
            seen = self._looked.get(uid)
            if seen is not None and seen[0] == version:
                return seen[1], seen[2], True
        queued = kind.queued(obj)
        finished = self.serving.finished(kind, obj) if queued else None
        if cacheable:
            self._looked[uid] = (version, queued, finished)
        return queued, finished, False

    def _parse(self, kind: WorkloadKind, key: str, obj: Obj) -> Workload:
        """The workload as its kind reads it, parsed again only when the object changed (by
        its resourceVersion) or an object kinds read beside it did. A kind whose reading
        depends on its pods (serving kinds, PodGroups) is read every time."""
        version = obj["metadata"].get("resourceVersion")
        cacheable = kind.writable and kind.finished_by_pods is None and version is not None
        cached = self._parsed.get(key) if cacheable else None
        if cached is not None and cached[0] == version:
            return cached[1]
        seen = kind.resolve(obj, self._lookup) if kind.resolve is not None else obj
        wl = kind.parse(seen, self.settings.default_restart_cost_s)
        if cacheable:
            self._parsed[key] = (str(version), wl)
        return wl

    def _asked(self, wl: Workload) -> Mapping[str, Decimal]:
        """`asked_of_queue`, once per parsed workload (the parse is kept while unchanged)."""
        cached = self._asked_of.get(wl.key)
        if cached is not None and cached[0] is wl:
            return cached[1]
        asked = asked_of_queue(wl)
        self._asked_of[wl.key] = (wl, asked, tuple(sorted(asked.items())))
        return asked

    def _rank(self, wl: Workload) -> Rank:
        """Where the workload stands in its queue (`kueue_order`), once per parse."""
        cached = self._ranks.get(wl.key)
        if cached is None or cached[0] is not wl:
            arrival = str(wl.obj["metadata"].get("creationTimestamp"))
            cached = self._ranks[wl.key] = (wl, (-self._priority(wl), arrival, wl.key))
        return cached[1]

    def _shape(self, wl: Workload) -> Shape | None:
        """What the workload asks of its queue's quota, as a key (None: it cannot be read)."""
        try:
            self._asked(wl)
        except InvalidValueError:
            return None
        return self._asked_of[wl.key][2]

    def _readable_ask(self, wl: Workload) -> Mapping[str, Decimal]:
        """`_asked`, or nothing when its requests cannot be read (said when it is reached)."""
        try:
            return self._asked(wl)
        except InvalidValueError:
            return {}

    def _references_changed(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        self._parsed.clear()  # what a kind reads beside its object changed: read them again

    # --- quota over other resources than GPUs (Kueue's queues) ---------------------------

    def _plain_quota(self) -> dict[str, QueueResources]:
        """The active queues that hold quota over other resources than GPUs, by name."""
        return {
            name: st.kueue.resources
            for name, st in self.queues.items()
            if st.spec is not None and st.kueue is not None and st.kueue.resources.groups
        }

    def _plain_job(self, kind: str, obj: Obj) -> Workload | None:
        """A queued Job asking no GPU, when its ClusterQueue holds quota over other resources
        that covers all it asks (None: it is not queued, as before)."""
        template = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        if kind != "Job" or not self.kueue_objects or template.get("resourceClaims"):
            return None  # (a Job with claims is read with them: dra_claims.py)
        try:
            wl = parse_plain_job(obj, self.settings.default_restart_cost_s)
        except InvalidValueError:
            return None
        cq = self._cluster_queue_of(wl)
        state = self.queues.get(cq or "")
        if state is None:
            return None
        if state.spec is None:
            return wl  # it waits, with why its queue is inactive
        quota = self._plain_quota().get(cq or "")
        try:
            asked = self._asked(wl)
        except InvalidValueError:
            return None
        return wl if quota is not None and set(asked) <= quota.covered() else None

    def _ledger(
        self, quota: Mapping[str, QueueResources], charges: list[tuple[str, Workload]]
    ) -> ResourceLedger:
        """Usage of the queues' quota over other resources by what is admitted, each counted
        in the flavors recorded at its admission (or, for one admitted before its queue held
        such quota, the flavors it would get now). The charges are kept for preemption."""
        ledger = ResourceLedger(quota)
        self._charges = []
        for queue, wl in charges:
            try:
                asked = self._asked(wl)
            except InvalidValueError:
                continue
            raw = wl.annotations.get(ANN_FLAVORS)
            try:
                recorded = json.loads(raw) if raw else None
            except ValueError:
                recorded = None
            if not isinstance(recorded, dict):
                found = ledger.assign(queue, asked)
                recorded = found if not isinstance(found, str) else {}
            assignment = {str(k): str(v) for k, v in recorded.items()}
            ledger.take(queue, assignment, asked)
            meta = wl.obj["metadata"]
            self._charges.append(Charge(
                queue, wl, assignment, asked,
                admitted_s=_float(wl.annotations.get(ANN_ADMITTED_AT)),
                created_s=_epoch(meta.get("creationTimestamp")),
                stopping=wl.annotations.get(ANN_STOPPING) == "true",
            ))  # fmt: skip
        self._usage = ledger
        return ledger

    async def _admit_plain(
        self, waiting: list[tuple[Workload, str]], ledger: ResourceLedger, now: float
    ) -> Counter[str]:
        """Admit the workloads that ask no GPU in Kueue's order (`plain_order.py`), each where
        its queue's quota over other resources has room, preempting as its queue's rules
        allow; how many were admitted, by queue."""
        admitted: Counter[str] = Counter()
        decided: list[tuple[Workload, str, Mapping[str, str], Any]] = []
        short: dict[tuple[str, Shape], str] = {}
        """(queue, what it asks) -> why it waits, for a shape that did not fit in this pass:
        admissions only take room, so the same shape does not fit later in the pass either,
        and a later one of no higher priority (the order) can preempt no more than the first
        could. Thousands of workloads of a few shapes cost a few searches."""

        def settled(wl: Workload, cq: str) -> bool:
            shape = self._shape(wl)
            return shape is not None and (cq, shape) in short

        order = kueue_order(
            waiting,
            borrows=lambda wl, cq: not ledger.within_nominal(cq, self._readable_ask(wl)),
            rank=self._rank,
            settled=settled,
        )
        for wl, cq in order:
            state = self.states.setdefault(wl.key, JobState(wl.key))
            if self._over_resource_quota(wl, state):
                await self.writer.wait_event(wl, state)
                continue
            try:
                asked = self._asked(wl)
            except InvalidValueError as exc:
                state.reason = WaitReason("queue", f"its pods' requests cannot be read: {exc}")
                await self.writer.wait_event(wl, state)
                continue
            shape = (cq, self._shape(wl) or ())
            known = short.get(shape)
            flavors = ledger.assign(cq, asked) if known is None else known
            if isinstance(flavors, str):
                if known is not None:
                    # Behind one of its shape that did not fit: why it waits is known (the
                    # explain API says it) and written on the one tried, as Kueue writes it
                    # on the head it tried; a write each would double the API server's work.
                    state.reason = WaitReason("quota", known)
                    continue
                taken = await self._preempt_plain(wl, cq, asked, ledger)
                short[shape] = taken or flavors
                state.reason = WaitReason("quota", short[shape])
                await self.writer.wait_event(wl, state)
                continue
            # Decided in order (the ledger and the namespace's quota take it now); written
            # side by side with the others decided in this pass.
            self.fence(f"admission of {wl.key}")
            ledger.take(cq, flavors, asked)
            self.quotas.charge(wl)
            decided.append((wl, cq, flavors, asked))
        written = await gather_writes(
            partial(self.writer.admit_plain, w, q, f, now) for w, q, f, _ in decided
        )
        for (_, cq, flavors, asked), ok in zip(decided, written, strict=True):
            if ok:
                admitted[cq] += 1
            else:  # not written (a conflict wakes the loop, a refusal is said on it)
                ledger.release(cq, flavors, asked)
        return admitted

    async def _preempt_plain(
        self, wl: Workload, cq: str, asked: Mapping[str, Decimal], ledger: ResourceLedger
    ) -> str | None:
        """Take quota back for a workload that does not fit (its queue's preemption rules,
        `plain_preemption.py`); what it now waits for, or None when nothing may be taken."""
        state = self.queues.get(cq)
        if state is None or state.spec is None:
            return None
        plain = self._plain_quota()
        chosen = victims(
            wl, cq, asked, ledger, self._charges,
            rules=state.spec.preemption,
            cohort_of=lambda q: plain[q].cohort if q in plain else None,
            priority=self._priority,
            created_s=_epoch(wl.obj["metadata"].get("creationTimestamp")),
        )  # fmt: skip
        if chosen is None:
            return None
        reason = f"{wl.kind} {wl.namespace}/{wl.name} needs the quota"
        for c in chosen:
            self.fence(f"preemption of {c.wl.key}")
            await self.writer.preempt(c.wl, reason, wl.key)
            self.metrics.decisions.labels(self.policy.name, "preempted").inc()
            self._charges = [
                replace(x, stopping=True) if x.wl.key == c.wl.key else x for x in self._charges
            ]
        names = ", ".join(c.wl.key for c in chosen)
        return (
            f"preempting {names} to make room"
            if chosen
            else "waiting for preempted workloads to give their quota back"
        )

    def _over_resource_quota(self, wl: Workload, state: JobState) -> bool:
        """Whether the namespace's ResourceQuota would refuse the workload's pods now, given
        what is admitted there (`resource_quota.py`); the reason goes on its state."""
        problem = self.quotas.shortfall(wl)
        if problem is None:
            return False
        state.reason = WaitReason("resource_quota", problem)
        return True

    # --- applying decisions ---------------------------------------------------------------

    async def _apply(
        self,
        decisions: Decisions,
        snapshot: QueueSnapshot,
        workloads: dict[str, Workload],
        ledger: ResourceLedger,
    ) -> None:
        policy = self.policy.name
        for pre in decisions.preemptions:
            wl = workloads.get(pre.job_id)
            self.fence(f"preemption of {pre.job_id}")
            if wl is not None and pre.job_id.endswith(SURPLUS):
                await self.writer.shrink(wl, pre.reason, pre.for_job_id)
            elif wl is not None:
                await self.writer.preempt(wl, pre.reason, pre.for_job_id)
                self.metrics.decisions.labels(policy, "preempted").inc()
        by_id = {j.id: j for j in snapshot.pending}
        for adm in decisions.admissions:
            wl = workloads.get(adm.job_id)
            if wl is None:
                continue
            job = by_id[adm.job_id]
            state = self.states.get(wl.key)
            if state is not None and self._over_resource_quota(wl, state):
                await self.writer.wait_event(wl, state)  # room an earlier admission just took
                continue
            asked = self._asked(wl)
            flavors = ledger.assign(job.queue, asked)
            if isinstance(flavors, str):  # its queue's quota over other resources is short
                if state is not None:
                    state.reason = WaitReason("quota", flavors)
                    await self.writer.wait_event(wl, state)
                continue
            self.fence(f"admission of {adm.job_id}")
            if await self.writer.admit(
                wl, job, adm.gpu_type, adm.borrowing, snapshot.now_s,
                flavors={GPU: self._gpu_flavor(job.queue, adm.gpu_type), **flavors},
            ):  # fmt: skip
                ledger.take(job.queue, flavors, asked)
                self.quotas.charge(wl)
                self.metrics.decisions.labels(
                    policy, "borrowing" if adm.borrowing else "admitted"
                ).inc()
                self.metrics.wait_seconds.labels(job.queue).observe(
                    max(0.0, snapshot.now_s - job.arrival_s)
                )
        for run in snapshot.running:
            state = self.states.get(run.job.id)
            wl = workloads.get(run.job.id)
            note = decisions.notes.get(run.job.id)
            if state is not None and wl is not None and note != state.note:
                state.note = note
                if note is not None:
                    await self.writer.event(wl.ref(), "MoveSkipped", note)
        reservations = {r.job_id: r for r in decisions.reservations}
        order = sorted(snapshot.pending, key=lambda j: (-j.priority, j.arrival_s, j.id))
        positions: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for job in order:
            state = self.states.get(job.id)
            wl = workloads.get(job.id)
            if state is None or wl is None or job.id not in decisions.waiting:
                continue
            positions[job.queue] += 1
            state.position = positions[job.queue]
            state.reason = decisions.waiting[job.id]
            reasons[state.reason.kind] += 1
            reservation = reservations.get(job.id)
            if reservation is not None and not math.isfinite(reservation.start_s):
                reservation = None  # held for it, at a time nobody can predict yet
            state.predicted_start_s = reservation.start_s if reservation else None
            estimate = job.runtime.get(reservation.gpu_type) if reservation else None
            state.predicted_finish_s = (
                reservation.start_s + estimate.expected_s if reservation and estimate else None
            )
            await self.writer.wait_event(wl, state)
        for kind in (
            "quota",
            "reservation",
            "memory",
            "fair_share",
            "resource_quota",
            "capacity",
            "queue",
            "prediction",
        ):
            self.metrics.waiting.labels(kind).set(reasons[kind])

    def _gpu_flavor(self, queue: str, model: str) -> str:
        """The ResourceFlavor a queue counts `model` in (Kueue's queues; else the model)."""
        state = self.queues.get(queue)
        kueue = state.kueue if state is not None else None
        return kueue.flavors.get(model, model) if kueue is not None else model

    def _wake_at(self, when: float | None) -> None:
        """One reconcile at `when` (epoch seconds): a deadline no event announces, the end of a
        pods-ready timeout or of a backoff. Not a poll: nothing is looked at before it."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if when is not None:
            delay = max(0.0, when - time.time()) + 0.05
            self._deadline = asyncio.get_running_loop().call_later(delay, self._wake.set)

    async def _write_queue_status(
        self,
        snapshot: QueueSnapshot,
        decisions: Decisions,
        plain: tuple[Counter[str], Counter[str]] = (Counter(), Counter()),
    ) -> None:
        """Kueue's status fields on every ClusterQueue and LocalQueue, written only when
        they changed (`queue_status.py` counts them; `plain`: the workloads without GPUs
        pending and admitted, by queue)."""
        statuses = cluster_queue_statuses(
            snapshot, decisions, self.cluster_queues.values(), self.queues
        )
        for name, status in statuses.items():
            status["pendingWorkloads"] += plain[0][name]
            status["admittedWorkloads"] += plain[1][name]
        self.queue_report = statuses
        if self.kueue_objects:
            await self._flag_kueue_objects()
        writes: list[Callable[[], Awaitable[None]]] = []
        for obj in self.cluster_queues.values():
            name = obj["metadata"]["name"]
            status = statuses[name]
            self.metrics.queue_depth.labels(name).set(status["pendingWorkloads"])
            self.metrics.admitted.labels(name).set(status["admittedWorkloads"])
            current = obj.get("status") or {}
            state = self.queues.get(name)
            if self.kueue_objects:  # Kueue's own ClusterQueue: its status in its own shape
                status = kueue_status(
                    status, state.kueue if state else None, state.problem if state else None,
                    current, self._usage,
                )  # fmt: skip
            if all(current.get(k) == v for k, v in status.items()):
                continue
            active = state is not None and state.spec is not None
            if not active and current.get("conditions") != status["conditions"]:
                r = self.cluster_queues.resource
                await self._event(
                    {**obj, "apiVersion": f"{r.group}/{r.version}", "kind": "ClusterQueue"},
                    "InvalidSpec",
                    f"ClusterQueue {name} admits nothing: {state.problem if state else ''}",
                    warning=True,
                )
            writes.append(partial(self._write_status, self.cluster_queues.resource, name, status))
        admitted_now = {a.job_id for a in decisions.admissions}
        counts = local_queue_statuses(self.states, self.workloads, admitted_now)
        for lq_obj in self.local_queues.values():
            meta = lq_obj["metadata"]
            status = counts.get(f"{meta['namespace']}/{meta['name']}", EMPTY_LOCAL_QUEUE)
            current = lq_obj.get("status") or {}
            if all(current.get(k) == v for k, v in status.items()):
                continue
            writes.append(partial(
                self._write_status, self.local_queues.resource, meta["name"], status,
                meta["namespace"],
            ))  # fmt: skip
        await gather_writes(writes)

    async def _write_status(
        self, resource: Resource, name: str, status: Obj, namespace: str | None = None
    ) -> None:
        """A queue's status, best effort (gone or changed meanwhile: the next pass writes it)."""
        try:
            await self.kube.patch(resource, name, {"status": status}, namespace, sub="status")
        except (NotFound, Conflict):
            return
        except ApiError as exc:
            log.warning("queue status refused", extra={"queue": name, "error": str(exc)})

    async def _flag_kueue_objects(self) -> None:
        """A Warning Event, once per problem, on each ResourceFlavor, Cohort and LocalQueue
        of Kueue's that Alnair cannot honour, naming the field (the ClusterQueues that use one
        say so in their own condition)."""
        problems = kq.object_problems(
            {f["metadata"]["name"]: f for f in self.kueue_objects["flavors"].values()},
            {c["metadata"]["name"]: c for c in self.cohorts.values()},
            dict(self.local_queues.store),
        )
        for obj in self.cluster_queues.values():
            state = self.queues.get(obj["metadata"]["name"])
            if state is not None and state.kueue is not None and state.kueue.notes:
                uid = obj["metadata"].get("uid") or obj["metadata"]["name"]
                problems[uid] = (obj, "ClusterQueue", "; ".join(state.kueue.notes))
        for uid, (obj, kind, problem) in problems.items():
            if self._flagged.get(uid) == problem:
                continue
            self._flagged[uid] = problem
            about = {**obj, "apiVersion": f"{kq.GROUP}/{kq.VERSION}", "kind": kind}
            reason = "NotApplied" if kind == "ClusterQueue" else "InvalidSpec"
            await self._event(about, reason, f"not honoured: {problem}", warning=True)
        for uid in [u for u in self._flagged if u not in problems]:
            del self._flagged[uid]

    # --- explanations -------------------------------------------------------------------

    def explain(self, namespace: str, name: str, *, kind: str = "Job") -> dict[str, Any]:
        adapter: WorkloadKind = KINDS[kind]
        key = adapter.key(namespace, name)
        if kind not in self.workload_watches:
            raise NotFound(404, "NotFound", f"{kind}s are not queued on this cluster", key)
        obj = self._object(kind, f"{namespace}/{name}")
        if obj is None or not adapter.queued(obj):
            raise NotFound(404, "NotFound", f"no queued {kind} {namespace}/{name}", key)
        state = self.states.get(key) or JobState(key)
        finished = self.serving.finished(adapter, obj)
        return explanation(kind, obj, state, finished, self.policy.name)

    def describe_queues(self) -> list[dict[str, Any]]:
        return queue_descriptions(self.cluster_queues.values(), self.queues)


def _workload_of(wl: Workload) -> str:
    return workload_key(wl.features.get("model_name"), wl.features.get("batch_size"))


def _preemption_count(wl: Workload) -> int:
    """How often the dispatcher has preempted the job (its own annotation; a value edited into
    something else counts as the bound reached, so the job is not preempted again)."""
    raw = wl.annotations.get(ANN_PREEMPTIONS, "0") or "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 1_000_000
