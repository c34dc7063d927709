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
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, get_args

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.errors import InvalidValueError
from alnair.common.events import JobPhase, ScaleEvent, ScalePhase
from alnair.common.informer import Informer, LabelIndex, WatchEvent
from alnair.common.kube import (
    CLUSTERQUEUES,
    JOBS,
    LOCALQUEUES,
    NODES,
    PODS,
    TRIALJOBS,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
)
from alnair.scheduler.dispatcher.core import (
    QueueCore,
    WorkloadState,
    resource_version,
)
from alnair.scheduler.dispatcher.kinds import KINDS, SERVING, WorkloadKind, ungated_spec
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.objects import (
    ANN_ADMITTED_AT,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    ANN_NOT_READY_EVICTIONS,
    ANN_PODS_READY_AT,
    ANN_PREEMPTIONS,
    ANN_QUEUE_STATE,
    ANN_RAN,
    ANN_REQUEUE_AT,
    ANN_SELECTED_TYPE,
    ANN_TRIAL,
    LABEL_TRIAL_FOR,
    LABEL_WORKLOAD,
    Workload,
    gated,
    node_gpus,
    parse_cluster_queue,
    queue_label,
    trial_phase,
    trialjob_manifest,
    workload_label,
)
from alnair.scheduler.dispatcher.outside import Inside, OutsidePods
from alnair.scheduler.dispatcher.predictions import (
    PredictorClient,
)
from alnair.scheduler.dispatcher.resource_quota import NamespaceQuotas
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.queueing import (
    Decisions,
    GpuPool,
    JobSpec,
    QueuePolicy,
    QueueSnapshot,
    RunningJob,
    WaitKind,
    WaitReason,
    queue_policy,
)

log = logging.getLogger(__name__)
COMPONENT = "alnair-dispatcher"
CONDITION_ADMITTED = "alnair.io/Admitted"
WAIT_KINDS = get_args(WaitKind)
SURPLUS = "#surplus"


def build_policy(settings: DispatcherSettings) -> QueuePolicy:
    """The configured queueing policy, with the options it takes from the settings."""
    if settings.policy.lower() == "alnair":
        return queue_policy("alnair", max_wait_s=settings.max_wait_s)
    return queue_policy(settings.policy)


def _camel(kind: str) -> str:
    """A wait kind as a condition reason (`fair_share` -> `FairShare`)."""
    return "".join(part.capitalize() for part in kind.split("_"))


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


