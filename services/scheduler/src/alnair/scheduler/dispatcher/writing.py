"""Every write the dispatcher makes on a queued workload, its pods and the bus, in one place:
admitting (a patch that releases it, or its pods ungated), reclaiming (suspended, evicted, or
evicted whole and gated again), shrinking an elastic job, and saying why on it (Events, the
`alnair.io/Admitted` condition, the queue-state annotation, bus events).

Each write is isolated: a conflict or a workload gone meanwhile wakes the loop to decide again
on the newer copy; a refusal by the API server (a 422, a policy's 403) is said on that workload
and counted, and the rest of the queue goes on. The decisions themselves are the policy's
(`alnair.scheduler.queueing`); which to apply, and when, is the reconcile loop's
(`controller.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from alnair.common.bus import Bus
from alnair.common.events import JobPhase, ScaleEvent, ScalePhase
from alnair.common.kube import JOBS, PODS, ApiError, Conflict, KubeClient, NotFound, Obj
from alnair.common.progress import ANN_PREEMPTIONS, from_annotations
from alnair.scheduler.dispatcher.core import WorkloadState, resource_version
from alnair.scheduler.dispatcher.kinds import KINDS
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_AT,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    ANN_FLAVORS,
    ANN_PODS_READY_AT,
    ANN_QUEUE_STATE,
    ANN_RAN,
    ANN_SELECTED_TYPE,
    GPU,
    NO_GPU,
    Workload,
    gated,
)
from alnair.scheduler.dispatcher.progressing import ANN_RESUMED_STEP, PlannedProgress
from alnair.scheduler.dispatcher.serving import ADMISSION_RECORD, ServingPods
from alnair.scheduler.dispatcher.sharing import Sharing
from alnair.scheduler.dispatcher.workload_kind import ungated_spec
from alnair.scheduler.queueing import JobSpec

log = logging.getLogger(__name__)
COMPONENT = "alnair-dispatcher"
CONDITION_ADMITTED = "alnair.io/Admitted"
T = TypeVar("T")
WRITES_IN_FLIGHT = 16
"""Writes on distinct workloads a reconcile keeps in flight at once (`WorkloadWriter.flush`)."""


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
    progress: PlannedProgress | None = None
    """How far it got, as last planned with (`progressing`)."""
    sharing: dict[str, Sharing | None] | None = None
    """A waiting fraction, per GPU model: the shared GPU it would most likely join (None:
    alone), whose slowdown its planned runtime includes (`sharing`)."""
    note: str | None = None
    """Why the plan left this running job where it is (a move not worth its restart)."""


class PostEvent(Protocol):
    def __call__(
        self, obj: Obj, reason: str, message: str, *, warning: bool = False
    ) -> Awaitable[None]: ...


class Publish(Protocol):
    def __call__(
        self, wl: Workload, phase: JobPhase, detail: dict[str, Any], seq: str = "0"
    ) -> Awaitable[None]: ...


class WorkloadWriter:
    """Writes decisions onto workloads. `states` is the loop's (shared, not copied); `remember`
    puts an object just written into the informers' stores; `wake` asks for a reconcile."""

    def __init__(
        self,
        kube: KubeClient,
        metrics: DispatcherMetrics,
        states: dict[str, JobState],
        serving: ServingPods,
        *,
        bus: Bus | None,
        event: PostEvent,
        publish: Publish,
        remember: Callable[[Workload, Obj], None],
        wake: Callable[[], None],
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.states = states
        self.serving = serving
        self.bus = bus
        self.event = event
        self.publish = publish
        self.remember = remember
        self.wake = wake
        self._deferred: list[Callable[[], Awaitable[Any]]] | None = None

    async def shrink(self, wl: Workload, reason: str, for_job: str) -> None:
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
        await self.event(
            wl.ref(), "Shrinking", f"asked to shrink to {low} workers for {for_job}: {reason}"
        )

    async def admit(
        self, wl: Workload, job: JobSpec, gpu_type: str, borrowing: bool, now_s: float,
        flavors: Mapping[str, str] | None = None,
    ) -> bool:  # fmt: skip
        """Release the workload on `gpu_type` (its quota over other resources counted in
        `flavors`, Kueue's queues); whether it was written."""
        meta = wl.obj["metadata"]
        annotations = {
            ANN_ADMITTED_TYPE: gpu_type,
            ANN_SELECTED_TYPE: gpu_type,
            ANN_ADMITTED_AT: f"{now_s:.3f}",
            ANN_BORROWING: "true" if borrowing else "false",
            ANN_QUEUE_STATE: "admitted",
        }
        reported = from_annotations(wl.annotations)
        if reported is not None:
            # This run starts from the last checkpoint: what it has left is fixed now.
            annotations[ANN_RESUMED_STEP] = str(reported.checkpoint or 0)
        if flavors:
            annotations[ANN_FLAVORS] = json.dumps(
                {r: f for r, f in flavors.items() if r != GPU}, sort_keys=True
            )
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations},
            "spec": KINDS[wl.kind].release(wl, gpu_type),
        }
        estimate = job.runtime.get(gpu_type)
        runtime = f"; predicted runtime {estimate.expected_s:.0f} s" if estimate else ""
        if estimate and reported is not None and reported.checkpoint and reported.total:
            runtime += f" (resumes at step {reported.checkpoint} of {reported.total})"
        where = f"{job.gpus} x {gpu_type}" + (" (borrowed quota)" if borrowing else "")
        message = f"admitted by ClusterQueue {job.queue} on {where}{runtime}"
        writes = KINDS[wl.kind].status_writes
        if not KINDS[wl.kind].writable:
            # A serving workload: its admission is its pods', written as their gates come off.
            if not await self.ungate(wl, gpu_type, annotations):
                return False  # no pod yet to carry it: decided again when they come
            updated = wl.ref()
        else:
            if writes is not None:  # its admission is its own status
                assigned = {GPU: gpu_type, **(flavors or {})}
                patch = self._status_patch(wl, writes.admitted(wl, job.queue, assigned, message))
            written = await self._write_admission(wl, patch)
            if written is None:
                return False
            updated = written
        await self._admitted(
            wl, updated, gpu_type, now_s,
            finish_s=now_s + estimate.expected_s if estimate else None,
            message=message,
            detail={"queue": job.queue, "gpu_model": gpu_type, "gpus": job.gpus,
                    "borrowing": borrowing},
        )  # fmt: skip
        return True

    async def admit_plain(
        self, wl: Workload, queue: str, flavors: Mapping[str, str], now_s: float
    ) -> bool:
        """Release a workload that asks no GPU (a Job), its quota counted in `flavors`."""
        meta = wl.obj["metadata"]
        annotations = {
            ANN_ADMITTED_TYPE: NO_GPU,
            ANN_ADMITTED_AT: f"{now_s:.3f}",
            ANN_BORROWING: "false",
            ANN_QUEUE_STATE: "admitted",
            ANN_FLAVORS: json.dumps(dict(flavors), sort_keys=True),
        }
        patch = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations},
            "spec": {"suspend": False},
        }
        counted = ", ".join(f"{r} in {f}" for r, f in sorted(flavors.items()))
        message = f"admitted by ClusterQueue {queue} ({counted or 'no quota used'})"
        writes = KINDS[wl.kind].status_writes
        if writes is not None:  # its admission is its own status
            patch = self._status_patch(wl, writes.admitted(wl, queue, flavors, message))
        updated = await self._write_admission(wl, patch)
        if updated is None:
            return False
        await self._admitted(
            wl, updated, NO_GPU, now_s, finish_s=None,
            message=message,
            detail={"queue": queue, "flavors": dict(flavors)},
        )  # fmt: skip
        return True

    async def _write_admission(self, wl: Workload, patch: Obj) -> Obj | None:
        """Patch the admission onto the workload; the written object, or None when it was not
        written (a conflict wakes the loop to decide again on the newer copy; a refusal is
        said on the workload)."""
        status = "status" in patch  # (a status patch is written to the subresource)
        try:
            updated = await self.kube.patch(
                wl.resource, wl.name, patch, wl.namespace, sub="status" if status else ""
            )
        except Conflict:
            self.metrics.write_conflicts.inc()
            self.wake()  # decide again on the newer Job
            return None
        except NotFound:
            return None
        except ApiError as exc:
            await self.refused(wl, "AdmissionFailed", "could not admit it", exc)
            return None
        # Our own write is the newest state of the Job: the next reconcile must not decide on
        # the informer's older copy while the watch event is still on its way.
        self.remember(wl, updated)
        return updated

    @staticmethod
    def _status_patch(wl: Workload, status: Obj) -> Obj:
        """A merge patch of the workload's status, on the version the decision was made on."""
        version = wl.obj["metadata"]["resourceVersion"]
        return {"metadata": {"resourceVersion": version}, "status": status}

    async def _admitted(
        self, wl: Workload, updated: Obj, admitted_type: str, now_s: float, *,
        finish_s: float | None, message: str, detail: dict[str, Any],
    ) -> None:  # fmt: skip
        """After an admission is written: the workload's state, its Event and condition, and
        the bus event."""
        state = self.states.setdefault(wl.key, JobState(wl.key))
        state.admitted_type = admitted_type
        state.reason = None
        state.reason_evented = None
        state.position = None
        state.predicted_start_s = now_s
        state.predicted_finish_s = finish_s
        await self.event(updated, "Admitted", message)
        await self.condition(wl, "True", "Admitted", message)
        await self.publish(wl, JobPhase.ADMITTED, detail, seq=wl.obj["metadata"]["resourceVersion"])

    async def preempt(
        self, wl: Workload, reason: str, for_job: str, *,
        cause: str = "Preempted", extra: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Take the workload's admission back: suspended (or evicted, by kind), its run time
        kept, `extra` annotations written with it, the `cause` said in an Event."""
        if KINDS[wl.kind].reclaim == "evict":
            await self._evict(wl, reason, for_job, cause=cause)
            return
        writes = KINDS[wl.kind].status_writes
        if writes is not None:  # its admission is its own status: evicted there
            await self._evict_in_status(wl, writes.evicted, reason, for_job, cause=cause)
            return
        meta = wl.obj["metadata"]
        count = int(wl.annotations.get(ANN_PREEMPTIONS, "0") or 0) + 1
        # The time this run lasted joins the job's run time, so its wait (for the policy's
        # wait credit and bound) counts only time not running.
        started = wl.annotations.get(ANN_ADMITTED_AT)
        ran = ran_s(wl) + (max(0.0, time.time() - float(started)) if started else 0.0)
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
                    ANN_FLAVORS: None,
                    ANN_PODS_READY_AT: None,
                    ANN_QUEUE_STATE: f"preempted: {reason}",
                    **(extra or {}),
                },
            },
            "spec": spec,
        }
        updated = await self._write_reclaim(wl, patch, f"could not suspend it for {for_job}")
        if updated is not None:
            await self._preempted(wl, updated, "suspended", reason, for_job, count, cause)

    async def _write_reclaim(
        self, wl: Workload, patch: Obj, failed: str, sub: str = ""
    ) -> Obj | None:
        """Patch a reclaim onto the workload; the written object, or None when it was not
        written (gone or changed meanwhile wakes the loop; a refusal is said on it as
        `failed`)."""
        try:
            return await self.kube.patch(wl.resource, wl.name, patch, wl.namespace, sub=sub)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self.wake()
            return None
        except ApiError as exc:
            await self.refused(wl, "PreemptionFailed", failed, exc)
            return None

    async def ungate(
        self, wl: Workload, gpu_type: str, admission: dict[str, str] | None = None
    ) -> bool:
        """Take the gates off an admitted serving workload's pods, each given the model's node
        selector and the admission record: the ones there at admission, and each its
        controller makes later (a restart, a rollout), up to the replicas it was admitted for.
        True when a pod carries the admission now."""
        record = admission or {k: v for k, v in wl.annotations.items() if k in ADMISSION_RECORD}
        pods = self.serving.live(wl)
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
                self.wake()
                continue
            except ApiError as exc:
                await self.refused(wl, "AdmissionFailed", "could not ungate its pod", exc)
                continue
            self.serving.remember(wl.namespace, updated)
            carried = True
        return carried

    async def _delete_pods(self, wl: Workload) -> None:
        for pod in self.serving.live(wl):
            meta = pod["metadata"]
            try:
                await self.kube.delete(
                    PODS, meta["name"], wl.namespace, preconditions_uid=meta.get("uid")
                )
            except (Conflict, NotFound):
                continue
            except ApiError as exc:
                await self.refused(wl, "PreemptionFailed", "could not evict its pod", exc)

    async def _evict(self, wl: Workload, reason: str, for_job: str, *, cause: str) -> None:
        """Reclaim a workload that cannot be held again (a Pod: its gate cannot come back):
        delete it, this very object (its uid), and say why on it."""
        try:
            await self.kube.delete(wl.resource, wl.name, wl.namespace, preconditions_uid=wl.uid)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self.wake()
            return
        except ApiError as exc:
            await self.refused(wl, "PreemptionFailed", f"could not evict it for {for_job}", exc)
            return
        count = int(wl.annotations.get(ANN_PREEMPTIONS, "0") or 0) + 1
        await self._preempted(wl, wl.ref(), "evicted", reason, for_job, count, cause)

    async def _evict_in_status(
        self, wl: Workload, evicted: Callable[[Workload, str, str], Obj], reason: str,
        for_job: str, *, cause: str,
    ) -> None:  # fmt: skip
        """Take back the admission of a workload whose object is its own record: said in its
        status, the reservation held until whatever runs it stops it."""
        message = f"{cause.lower()} for {for_job}: {reason}"
        patch = self._status_patch(wl, evicted(wl, cause, message))
        updated = await self._write_reclaim(
            wl, patch, f"could not evict it for {for_job}", sub="status"
        )
        if updated is None:
            return
        self.remember(wl, updated)
        count = int(wl.annotations.get(ANN_PREEMPTIONS, "0") or 0) + 1
        await self._preempted(wl, updated, "evicted", reason, for_job, count, cause)

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
        await self.event(obj, cause, message, warning=True)
        await self.condition(wl, "False", cause, message)
        await self.publish(
            wl, JobPhase.PREEMPTED, {"reason": reason, "for": for_job}, seq=str(count)
        )

    async def wait_event(self, wl: Workload, state: JobState) -> None:
        """One Event per change of wait reason (not per reconcile), and the reason on the Job.
        Within a reconcile (`deferred`) the writes wait for `flush`, each workload's in order."""
        if state.reason is None:
            return
        text = f"{state.reason.kind}: {state.reason.message}"
        if state.reason_evented == state.reason.kind:
            return
        state.reason_evented = state.reason.kind
        kind, message = state.reason.kind, state.reason.message
        await self.later(lambda: self._say_waiting(wl, kind, message, text))

    async def _say_waiting(self, wl: Workload, kind: str, message: str, text: str) -> None:
        warning = kind in ("queue", "prediction")
        reason = "QueueNotFound" if kind == "queue" else "Waiting"
        await self.event(wl.ref(), reason, f"waiting ({text})", warning=warning)
        writes = KINDS[wl.kind].status_writes
        if writes is not None:  # said in its own status, as Kueue says it
            status = writes.pending(wl, text)
            if status is not None:
                await self.note(wl, self._status_patch(wl, status), sub="status")
            return
        note = {"metadata": {"annotations": {ANN_QUEUE_STATE: f"waiting: {text}"[:512]}}}
        await self.note(wl, note)
        await self.condition(wl, "False", camel(kind), message)

    # --- writes that need not wait for each other -------------------------------------------

    def defer(self) -> None:
        """From now on, `later` keeps writes for `flush` (a reconcile's explanations and
        admissions of distinct workloads, written side by side)."""
        self._deferred = []

    async def later(self, write: Callable[[], Awaitable[Any]]) -> None:
        """`write` now, or at `flush` while deferring."""
        if self._deferred is None:
            await write()
        else:
            self._deferred.append(write)

    async def flush(self) -> None:
        """Run the kept writes, at most `WRITES_IN_FLIGHT` at once. Deferring ends."""
        writes, self._deferred = self._deferred or [], None
        await gather_writes(writes)

    def drop(self) -> None:
        """Forget the kept writes (the reconcile that kept them failed). Deferring ends."""
        self._deferred = None

    async def note(self, wl: Workload, patch: Obj, *, sub: str = "") -> Obj | None:
        """An annotation (or, with `sub`, a status) on the workload, best effort: gone or
        changed meanwhile is nothing, and one the API server refuses is logged, never a reason
        to stop the queue."""
        if not KINDS[wl.kind].writable:
            return None  # never written (its Events say the same)
        try:
            return await self.kube.patch(wl.resource, wl.name, patch, wl.namespace, sub=sub)
        except (NotFound, Conflict):
            return None
        except ApiError as exc:
            log.warning("annotation refused", extra={"job": wl.key, "error": str(exc)})
            return None

    async def refused(self, wl: Workload, reason: str, what: str, exc: ApiError) -> None:
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
        await self.event(wl.ref(), reason, message, warning=True)

    async def condition(self, wl: Workload, status: str, reason: str, message: str) -> None:
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


async def gather_writes(writes: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Each write started, at most `WRITES_IN_FLIGHT` at once; their results in order."""
    slots = asyncio.Semaphore(WRITES_IN_FLIGHT)

    async def one(write: Callable[[], Awaitable[T]]) -> T:
        async with slots:
            return await write()

    return list(await asyncio.gather(*(one(w) for w in writes)))


def camel(kind: str) -> str:
    """A wait kind as a condition reason (`fair_share` -> `FairShare`)."""
    return "".join(part.capitalize() for part in kind.split("_"))


def ran_s(wl: Workload) -> float:
    """Seconds the job ran in runs the dispatcher preempted (its own annotation; a value
    edited into nonsense counts as 0)."""
    try:
        ran = float(wl.annotations.get(ANN_RAN, "0") or 0)
    except ValueError:
        return 0.0
    return ran if math.isfinite(ran) and ran >= 0 else 0.0
