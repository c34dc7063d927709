"""Recording a finished job: annotate its owner, write its execution record, announce it, mark
it done; in that order, each step safe to repeat.

1. the owner is annotated with max/mean GPU, CPU and memory use;
2. the execution record is written (exactly once per uid, see `records`);
3. the JobEvent `completed`/`failed` is published with the event id `<uid>.<phase>`, so
   JetStream drops a second copy if a crash repeats the step; while the bus is away the
   publish is retried, backing off, until it is stored (the record without its done marker
   is the outbox);
4. the job is marked done in Redis, after which later watch events (including the relist
   after a restart, which replays every finished Job) change nothing.

A GPU job that finished with no sample folded at all (it ran while its node's agent was away)
is looked at again until `late_samples_s` after its end (its samples or summary may still be
on their way), then recorded without usage from what the API says (duration, GPUs, outcome)
and announced like any other: every finished GPU job gets one record and one completion
event. When a dependency is away the finalizer retries on its own with backoff, since a
finished job may never produce another event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from redis.exceptions import RedisError

from alnair.common import resources as res
from alnair.common.annotations import object_model
from alnair.common.bus import Bus
from alnair.common.errors import TemporaryError
from alnair.common.events import JobEvent, JobPhase
from alnair.common.kube import PODS, KubeClient, NotFound, Resource
from alnair.common.progress import ANN_PREEMPTIONS, from_annotations
from alnair.common.records import ANN_STEPS, ANN_THROUGHPUT, ExecutionRecord, Outcome, record_key
from alnair.common.retry import Backoff
from alnair.common.tasks import cancel_all, in_flight
from alnair.profiler.aggregator.owners import annotation, kind_of, number, template_gpus, timestamp
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.aggregator.store import ProfileStore
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.statistics import owner_annotations

log = logging.getLogger(__name__)

LATE_SAMPLES_BACKOFF = Backoff(5.0, 3600.0)
"""Looking again for a finished job's samples still on their way (capped by `late_samples_s`)."""
FINALIZE_BACKOFF = Backoff(1.0, 60.0)
"""Finalizing again while the API server, Redis or NATS is away."""


