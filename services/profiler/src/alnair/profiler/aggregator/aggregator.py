"""The aggregator: folds pod metrics into the jobs that own the pods, and records finished jobs.

Pod metrics arrive at 1 Hz per (pod, GPU). For each pod the aggregator finds the owner that
stands for "the job" (`owners`) and keeps per-pod summaries (count, sum, max of each series,
see `statistics.Stat`) in Redis, updated by one Lua script per sample so a sample is folded
atomically, and so an aggregator restart mid-job loses nothing already folded (`store`).

While an owner runs, its utilization annotations are refreshed at most every
`live_annotation_interval_s`, as samples arrive. Completion is learned from watches on the
owner kinds (Jobs and ElasticJobs by default, any kind by settings), never by polling; the
finished owner is then recorded and announced (`finalize`).

Redis holds no key forever: the working keys of a pod and its owner live `idle_ttl_s` past
their last sample (so pods of an owner that never finishes, a Deployment's, fade away), and
once the record is written they, and the done marker, expire `finished_ttl_s` later (the
profile stays readable for a while). A replay after that finds no profiled pods and a job
ended too long ago to record, and does nothing.
Pod summaries (the agent's account of a pod's whole run, durable on JetStream, see
`agent.summaries`) are folded into the same per-pod stats: a series takes the summary's count
and sum when they cover more samples than were folded, and the larger maximum, so folding a
summary twice, or after all of its samples, changes nothing. A summary of a pod whose owner
already finished (the run fell inside a bus outage) finalizes that owner: the summary's
arrival is the event that says a record can now be written.
Every step is idempotent, so a crash between any two is repaired by the next watch event.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.errors import TemporaryError
from alnair.common.events import (
    DecodeError,
    Envelope,
    GpuInventory,
    PodMetric,
    PodSummary,
    subject_token,
)
from alnair.common.kube import (
    NODES,
    PODS,
    ApiError,
    KubeClient,
    NotFound,
    Resource,
    Unavailable,
    resource_for,
)
from alnair.common.progress import Progress
from alnair.common.records import ExecutionRecord, Outcome
from alnair.profiler.aggregator.finalize import Finalizer
from alnair.profiler.aggregator.owners import OwnerRef, finished, pod_of_summary, resolve_owner
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.aggregator.store import ProfileStore
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.statistics import Profile, owner_annotations

log = logging.getLogger(__name__)


class Aggregator:
    """Pod metrics in, owner annotations, execution records and job events out."""

    def __init__(
        self,
        bus: Bus,
        kube: KubeClient,
        redis: aioredis.Redis,
        metrics: ProfilerMetrics,
        *,
        cluster: str = "default",
        source: str = "alnair/profiler-aggregator",
        cache_size: int = 10000,
        live_annotation_interval_s: float = 30.0,
        idle_ttl_s: int = 7 * 24 * 3600,
        finished_ttl_s: int = 3600,
        late_samples_s: float = 90.0,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.metrics = metrics
        self.store = ProfileStore(redis, idle_ttl_s=idle_ttl_s)
        self.records = RecordStore(redis)
        self._owners: OrderedDict[str, OwnerRef] = OrderedDict()
        self._cache_size = cache_size
        self.live_annotation_interval_s = live_annotation_interval_s
        self._annotated_at: dict[str, float] = {}
        self.progress: dict[str, Progress] = {}
        """Owner uid -> the furthest training progress its pods reported (while it runs; the
        owner's annotations keep it across a restart of this process)."""
        self._not_annotatable: set[str] = set()
        self.latest: OrderedDict[tuple[str, str], dict[str, PodMetric]] = OrderedDict()
        self._kv: KeyValue | None = None
        self._node_models: dict[str, str] = {}
        self.finalizer = Finalizer(
            bus, kube, self.store, self.records, metrics,
            cluster=cluster, source=source, finished_ttl_s=finished_ttl_s,
            late_samples_s=late_samples_s, gpu_model=self.gpu_model, forget=self._forget,
        )  # fmt: skip
        self.on_finalized = self.finalizer.on_finalized

    # -- pod metrics ------------------------------------------------------------------
    async def owner_of(self, metric: PodMetric | PodSummary) -> OwnerRef | None:
        cached = self._owners.get(metric.pod_uid)
        if cached is not None:
            return cached
        owner = await self.store.stored_owner(metric.pod_uid)
        if owner is None:
            pod: Mapping[str, Any] | None
            try:
                pod = await self.kube.get(PODS, metric.pod, metric.namespace)
            except NotFound:
                pod = None  # gone before we could ask whose it was
            if pod is None or str(pod.get("metadata", {}).get("uid")) != metric.pod_uid:
                # Gone, or a new pod with the old name: a summary still names the controller.
                pod = pod_of_summary(metric)
                if pod is None:
                    return None
            owner = await resolve_owner(self.kube, pod)
            await self.store.remember_owner(metric, owner)
        self._owners[metric.pod_uid] = owner
        while len(self._owners) > self._cache_size:
            self._owners.popitem(last=False)
        return owner

    async def on_pod_metric(
        self, metric: PodMetric, _envelope: Envelope[PodMetric] | None = None
    ) -> None:
        """Fold one sample into its pod's summary (and the live view)."""
        self.metrics.received.inc()
        key = (metric.namespace, metric.pod)
        self.latest.setdefault(key, {})[metric.gpu_uuid or ""] = metric
        self.latest.move_to_end(key)
        while len(self.latest) > self._cache_size:
            self.latest.popitem(last=False)
        self.metrics.observe_pod(metric)
        try:
            owner = await self.owner_of(metric)
        except Unavailable as exc:
            # Samples are plentiful: skipping one while the API server is away costs little.
            log.info(
                "owner lookup failed, sample skipped", extra={"pod": metric.pod, "error": str(exc)}
            )
            return
        if owner is None:
            return
        await self.store.fold(metric, owner)
        moved_checkpoint = self._fold_progress(owner, metric)
        await self._annotate_live(owner, metric.ts.timestamp(), now=moved_checkpoint)

    def _fold_progress(self, owner: OwnerRef, metric: PodMetric) -> bool:
        """Keep the owner's furthest progress; True when its checkpoint moved (written at
        once: it is what a preemption keeps)."""
        reported = metric.progress()
        if reported is None or owner.kind == "Pod":
            return False
        before = self.progress.get(owner.uid)
        after = reported.furthest(before)
        self.progress[owner.uid] = after
        return before is None or after.checkpoint != before.checkpoint

    async def on_pod_summary(
        self, summary: PodSummary, _envelope: Envelope[PodSummary] | None = None
    ) -> None:
        """Fold a pod's whole-run summary; finalize its owner if that already finished."""
        try:
            owner = await self.owner_of(summary)
        except Unavailable as exc:
            # Unlike a sample, a summary may be all there is of a run: ask to have it again.
            raise TemporaryError("owner lookup failed", pod=summary.pod, delay_s=5.0) from exc
        if owner is None:
            log.info("pod summary of an unknown owner dropped", extra={"pod": summary.pod})
            return
        await self.store.merge(summary, owner)
        self.metrics.summaries_folded.inc()
        if summary.gpu_model and summary.node not in self._node_models:
            self._node_models[summary.node] = summary.gpu_model
        await self._finalize_if_finished(owner)

    async def _finalize_if_finished(self, owner: OwnerRef) -> None:
        if owner.kind == "Pod" or await self.store.is_done(owner.uid):
            return
        resource = resource_for(owner.api_version, owner.kind)
        try:
            obj = await self.kube.get(resource, owner.name, owner.namespace or None)
        except NotFound:
            return
        except ApiError as exc:
            if exc.status == 403:
                return  # a kind we may not read is not one whose completion we watch
            raise
        except Unavailable as exc:
            raise TemporaryError("owner not readable", owner=owner.name, delay_s=5.0) from exc
        if str(obj.get("metadata", {}).get("uid")) != owner.uid:
            return
        done = finished(obj)
        if done is not None:
            await self.finalizer.finalize_or_retry(obj, resource, done[0], done[1])

    async def _annotate_live(self, owner: OwnerRef, ts: float, *, now: bool = False) -> None:
        """Keep the running owner's utilization and progress annotations current, at most once
        per interval (`now`: at once, a new checkpoint).

        Driven by arriving samples, not a timer: an owner whose pods stopped reporting is not
        touched again until it finishes, when `finalize` writes the final numbers.
        """
        interval = self.live_annotation_interval_s
        if interval <= 0 or owner.kind == "Pod" or owner.uid in self._not_annotatable:
            return
        last = self._annotated_at.get(owner.uid)
        if last is not None and ts - last < interval and not now:
            return
        self._annotated_at[owner.uid] = ts
        if await self.store.is_done(owner.uid):
            return
        profile, _ = await self.store.owner_profile(owner.uid)
        annotations = owner_annotations(profile)
        progress = self.progress.get(owner.uid)
        if progress is not None:
            annotations.update(progress.annotations())
        patch = {"metadata": {"annotations": annotations}}
        resource = resource_for(owner.api_version, owner.kind)
        try:
            await self.kube.patch(resource, owner.name, patch, owner.namespace)
        except NotFound:
            pass
        except ApiError as exc:
            # Not ours to annotate (RBAC covers known kinds only): say so once, not per sample.
            self._not_annotatable.add(owner.uid)
            log.info("owner not annotatable", extra={"owner": owner.name, "error": str(exc)})
        except TemporaryError as exc:
            log.info("live annotation skipped", extra={"owner": owner.name, "error": str(exc)})

    def _forget(self, owner_uid: str, pod_uids: set[str]) -> None:
        """A recorded owner: nothing of it stays in memory."""
        self._annotated_at.pop(owner_uid, None)
        self._not_annotatable.discard(owner_uid)
        self.progress.pop(owner_uid, None)
        for pod_key, by_gpu in list(self.latest.items()):
            if any(m.pod_uid in pod_uids for m in by_gpu.values()):
                self.metrics.forget_pod(*pod_key)
                # The live view is of running pods: a finished job's last samples only filled
                # the cache up to its bound (the soak saw the aggregator grow by them).
                del self.latest[pod_key]
        for pod_uid in pod_uids:
            self._owners.pop(pod_uid, None)

    # -- profiles ---------------------------------------------------------------------
    async def pod_profile(self, pod_uid: str) -> tuple[Profile, dict[str, str]]:
        return await self.store.pod_profile(pod_uid)

    async def owner_profile(self, owner_uid: str) -> tuple[Profile, list[dict[str, str]]]:
        return await self.store.owner_profile(owner_uid)

    async def owner_uid_by_name(self, namespace: str, name: str) -> str | None:
        return await self.store.owner_uid_by_name(namespace, name)

    async def is_profiled(self, owner_uid: str) -> bool:
        """Whether any pod of this owner was ever sampled (so a record will follow its end)."""
        return await self.store.has_pods(owner_uid)

    async def gpu_model(self, owner_uid: str) -> str:
        for node in await self.store.owner_nodes(owner_uid):
            if node in self._node_models:
                return self._node_models[node]
            model = await self._model_of(node)
            if model:
                self._node_models[node] = model
                return model
        return ""

    async def _model_of(self, node: str) -> str:
        try:
            if self._kv is None:
                self._kv = await self.bus.kv(GpuInventory.BUCKET)
            entry = await self._kv.get(subject_token(node))  # (the key the agent writes)
            if entry.value:
                inv = GpuInventory.read(entry.key, entry.value)
                if inv.gpus:
                    return inv.gpus[0].model
        except KeyNotFoundError:
            pass
        except DecodeError as exc:
            log.error("GPU inventory refused", extra={"node": node, "error": str(exc)})
        try:
            obj = await self.kube.get(NODES, node)
        except NotFound:
            return ""
        return str((obj.get("metadata", {}).get("labels") or {}).get(res.LABEL_GPU_MODEL, ""))

    # -- completion -------------------------------------------------------------------
    async def on_owner_event(self, kind: str, obj: dict[str, Any], resource: Resource) -> None:
        if kind == "DELETED":
            return
        done = finished(obj)
        if done is None:
            return
        await self.finalizer.finalize_or_retry(obj, resource, done[0], done[1])

    async def finalize(
        self, obj: Mapping[str, Any], resource: Resource, outcome: Outcome, end_ts: float | None
    ) -> ExecutionRecord | None:
        """Record and announce a finished owner now (see `finalize.Finalizer.finalize`)."""
        return await self.finalizer.finalize(obj, resource, outcome, end_ts)

    async def close(self) -> None:
        """Stop pending retries (they resume from the next watch event after a restart)."""
        await self.finalizer.close()