def _epoch(ts: str | None) -> float:
    if not ts:
        return time.time()
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass(slots=True)
class JobState(WorkloadState):
    """What the dispatcher knows about one queued workload, beyond what the core keeps."""

    position: int | None = None
    predicted_start_s: float | None = None
    predicted_finish_s: float | None = None
    admitted_type: str | None = None
    invalid: str | None = None
    refused: str | None = None
    """The last refusal said in an Event (said again only when it changes)."""


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
        self.members = LabelIndex(self.serving_pods, LABEL_WORKLOAD)
        watching.append(self.serving_pods)
        # Every bound pod holding GPUs, to take those no admitted workload owns off the pool.
        self.outside = OutsidePods(kube, self._wake.set)
        watching.append(self.outside.informer)
        # Namespaces' ResourceQuotas, asked before admitting (a change wakes it: room freed).
        self.quotas = NamespaceQuotas(kube)
        watching.append(self.quotas.informer)
        self.workloads: dict[str, Workload] = {}
        self.states: dict[str, JobState] = {}
        self.last_decisions = Decisions()
        self._deadline: asyncio.TimerHandle | None = None
        self.informers = (
            self.cluster_queues,
            self.local_queues,
            self.cohorts,
            self.nodes,
            self.trials,
            *watching,
        )
        for informer in (self.local_queues, self.cohorts, self.trials, *watching):
            informer.add_handler(self._poke)
        self.cluster_queues.add_handler(self._on_queue)
        self.nodes.add_handler(self._on_node)

    # --- wake-ups -----------------------------------------------------------------------

    def _poke(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        # A deleted workload's state goes in the reconcile this wakes (it keeps only live
        # keys), never here: a reconcile in flight may still hold it.
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
        for run in running:
            used[run.gpu_type] += run.gpus
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
        return JobSpec(
            id=wl.key,
            queue=cq,
            gpus=wl.request.gpus,
            arrival_s=arrival_s,
            runtime=dict(prediction.runtime) if prediction else {},
            team=wl.namespace,
            gpu_model=wl.gpu_model,
            priority=int(
                ((wl.obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("priority")
                or 0
            ),
            peak_memory_mib=peak,
            restart_cost_s=wl.restart_cost_s,
            preemptions=_preemption_count(wl),
            waited_s=max(0.0, until_s - arrival_s - _ran_s(wl)),
        )

    async def reconcile(self) -> None:
        started = time.perf_counter()
        self.reconciles += 1
        queues = self._read_queues()
        now = time.time()
        pending: list[JobSpec] = []
        running: list[RunningJob] = []
        workloads: dict[str, Workload] = {}
        pending_ws: list[Workload] = []
        live_keys: set[str] = set()
        deadlines: list[float] = []  # when a pods-ready timeout or a backoff ends
        ours: list[Workload] = []  # admitted or held: pods they own are the queues' concern
        self.quotas.begin()  # (ResourceQuota room: what is admitted is charged below)
        queued = [
            (obj if KINDS[name].writable else self._with_admission(KINDS[name], obj), KINDS[name])
            for name in self.workload_watches
            for obj in self._objects(name).values()
            if KINDS[name].queued(obj)
        ]
        for obj, kind in queued:
            meta = obj["metadata"]
            key = kind.key_of(obj)
            live_keys.add(key)
            state = self.states.setdefault(key, JobState(key))
            if self._finished(kind, obj) is not None:
                self.states.pop(key, None)  # bounded: a finished job needs nothing from us
                continue
            try:
                seen = kind.resolve(obj, self._lookup) if kind.resolve is not None else obj
                wl = kind.parse(seen, self.settings.default_restart_cost_s)
            except InvalidValueError as exc:
                if state.invalid != str(exc):
                    state.invalid = str(exc)
                    await self._event(
                        kind.ref(obj), "InvalidRequest", f"not queued: {exc}", warning=True
                    )
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
                if await self._pods_not_ready(wl, kind, start, now, deadlines):
                    continue  # its admission was taken back: it holds nothing now
                self.quotas.charge(wl)
                if kind.kind in SERVING:
                    await self._ungate(wl, admitted)
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
            backoff = self._backing_off(wl, now)
            if backoff is not None:
                state.reason = WaitReason("queue", backoff[0])
                await self._wait_event(wl, state)
                if backoff[1] is not None:
                    deadlines.append(backoff[1])
                continue
            if kind.members_first and len(self._serving_pods_of(wl)) < wl.request.pods:
                present = len(self._serving_pods_of(wl))
                state.reason = WaitReason(
                    "queue", f"{present} of its {wl.request.pods} pods exist; admitted when all do"
                )
                await self._wait_event(wl, state)
                continue
            if cq is None:
                state.reason = WaitReason(
                    "queue", f"LocalQueue {wl.namespace}/{wl.local_queue} does not exist"
                )
                await self._wait_event(wl, state)
                continue
            if cq not in queues:
                problem = self.queues.get(cq)
                why = problem.problem if problem and problem.problem else "does not exist"
                state.reason = WaitReason("queue", f"ClusterQueue {cq} is inactive: {why}")
                await self._wait_event(wl, state)
                continue
            pending_ws.append(wl)
            if "submitted" not in state.evented:
                state.evented.add("submitted")
                await self._publish(wl, JobPhase.SUBMITTED, {"queue": cq})
        for key in [k for k in self.states if k not in live_keys]:
            del self.states[key]
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
                await self._wait_event(wl, state)
                continue
            if await self._cold_start(wl, state):
                await self._wait_event(wl, state)
                continue
            if self._over_resource_quota(wl, state):
                await self._wait_event(wl, state)
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
            now_s=now, pending=pending, running=running, queues=queues, capacity=capacity
        )
        decisions = self.policy.decide(snapshot)
        self.last_decisions = decisions
        await self._apply(decisions, snapshot, workloads)
        await self._write_queue_status(snapshot, decisions)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    def _over_resource_quota(self, wl: Workload, state: JobState) -> bool:
        """Whether the namespace's ResourceQuota would refuse the workload's pods now, given
        what is admitted there (`resource_quota.py`); the reason goes on its state."""
        problem = self.quotas.shortfall(wl)
        if problem is None:
            return False
        state.reason = WaitReason("resource_quota", problem)
        return True

    async def _cold_start(self, wl: Workload, state: JobState) -> bool:
        """Hold a job the predictor never measured on some GPU model until its TrialJob has
        run there (seed 004: an unseen model gets GPUs first to collect data). True: it waits.
        """
        prediction = state.prediction
        chosen = wl.annotations.get(ANN_TRIAL)
        if chosen == "skip" or not self.settings.trials or not KINDS[wl.kind].writable:
            return False
        if chosen:
            trial = self.trials.get(f"{wl.namespace}/{chosen}")
            phase = trial_phase(trial)
            if trial is None or phase in ("Succeeded", "Failed"):
                return False  # measured, could not be, or deleted: decide on what is known
            state.reason = WaitReason(
                "prediction", f"trial run {chosen} is measuring the job ({phase or 'Pending'})"
            )
            return True
        if prediction is None or not prediction.needs_trial:
            return False
        name = f"{wl.name[:50]}-trial"
        models = list(prediction.unmeasured_models)
        manifest = trialjob_manifest(wl, name, models, self.settings.trial_duration_s)
        try:
            created = await self.kube.create(TRIALJOBS, manifest, wl.namespace)
            # Known at once, before its watch event arrives (the next reconcile looks for it).
            self.trials.store.setdefault(f"{wl.namespace}/{name}", created)
        except Conflict:
            pass  # created by an earlier run of ours that died before annotating the Job
        except ApiError as exc:
            log.warning("trial not created", extra={"job": wl.key, "error": str(exc)})
            return False
        annotate = {"metadata": {"annotations": {ANN_TRIAL: name}}}
        updated = await self._note(wl, annotate)
        if updated is not None:
            self._remember(wl, updated)
        await self._event(
            wl.ref(), "TrialStarted",
            f"never measured on {', '.join(models)}: trial run {name} (1 GPU each, "
            f"{self.settings.trial_duration_s} s) before admission",
        )  # fmt: skip
        state.reason = WaitReason("prediction", f"trial run {name} started on {', '.join(models)}")
        return True

    # --- applying decisions ---------------------------------------------------------------

    async def _shrink(self, wl: Workload, reason: str, for_job: str) -> None:
        """Ask the elastic controller to give back the workers above the minimum."""
        if self.bus is None:
            log.warning("cannot reclaim elastic surplus without NATS", extra={"job": wl.key})
            return
        low = int((wl.obj.get("spec") or {}).get("minReplicas", 1))
        current = int((wl.obj.get("status") or {}).get("currentReplicas", 0))
        event = ScaleEvent(
            phase=ScalePhase.REQUESTED, namespace=wl.namespace, job=wl.name, replicas=low,
            previous_replicas=current, reason=f"{for_job}: {reason}",
        )  # fmt: skip
        try:
            await self.bus.publish(
                event, source=COMPONENT, event_id=f"{wl.uid}:shrink:{resource_version(wl.obj)}"
            )
        except Exception as exc:
            log.warning("scale request not published", extra={"job": wl.key, "error": repr(exc)})
            return
        await self._event(
            wl.ref(), "Shrinking", f"asked to shrink to {low} workers for {for_job}: {reason}"
        )

    async def _apply(
        self, decisions: Decisions, snapshot: QueueSnapshot, workloads: dict[str, Workload]
    ) -> None:
        policy = self.policy.name
        for pre in decisions.preemptions:
            wl = workloads.get(pre.job_id)
            self.fence(f"preemption of {pre.job_id}")
            if wl is not None and pre.job_id.endswith(SURPLUS):
                await self._shrink(wl, pre.reason, pre.for_job_id)
            elif wl is not None:
                await self._preempt(wl, pre.reason, pre.for_job_id)
                self.metrics.decisions.labels(policy, "preempted").inc()
        by_id = {j.id: j for j in snapshot.pending}
        for adm in decisions.admissions:
            wl = workloads.get(adm.job_id)
            if wl is None:
                continue
            job = by_id[adm.job_id]
            state = self.states.get(wl.key)
            if state is not None and self._over_resource_quota(wl, state):
                await self._wait_event(wl, state)  # room an earlier admission just took
                continue
            self.fence(f"admission of {adm.job_id}")
            if await self._admit(wl, job, adm.gpu_type, adm.borrowing, snapshot.now_s):
                self.quotas.charge(wl)
                self.metrics.decisions.labels(
                    policy, "borrowing" if adm.borrowing else "admitted"
                ).inc()
                self.metrics.wait_seconds.labels(job.queue).observe(
                    max(0.0, snapshot.now_s - job.arrival_s)
                )
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
            await self._wait_event(wl, state)
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

    async def _admit(
        self, wl: Workload, job: JobSpec, gpu_type: str, borrowing: bool, now_s: float
    ) -> bool:
        meta = wl.obj["metadata"]
        annotations = {
            ANN_ADMITTED_TYPE: gpu_type,
            ANN_SELECTED_TYPE: gpu_type,
            ANN_ADMITTED_AT: f"{now_s:.3f}",
            ANN_BORROWING: "true" if borrowing else "false",
            ANN_QUEUE_STATE: "admitted",
        }
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations},
            "spec": KINDS[wl.kind].release(wl, gpu_type),
        }
        if not KINDS[wl.kind].writable:
            # A serving workload: its admission is its pods', written as their gates come off.
            if not await self._ungate(wl, gpu_type, annotations):
                return False  # no pod yet to carry it: decided again when they come
            updated = wl.ref()
        try:
            if KINDS[wl.kind].writable:
                updated = await self.kube.patch(wl.resource, wl.name, patch, wl.namespace)
        except Conflict:
            self.metrics.write_conflicts.inc()
            self._wake.set()  # decide again on the newer Job
            return False
        except NotFound:
            return False
        except ApiError as exc:
            await self._refused(wl, "AdmissionFailed", "could not admit it", exc)
            return False
        # Our own write is the newest state of the Job: the next reconcile must not decide on
        # the informer's older copy while the watch event is still on its way.
        if KINDS[wl.kind].writable:
            self._remember(wl, updated)
        state = self.states.setdefault(wl.key, JobState(wl.key))
        state.admitted_type = gpu_type
        state.reason = None
        state.reason_evented = None
        state.position = None
        state.predicted_start_s = now_s
        estimate = job.runtime.get(gpu_type)
        state.predicted_finish_s = now_s + estimate.expected_s if estimate else None
        runtime = f"; predicted runtime {estimate.expected_s:.0f} s" if estimate else ""
        where = f"{job.gpus} x {gpu_type}" + (" (borrowed quota)" if borrowing else "")
        message = f"admitted by ClusterQueue {job.queue} on {where}{runtime}"
        await self._event(updated, "Admitted", message)
        await self._condition(wl, "True", "Admitted", message)
        await self._publish(
            wl,
            JobPhase.ADMITTED,
            {"queue": job.queue, "gpu_model": gpu_type, "gpus": job.gpus, "borrowing": borrowing},
            seq=meta["resourceVersion"],
        )
        return True

    async def _preempt(
        self, wl: Workload, reason: str, for_job: str, *,
        cause: str = "Preempted", extra: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Take the workload's admission back: suspended (or evicted, by kind), its run time
        kept, `extra` annotations written with it, the `cause` said in an Event."""
        if KINDS[wl.kind].reclaim == "evict":
            await self._evict(wl, reason, for_job, cause=cause)
            return
        meta = wl.obj["metadata"]
        count = int(wl.annotations.get(ANN_PREEMPTIONS, "0") or 0) + 1
        # The time this run lasted joins the job's run time, so its wait (for the policy's
        # wait credit and bound) counts only time not running.
        started = wl.annotations.get(ANN_ADMITTED_AT)
        ran = _ran_s(wl) + (max(0.0, time.time() - float(started)) if started else 0.0)
        # Only `suspend`: the API server refuses template changes on a Job that has started.
        # Our node selector stays (recorded in ANN_SELECTED_TYPE, so it is not read as the
        # user's constraint) and is overwritten by the next admission.
        if KINDS[wl.kind].reclaim == "regate":
            # Evicted whole: its pods (and the admission they carry) go; the ones its
            # controller makes again are gated until it is admitted again.
            await self._delete_pods(wl)
            await self._preempted(wl, wl.ref(), "evicted whole", reason, for_job, 0, cause)
            return
        spec: Obj = KINDS[wl.kind].suspension or {"suspend": True}
        patch = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {
                    ANN_PREEMPTIONS: str(count),
                    ANN_RAN: f"{ran:.0f}",
                    ANN_ADMITTED_TYPE: None,
                    ANN_ADMITTED_AT: None,
                    ANN_BORROWING: None,
                    ANN_PODS_READY_AT: None,
                    ANN_QUEUE_STATE: f"preempted: {reason}",
                    **(extra or {}),
                },
            },
            "spec": spec,
        }
        try:
            updated = await self.kube.patch(wl.resource, wl.name, patch, wl.namespace)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self._wake.set()
            return
        except ApiError as exc:
            await self._refused(wl, "PreemptionFailed", f"could not suspend it for {for_job}", exc)
            return
        await self._preempted(wl, updated, "suspended", reason, for_job, count, cause)

    def _finished(self, kind: WorkloadKind, obj: Obj) -> str | None:
        """Whether the workload finished, by its object or, for a kind whose object does not
        say (a PodGroup), by its pods."""
        if kind.finished_by_pods is not None:
            meta = obj["metadata"]
            return kind.finished_by_pods(obj, self._pods_of(kind.kind, meta["namespace"],
                                                           meta["name"]))  # fmt: skip
        return kind.finished(obj)

    def _pods_of(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Every pod the serving workload's controller made (gated or not, leaving or not)."""
        return self.members.get(namespace, workload_label(kind, name))

    def _serving_pods_of(self, wl: Workload) -> list[Obj]:
        """The pods of a serving workload its controller made (gated or not), not leaving."""
        return [
            pod
            for pod in self._pods_of(wl.kind, wl.namespace, wl.name)
            if not pod["metadata"].get("deletionTimestamp")
        ]

    async def _ungate(
        self, wl: Workload, gpu_type: str, admission: dict[str, str] | None = None
    ) -> bool:
        """Take the gates off an admitted serving workload's pods, each given the model's node
        selector and the admission record: the ones there at admission, and each its
        controller makes later (a restart, a rollout), up to the replicas it was admitted for.
        True when a pod carries the admission now."""
        record = admission or {k: v for k, v in wl.annotations.items() if k in ADMISSION_RECORD}
        pods = self._serving_pods_of(wl)
        running = sum(1 for p in pods if not gated(p))
        room = max(0, wl.request.pods - running)
        carried = running > 0 and admission is None
        for pod in [p for p in pods if gated(p)][:room]:
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "annotations": record,
                },
                "spec": ungated_spec(pod, gpu_type),
            }
            try:
                updated = await self.kube.patch(PODS, pod["metadata"]["name"], patch, wl.namespace)
            except (Conflict, NotFound):
                self._wake.set()
                continue
            except ApiError as exc:
                await self._refused(wl, "AdmissionFailed", "could not ungate its pod", exc)
                continue
            self.serving_pods.store[f"{wl.namespace}/{pod['metadata']['name']}"] = updated
            carried = True
        return carried

    def _with_admission(self, kind: WorkloadKind, obj: Obj) -> Obj:
        """A serving workload as admitted or not: the admission record its ungated pods
        carry (never annotations on the object itself, which anyone could write)."""
        meta = obj["metadata"]
        own = {k: v for k, v in (meta.get("annotations") or {}).items()
               if k not in ADMISSION_RECORD}  # fmt: skip
        for pod in self._pods_of(kind.kind, meta["namespace"], meta["name"]):
            pm = pod["metadata"]
            if not gated(pod) and ANN_ADMITTED_TYPE in (pm.get("annotations") or {}):
                record = {k: v for k, v in pm["annotations"].items() if k in ADMISSION_RECORD}
                return {**obj, "metadata": {**meta, "annotations": {**own, **record}}}
        return {**obj, "metadata": {**meta, "annotations": own}}

    async def _delete_pods(self, wl: Workload) -> None:
        for pod in self._serving_pods_of(wl):
            meta = pod["metadata"]
            try:
                await self.kube.delete(
                    PODS, meta["name"], wl.namespace, preconditions_uid=meta.get("uid")
                )
            except (Conflict, NotFound):
                continue
            except ApiError as exc:
                await self._refused(wl, "PreemptionFailed", "could not evict its pod", exc)

    async def _evict(self, wl: Workload, reason: str, for_job: str, *, cause: str) -> None:
        """Reclaim a workload that cannot be held again (a Pod: its gate cannot come back):
        delete it, this very object (its uid), and say why on it."""
        try:
            await self.kube.delete(wl.resource, wl.name, wl.namespace, preconditions_uid=wl.uid)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self._wake.set()
            return
        except ApiError as exc:
            await self._refused(wl, "PreemptionFailed", f"could not evict it for {for_job}", exc)
            return
        count = int(wl.annotations.get(ANN_PREEMPTIONS, "0") or 0) + 1
        await self._preempted(wl, wl.ref(), "evicted", reason, for_job, count, cause)

    async def _preempted(
        self, wl: Workload, obj: Obj, how: str, reason: str, for_job: str, count: int,
        cause: str,
    ) -> None:  # fmt: skip
        """What follows a reclaim, however it was done (`how`): no longer admitted, and said
        so on the workload (Event, condition) and on the bus."""
        state = self.states.get(wl.key)
        if state is not None:
            state.admitted_type = None
        message = f"{how} for {for_job}: {reason}"
        await self._event(obj, cause, message, warning=True)
        await self._condition(wl, "False", cause, message)
        await self._publish(
            wl, JobPhase.PREEMPTED, {"reason": reason, "for": for_job}, seq=str(count)
        )

    async def _wait_event(self, wl: Workload, state: JobState) -> None:
        """One Event per change of wait reason (not per reconcile), and the reason on the Job."""
        if state.reason is None:
            return
        text = f"{state.reason.kind}: {state.reason.message}"
        if state.reason_evented == state.reason.kind:
            return
        state.reason_evented = state.reason.kind
        warning = state.reason.kind in ("queue", "prediction")
        reason = "QueueNotFound" if state.reason.kind == "queue" else "Waiting"
        await self._event(wl.ref(), reason, f"waiting ({text})", warning=warning)
        note = {"metadata": {"annotations": {ANN_QUEUE_STATE: f"waiting: {text}"[:512]}}}
        await self._note(wl, note)
        await self._condition(wl, "False", _camel(state.reason.kind), state.reason.message)

    def _wake_at(self, when: float | None) -> None:
        """One reconcile at `when` (epoch seconds): a deadline no event announces, the end of a
        pods-ready timeout or of a backoff. Not a poll: nothing is looked at before it."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if when is not None:
            delay = max(0.0, when - time.time()) + 0.05
            self._deadline = asyncio.get_running_loop().call_later(delay, self._wake.set)

    async def _pods_not_ready(
        self, wl: Workload, kind: WorkloadKind, admitted_at: float, now: float,
        deadlines: list[float],
    ) -> bool:  # fmt: skip
        """Kueue's waitForPodsReady: an admitted workload whose pods are not all ready within
        `pods_ready_timeout_s` gives its quota back and is queued again (after a backoff of
        one timeout); after `pods_ready_retries` such tries it stays out until someone looks.
        True when its admission was taken back now."""
        timeout = self.settings.pods_ready_timeout_s
        if not timeout or not kind.writable or ANN_PODS_READY_AT in wl.annotations:
            return False  # (serving workloads run for good: nothing records "was ready")
        if kind.ready(wl):
            updated = await self._note(
                wl, {"metadata": {"annotations": {ANN_PODS_READY_AT: f"{now:.3f}"}}}
            )
            if updated is not None:
                self._remember(wl, updated)
            return False
        if now < admitted_at + timeout:
            deadlines.append(admitted_at + timeout)
            return False
        tries = _count(wl.annotations.get(ANN_NOT_READY_EVICTIONS)) + 1
        self.metrics.not_ready_evictions.inc()
        await self._preempt(
            wl, f"its pods were not all ready {timeout:.0f} s after admission "
            f"(try {tries} of {self.settings.pods_ready_retries})", "its queue",
            cause="PodsNotReady",
            extra={ANN_NOT_READY_EVICTIONS: str(tries),
                   ANN_REQUEUE_AT: f"{now + timeout:.3f}"},
        )  # fmt: skip
        return True

    def _backing_off(self, wl: Workload, now: float) -> tuple[str, float | None] | None:
        """Why a held workload is not queued yet after its pods were not ready (and until
        when), or None when it is queued."""
        tries = _count(wl.annotations.get(ANN_NOT_READY_EVICTIONS))
        if not tries:
            return None
        if tries >= self.settings.pods_ready_retries:
            return (
                f"deactivated: its pods were not all ready after {tries} admissions; remove "
                f"the annotation {ANN_NOT_READY_EVICTIONS} to queue it again",
                None,
            )
        until = _float(wl.annotations.get(ANN_REQUEUE_AT))
        if until is not None and until > now:
            return f"backing off after its pods were not ready, until {until:.0f}", until
        return None

    async def _note(self, wl: Workload, patch: Obj) -> Obj | None:
        """An annotation on the workload, best effort: gone or changed meanwhile is nothing,
        and one the API server refuses is logged, never a reason to stop the queue."""
        if not KINDS[wl.kind].writable:
            return None  # never written (its Events say the same)
        try:
            return await self.kube.patch(wl.resource, wl.name, patch, wl.namespace)
        except (NotFound, Conflict):
            return None
        except ApiError as exc:
            log.warning("annotation refused", extra={"job": wl.key, "error": str(exc)})
            return None

    async def _refused(self, wl: Workload, reason: str, what: str, exc: ApiError) -> None:
        """The API server refused a decision on one workload (a 422, a policy's 403): said on
        it, and the rest of the queue goes on. The next reconcile decides again."""
        self.metrics.write_refusals.inc()
        log.warning(what, extra={"job": wl.key, "error": str(exc)})
        message = f"{what}: {exc}"[:1024]
        state = self.states.get(wl.key)
        if state is not None and state.refused == message:
            return  # said once: the same refusal at each reconcile is not news
        if state is not None:
            state.refused = message
        await self._event(wl.ref(), reason, message, warning=True)

    async def _condition(self, wl: Workload, status: str, reason: str, message: str) -> None:
        """The `alnair.io/Admitted` condition on the Job's status (`kubectl describe job`):
        False with the wait reason while queued, True once admitted. An ElasticJob's conditions
        belong to its controller (a merge patch would replace them): Events and annotations."""
        if not KINDS[wl.kind].writes_conditions:
            return
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": CONDITION_ADMITTED, "status": status, "reason": reason,
            "message": message[:1024], "lastTransitionTime": ts, "lastProbeTime": ts,
        }  # fmt: skip
        try:
            await self.kube.patch(
                JOBS, wl.name, {"status": {"conditions": [cond]}}, wl.namespace,
                patch_type="strategic", sub="status",
            )  # fmt: skip
        except (NotFound, Conflict):
            return
        except ApiError as exc:
            log.warning("condition not written", extra={"job": wl.key, "error": str(exc)})

    async def _write_queue_status(self, snapshot: QueueSnapshot, decisions: Decisions) -> None:
        admitted_now = {a.job_id: a for a in decisions.admissions}
        pending: Counter[str] = Counter(
            j.queue for j in snapshot.pending if j.id not in admitted_now
        )
        admitted: Counter[str] = Counter(r.job.queue for r in snapshot.running)
        used: dict[str, Counter[str]] = {}
        borrowed: Counter[str] = Counter()
        for run in snapshot.running:
            used.setdefault(run.job.queue, Counter())[run.gpu_type] += run.gpus
            if run.borrowing:
                borrowed[run.job.queue] += run.gpus
        by_id = {j.id: j for j in snapshot.pending}
        for adm in decisions.admissions:
            queue = by_id[adm.job_id].queue
            admitted[queue] += 1
            used.setdefault(queue, Counter())[adm.gpu_type] += adm.gpus
            if adm.borrowing:
                borrowed[queue] += adm.gpus
        for obj in self.cluster_queues.values():
            name = obj["metadata"]["name"]
            state = self.queues.get(name)
            active = state is not None and state.spec is not None
            flavors = used.get(name, Counter())
            status = {
                "pendingWorkloads": pending[name],
                "admittedWorkloads": admitted[name],
                "usedGPUs": sum(flavors.values()),
                "borrowedGPUs": borrowed[name],
                "flavorsUsage": [
                    {"name": m, "total": n, "borrowed": 0} for m, n in sorted(flavors.items())
                ],
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True" if active else "False",
                        "reason": "Ready" if active else "InvalidSpec",
                        "message": "" if active else (state.problem if state else "") or "",
                    }
                ],
            }
            self.metrics.queue_depth.labels(name).set(pending[name])
            self.metrics.admitted.labels(name).set(admitted[name])
            current = obj.get("status") or {}
            if all(current.get(k) == v for k, v in status.items()):
                continue
            if not active and current.get("conditions") != status["conditions"]:
                await self._event(
                    {**obj, "apiVersion": "alnair.io/v1alpha1", "kind": "ClusterQueue"},
                    "InvalidSpec",
                    f"ClusterQueue {name} admits nothing: {state.problem if state else ''}",
                    warning=True,
                )
            try:
                await self.kube.patch(CLUSTERQUEUES, name, {"status": status}, sub="status")
            except (NotFound, Conflict):
                continue
            except ApiError as exc:
                log.warning("queue status refused", extra={"queue": name, "error": str(exc)})
        lq_pending: Counter[str] = Counter()
        lq_admitted: Counter[str] = Counter()
        for key, job_state in self.states.items():
            known = self.workloads.get(key)
            if known is None:
                continue
            lq = f"{known.namespace}/{known.local_queue}"
            if job_state.admitted_type is not None or key in admitted_now:
                lq_admitted[lq] += 1
            elif job_state.invalid is None:
                lq_pending[lq] += 1
        for lq_obj in self.local_queues.values():
            key = f"{lq_obj['metadata']['namespace']}/{lq_obj['metadata']['name']}"
            status = {"pendingWorkloads": lq_pending[key], "admittedWorkloads": lq_admitted[key]}
            current = lq_obj.get("status") or {}
            if all(current.get(k) == v for k, v in status.items()):
                continue
            try:
                await self.kube.patch(
                    LOCALQUEUES,
                    lq_obj["metadata"]["name"],
                    {"status": status},
                    lq_obj["metadata"]["namespace"],
                    sub="status",
                )
            except (NotFound, Conflict):
                continue
            except ApiError as exc:
                log.warning("queue status refused", extra={"error": str(exc)})

    # --- explanations -------------------------------------------------------------------

    def explain(self, namespace: str, name: str, *, kind: str = "Job") -> dict[str, Any]:
        adapter: WorkloadKind = KINDS[kind]
        key = adapter.key(namespace, name)
        if kind not in self.workload_watches:
            raise NotFound(404, "NotFound", f"{kind}s are not queued on this cluster", key)
        obj = self._objects(kind).get(f"{namespace}/{name}")
        if obj is None or not adapter.queued(obj):
            raise NotFound(404, "NotFound", f"no queued {kind} {namespace}/{name}", key)
        state = self.states.get(key) or JobState(key)
        finished = self._finished(adapter, obj)
        if finished:
            status = finished.lower()
        elif state.invalid:
            status = "invalid"
        elif state.admitted_type:
            status = "admitted"
        else:
            status = "waiting"
        prediction = state.prediction
        return {
            "job": f"{namespace}/{name}",
            "kind": kind,
            "status": status,
            "queue": queue_label(obj["metadata"]) or (obj.get("spec") or {}).get("queue"),
            "cluster_queue": state.cluster_queue,
            "policy": self.policy.name,
            "position": state.position if status == "waiting" else None,
            "gpu_model": state.admitted_type,
            "reason": (
                {"kind": state.reason.kind, "message": state.reason.message}
                if state.reason and status == "waiting"
                else ({"kind": "invalid", "message": state.invalid} if state.invalid else None)
            ),
            "predicted_start_s": state.predicted_start_s,
            "predicted_finish_s": state.predicted_finish_s,
            "prediction": (
                {
                    "runtime_s": {t: e.expected_s for t, e in prediction.runtime.items()},
                    "runtime_upper_s": {t: e.upper_s for t, e in prediction.runtime.items()},
                    "peak_memory_mib": prediction.peak_memory_mib,
                    "low_confidence": prediction.low_confidence,
                    "model_version": prediction.model_version,
                }
                if prediction
                else None
            ),
            "prediction_error": state.prediction_error,
            "annotations": {
                k: v
                for k, v in (obj["metadata"].get("annotations") or {}).items()
                if k.startswith("alnair.io/")
            },
        }

    def describe_queues(self) -> list[dict[str, Any]]:
        out = []
        for obj in self.cluster_queues.values():
            name = obj["metadata"]["name"]
            state = self.queues.get(name)
            out.append(
                {
                    "name": name,
                    "active": bool(state and state.spec),
                    "problem": state.problem if state else None,
                    "status": obj.get("status") or {},
                }
            )
        return out


ADMISSION_RECORD = frozenset({ANN_ADMITTED_TYPE, ANN_ADMITTED_AT, ANN_BORROWING})
"""What a serving workload's pods carry of its admission."""


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


def _ran_s(wl: Workload) -> float:
    """Seconds the job ran in runs the dispatcher preempted (its own annotation; a value
    edited into nonsense counts as 0)."""
    try:
        ran = float(wl.annotations.get(ANN_RAN, "0") or 0)
    except ValueError:
        return 0.0
    return ran if math.isfinite(ran) and ran >= 0 else 0.0


def _preemption_count(wl: Workload) -> int:
    """How often the dispatcher has preempted the job (its own annotation; a value edited into
    something else counts as the bound reached, so the job is not preempted again)."""
    raw = wl.annotations.get(ANN_PREEMPTIONS, "0") or "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 1_000_000