class Finalizer:
    def __init__(
        self,
        bus: Bus,
        kube: KubeClient,
        store: ProfileStore,
        records: RecordStore,
        metrics: ProfilerMetrics,
        *,
        cluster: str,
        source: str,
        finished_ttl_s: int,
        late_samples_s: float,
        gpu_model: Callable[[str], Awaitable[str]],
        forget: Callable[[str, set[str]], None],
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.store = store
        self.records = records
        self.metrics = metrics
        self.cluster = cluster
        self.source = source
        self.finished_ttl_s = finished_ttl_s
        self.late_samples_s = late_samples_s
        self._gpu_model = gpu_model
        """The GPU model an owner ran on (by its uid)."""
        self._forget = forget
        """Drop what the aggregator keeps in memory of a recorded owner (uid, its pod uids)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._retries: set[asyncio.Task[Any]] = set()
        self.on_finalized: list[Callable[[Mapping[str, Any]], Awaitable[None]]] = []
        """Called with the owner object once its record is written and announced
        (in-process followers such as the TrialJob controller)."""

    async def finalize_or_retry(
        self,
        obj: Mapping[str, Any],
        resource: Resource,
        outcome: Outcome,
        end_ts: float | None,
        attempt: int = 0,
    ) -> None:
        uid = str(obj.get("metadata", {}).get("uid", ""))
        lock = self._locks.setdefault(uid, asyncio.Lock())
        try:
            async with lock:
                record = await self.finalize(obj, resource, outcome, end_ts)
                if record is None and await self._samples_may_be_in_flight(uid, end_ts):
                    # Finished before any of its samples was folded: they may still be on
                    # their way (buffered by an agent while NATS restarted, or waiting for a
                    # restarting aggregator). Look again a few times, the last just after
                    # `late_samples_s`, when it is recorded without them.
                    assert end_ts is not None  # (no end: nothing in flight)
                    left = self.late_samples_s - (time.time() - end_ts) + 1.0
                    delay = max(1.0, min(LATE_SAMPLES_BACKOFF.at(attempt), left))
                    log.info("finished before its samples arrived", extra={"uid": uid})
                    self._retry(obj, resource, outcome, end_ts, attempt + 1, delay)
        except (TemporaryError, RedisError) as exc:
            # The API server, Redis or NATS is away. No further watch event may come for a
            # finished job, so retry on our own, backing off; every step is idempotent.
            delay = FINALIZE_BACKOFF.at(attempt)
            log.warning(
                "finalize failed, will retry",
                extra={"uid": uid, "error": str(exc), "delay_s": delay},
            )
            self._retry(obj, resource, outcome, end_ts, attempt + 1, delay)
        finally:
            self._locks.pop(uid, None)

    def _retry(
        self,
        obj: Mapping[str, Any],
        resource: Resource,
        outcome: Outcome,
        end_ts: float | None,
        attempt: int,
        delay_s: float,
    ) -> None:
        uid = str(obj.get("metadata", {}).get("uid", ""))
        in_flight(
            self._retry_later(obj, resource, outcome, end_ts, attempt, delay_s),
            name=f"profiler.aggregator.retry-{uid}",
            into=self._retries,
        )

    async def _retry_later(
        self,
        obj: Mapping[str, Any],
        resource: Resource,
        outcome: Outcome,
        end_ts: float | None,
        attempt: int,
        delay_s: float,
    ) -> None:
        await asyncio.sleep(delay_s)
        await self.finalize_or_retry(obj, resource, outcome, end_ts, attempt)

    async def _samples_may_be_in_flight(self, uid: str, end_ts: float | None) -> bool:
        """A finished owner without samples that ended less than `late_samples_s` ago."""
        if end_ts is None or time.time() - end_ts > self.late_samples_s:
            return False
        if await self.store.is_done(uid):
            return False
        return not await self.store.has_pods(uid)

    async def close(self) -> None:
        """Stop pending retries (they resume from the next watch event after a restart)."""
        await cancel_all(list(self._retries))

    async def finalize(
        self, obj: Mapping[str, Any], resource: Resource, outcome: Outcome, end_ts: float | None
    ) -> ExecutionRecord | None:
        """Annotate, record, announce, in that order; each step safe to repeat. None when
        there is nothing to record: done already, samples maybe still on their way, or not a
        GPU workload this aggregator could have watched."""
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        ns = str(meta.get("namespace", ""))
        name = str(meta.get("name", ""))
        if await self.store.is_done(uid):
            return None
        annotations: dict[str, str] = {}
        if await self.store.has_pods(uid):
            record, annotations = await self._profiled_record(obj, resource, outcome, end_ts)
        elif await self._samples_may_be_in_flight(uid, end_ts):
            return None
        else:
            unprofiled = self._unprofiled_record(obj, outcome, end_ts)
            if unprofiled is None:
                return None
            record = unprofiled
        if await self.records.write_once(record):
            self.metrics.records.inc()
            if record.peak_gpu_mem_mib is None:
                self.metrics.unprofiled_records.inc()
                log.warning(
                    "no sample of this job reached the aggregator; recorded without usage",
                    extra={"key": record.key, "outcome": outcome},
                )
            else:
                log.info("execution record written", extra={"key": record.key, "outcome": outcome})
        await self._announce(obj, resource, record, outcome, annotations)
        pod_uids = set(await self.store.owner_pods(uid))
        await self.store.mark_done(uid, ns, name, pod_uids, self.finished_ttl_s)
        self._forget(uid, pod_uids)
        for follower in self.on_finalized:
            await follower(obj)
        return record

    async def _announce(
        self,
        obj: Mapping[str, Any],
        resource: Resource,
        record: ExecutionRecord,
        outcome: Outcome,
        annotations: dict[str, str],
    ) -> None:
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        ns = str(meta.get("namespace", ""))
        name = str(meta.get("name", ""))
        phase = JobPhase.COMPLETED if outcome == "succeeded" else JobPhase.FAILED
        event = JobEvent(
            phase=phase,
            cluster=self.cluster,
            namespace=ns,
            kind=str(obj.get("kind") or kind_of(resource)),
            name=name,
            uid=uid,
            detail={
                "record": record_key(ns, name, uid),
                "duration_s": record.duration_s,
                "peak_gpu_mem_mib": record.peak_gpu_mem_mib,
                "mean_gpu_util_pct": record.mean_gpu_util_pct,
                "gpu_model": record.gpu_model,
                "gpu_count": record.gpu_count,
                "annotations": annotations,
            },
        )
        try:
            await self.bus.publish(event, source=self.source, event_id=f"{uid}.{phase.value}")
        except TemporaryError as exc:
            # The record in Redis, without the done marker, is the outbox: the caller retries
            # (backing off, for as long as it takes) and the repeat writes nothing twice.
            raise TemporaryError(
                "completion event not published yet", uid=uid, delay_s=exc.delay_s
            ) from exc
        self.metrics.completions.labels(outcome).inc()

    async def _profiled_record(
        self, obj: Mapping[str, Any], resource: Resource, outcome: Outcome, end_ts: float | None
    ) -> tuple[ExecutionRecord, dict[str, str]]:
        """The record of a job whose samples were folded, and the usage annotations it was
        given (written on it first)."""
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        ns = str(meta.get("namespace", ""))
        name = str(meta.get("name", ""))
        profile, pod_fields = await self.store.owner_profile(uid)
        annotations = owner_annotations(profile)
        current = meta.get("annotations") or {}
        if any(current.get(k) != v for k, v in annotations.items()):
            # Deleted already (ttlSecondsAfterFinished)? The record still matters.
            with contextlib.suppress(NotFound):
                await self.kube.patch(
                    resource, name, {"metadata": {"annotations": annotations}}, ns or None
                )
        first_seen = min(
            (float(f.get("first_ts", "inf")) for f in pod_fields), default=float("inf")
        )
        created = timestamp(meta.get("creationTimestamp")) or time.time()
        start = timestamp((obj.get("status") or {}).get("startTime")) or (
            first_seen if first_seen != float("inf") else created
        )
        last_seen = max((float(f.get("last_ts", "0")) for f in pod_fields), default=0.0)
        end = end_ts or last_seen or time.time()
        steps, throughput = await self.progress(obj, uid, max(0.0, end - start))
        gpus = template_gpus(obj) or await self.store.owner_gpu_count(uid)
        model = object_model(obj)  # Alnair's annotation names or the seeds'
        record = ExecutionRecord(
            namespace=ns,
            job_name=name,
            uid=uid,
            model_name=model.model_name or "",
            batch_size=model.batch_size or "",
            data_size=model.data_size or "",
            epoch=model.epoch or "",
            gpu_model=await self._gpu_model(uid),
            gpu_count=gpus,
            submit_ts=created,
            start_ts=start,
            end_ts=max(end, start),
            steps=steps,
            throughput_steps_per_s=throughput,
            peak_gpu_mem_mib=profile.get("gpu_mem_used_mib").max,
            mean_gpu_util_pct=profile.get("gpu_util_pct").mean,
            outcome=outcome,
            **progress_fields(obj),
        )
        return record, annotations

    def _unprofiled_record(
        self, obj: Mapping[str, Any], outcome: Outcome, end_ts: float | None
    ) -> ExecutionRecord | None:
        """The record of a GPU job that finished without one sample reaching us (it ran
        while its node's agent was away): what the API says of it, usage left out.

        None for a workload asking no GPU, and for one that ended more than `finished_ttl_s`
        ago (a relist replays every finished Job, also those over before Alnair ran)."""
        gpus = template_gpus(obj)
        if not gpus or end_ts is None or time.time() - end_ts > self.finished_ttl_s:
            return None
        meta = obj.get("metadata", {})
        created = timestamp(meta.get("creationTimestamp")) or end_ts
        start = timestamp((obj.get("status") or {}).get("startTime")) or created
        template = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        selected = (template.get("nodeSelector") or {}).get(res.LABEL_GPU_MODEL, "")
        steps = number(annotation(obj, ANN_STEPS))
        duration = max(0.0, end_ts - start)
        model = object_model(obj)
        return ExecutionRecord(
            namespace=str(meta.get("namespace", "")),
            job_name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            model_name=model.model_name or "",
            batch_size=model.batch_size or "",
            data_size=model.data_size or "",
            epoch=model.epoch or "",
            gpu_model=str(selected),
            gpu_count=gpus,
            submit_ts=created,
            start_ts=start,
            end_ts=max(end_ts, start),
            steps=int(steps) if steps is not None else None,
            throughput_steps_per_s=steps / duration if steps is not None and duration else None,
            outcome=outcome,
            **progress_fields(obj),
        )

    async def progress(
        self, owner: Mapping[str, Any], owner_uid: str, duration_s: float, max_pods: int = 32
    ) -> tuple[int | None, float | None]:
        """Training steps and steps/s the workload reported, from its owner or its pods.

        Data-parallel workers report the same global step, so pods count by their maximum.
        Steps over the run's duration give the throughput; a reported throughput alone gives
        the steps it implies.
        """
        steps = number(annotation(owner, ANN_STEPS))
        rate = number(annotation(owner, ANN_THROUGHPUT))
        if steps is None and rate is None:
            for pod_uid in (await self.store.owner_pods(owner_uid))[:max_pods]:
                meta = await self.store.pod_meta(pod_uid)
                if not meta:
                    continue
                try:
                    pod = await self.kube.get(PODS, meta["name"], meta["namespace"])
                except NotFound:
                    continue
                ann = pod.get("metadata", {}).get("annotations") or {}
                pod_steps = number(str(ann.get(ANN_STEPS, "")))
                pod_rate = number(str(ann.get(ANN_THROUGHPUT, "")))
                if pod_steps is not None:
                    steps = max(steps or 0.0, pod_steps)
                if pod_rate is not None:
                    rate = max(rate or 0.0, pod_rate)
        if steps is not None:
            return int(steps), (steps / duration_s if duration_s > 0 else rate)
        if rate is not None:
            return int(rate * duration_s), rate
        return None, None


def progress_fields(owner: Mapping[str, Any]) -> dict[str, int | None]:
    """How far the job got and how often the queue stopped it, from the annotations the
    aggregator and the dispatcher keep on it (`alnair.common.progress`)."""
    ann = (owner.get("metadata") or {}).get("annotations") or {}
    progress = from_annotations(ann)
    try:
        preemptions = max(0, int(ann.get(ANN_PREEMPTIONS, "0") or 0))
    except ValueError:
        preemptions = 0
    return {
        "progress_step": progress.step if progress else None,
        "total_steps": progress.total if progress else None,
        "checkpoint_step": progress.checkpoint if progress else None,
        "preemptions": preemptions,
    }
