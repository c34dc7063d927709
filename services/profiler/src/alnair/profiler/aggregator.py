"""The aggregator: folds pod metrics into the jobs that own the pods, and records finished jobs.

Pod metrics arrive at 1 Hz per (pod, GPU). For each pod the aggregator finds the owner that
stands for "the job" by walking controller ownerReferences (Pod -> Job; Pod -> StatefulSet
-> ElasticJob; Pod -> ReplicaSet -> Deployment; any CRD), stopping at a batch Job (a CronJob
is a schedule of jobs, not one). It keeps per-pod summaries (count, sum, max of each series,
see `aggregation.Stat`) in Redis, updated by one Lua script per sample so a sample is folded
atomically, and so an aggregator restart mid-job loses nothing already folded.

While an owner runs, its utilization annotations are refreshed at most every
`live_annotation_interval_s`, as samples arrive. Completion is learned from watches on the
owner kinds (Jobs and ElasticJobs by default, any kind by settings), never by polling. When an
owner finishes the aggregator, in this order,
1. annotates the owner with max/mean GPU, CPU and memory use;
2. writes the execution record (exactly once per uid, see `records`);
3. publishes the JobEvent `completed`/`failed` with the event id `<uid>.<phase>`, so
   JetStream drops a second copy if a crash repeats the step; while the bus is away the
   publish is retried, backing off, until it is stored (the record without its done marker
   is the outbox);
4. marks the job done in Redis, after which later watch events (including the relist after a
   restart, which replays every finished Job) change nothing.

Redis holds no key forever: the working keys of a pod and its owner (stats, meta, pod and GPU
sets, the name index) live `idle_ttl_s` past their last sample (so pods of an owner that never
finishes, a Deployment's, fade away), and once the record is written they, and the done
marker, expire `finished_ttl_s` later (the profile stays readable for a while). A replay after
that finds no profiled pods and a job ended too long ago to record, and does nothing.
A GPU job that finished with no sample folded at all (it ran while its node's agent was away)
is looked at again until `late_samples_s` after its end (its samples or summary may still be
on their way), then recorded without usage from what the API says (duration, GPUs, outcome)
and announced like any other: every finished GPU job gets one record and one completion event.
Pod summaries (the agent's account of a pod's whole run, durable on JetStream, see
`summaries`) are folded into the same per-pod stats: a series takes the summary's count and
sum when they cover more samples than were folded, and the larger maximum, so folding a
summary twice, or after all of its samples, changes nothing. A summary of a pod whose owner
already finished (the run fell inside a bus outage) finalizes that owner: the summary's
arrival is the event that says a record can now be written.
Every step is idempotent, so a crash between any two is repaired by the next watch event;
when a dependency is away the aggregator retries on its own with backoff, since a finished
job may never produce another event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis.asyncio as aioredis
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from redis.exceptions import RedisError

from alnair.common import resources as res
from alnair.common.annotations import object_model
from alnair.common.bus import Bus
from alnair.common.errors import TemporaryError
from alnair.common.events import (
    DecodeError,
    Envelope,
    GpuInventory,
    JobEvent,
    JobPhase,
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
from alnair.common.records import ANN_STEPS, ANN_THROUGHPUT, ExecutionRecord, Outcome, record_key
from alnair.common.retry import Backoff
from alnair.common.tasks import cancel_all, spawn
from alnair.profiler.aggregation import SERIES, Profile, Stat, owner_annotations
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.records import RecordStore

log = logging.getLogger(__name__)

LATE_SAMPLES_BACKOFF = Backoff(5.0, 3600.0)
"""Looking again for a finished job's samples still on their way (capped by `late_samples_s`)."""
FINALIZE_BACKOFF = Backoff(1.0, 60.0)
"""Finalizing again while the API server, Redis or NATS is away."""

P = "alnair:"

# KEYS[1] pod stats hash, KEYS[2] owner GPU set, KEYS[3] the owner's done marker, KEYS[4..]
# the other working keys of the pod and its owner.
# ARGV[1] ts, ARGV[2] gpu id ("" without GPU), ARGV[3..5] GPU series, ARGV[6..7] pod series,
# ARGV[8] idle TTL in seconds: every working key expires that long after the last sample,
# unless the owner is done (then its shorter expiry, set when the record was written, holds).
_FOLD = """
local function upd(name, v)
  redis.call('HINCRBY', KEYS[1], name .. ':count', 1)
  redis.call('HINCRBYFLOAT', KEYS[1], name .. ':sum', v)
  local m = redis.call('HGET', KEYS[1], name .. ':max')
  if (not m) or tonumber(v) > tonumber(m) then
    redis.call('HSET', KEYS[1], name .. ':max', v)
  end
end
local ts = tonumber(ARGV[1])
redis.call('HSETNX', KEYS[1], 'first_ts', ARGV[1])
local last = redis.call('HGET', KEYS[1], 'last_ts')
if (not last) or ts > tonumber(last) then
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[1])
end
if ARGV[2] ~= '' then
  redis.call('SADD', KEYS[2], ARGV[2])
  upd('gpu_util_pct', ARGV[3])
  upd('gpu_mem_used_mib', ARGV[4])
  upd('sm_util_pct', ARGV[5])
end
-- A pod on several GPUs reports CPU and memory once per GPU: count them once per tick.
local pod_ts = redis.call('HGET', KEYS[1], 'pod_ts')
if (not pod_ts) or ts > tonumber(pod_ts) then
  redis.call('HSET', KEYS[1], 'pod_ts', ARGV[1])
  upd('cpu_util_cores', ARGV[6])
  upd('mem_used_mib', ARGV[7])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  for i, key in ipairs(KEYS) do
    if i ~= 3 then redis.call('EXPIRE', key, ARGV[8]) end
  end
end
return 1
"""


# A pod summary. KEYS as _FOLD. ARGV[1] first_ts, ARGV[2] last_ts, ARGV[3] idle TTL, ARGV[4]
# number of series n, then n times (name, count, sum, max), then the GPU ids. A series takes the
# summary's count and sum when they cover more samples than were folded one by one (never
# both: they describe the same run), the larger max; so a repeat changes nothing.
_MERGE = """
local f = redis.call('HGET', KEYS[1], 'first_ts')
if (not f) or tonumber(ARGV[1]) < tonumber(f) then
  redis.call('HSET', KEYS[1], 'first_ts', ARGV[1])
end
for _, field in ipairs({'last_ts', 'pod_ts'}) do
  local v = redis.call('HGET', KEYS[1], field)
  if (not v) or tonumber(ARGV[2]) > tonumber(v) then
    redis.call('HSET', KEYS[1], field, ARGV[2])
  end
end
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local b = 5 + i * 4
  local name = ARGV[b]
  local count = tonumber(ARGV[b + 1])
  if count > 0 then
    local have = tonumber(redis.call('HGET', KEYS[1], name .. ':count') or '0')
    if count > have then
      redis.call('HSET', KEYS[1], name .. ':count', ARGV[b + 1], name .. ':sum', ARGV[b + 2])
    end
    local m = redis.call('HGET', KEYS[1], name .. ':max')
    if (not m) or tonumber(ARGV[b + 3]) > tonumber(m) then
      redis.call('HSET', KEYS[1], name .. ':max', ARGV[b + 3])
    end
  end
end
for i = 5 + n * 4, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  for i, key in ipairs(KEYS) do
    if i ~= 3 then redis.call('EXPIRE', key, ARGV[3]) end
  end
end
return 1
"""


@dataclass(frozen=True)
class OwnerRef:
    """The object that stands for a pod's job."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller"):
            return cast(Mapping[str, Any], ref)
    return refs[0] if len(refs) == 1 else None


async def resolve_owner(kube: KubeClient, pod: Mapping[str, Any], max_depth: int = 5) -> OwnerRef:
    """Walk controller ownerReferences up from a pod to the object that is the job."""
    meta = pod.get("metadata", {})
    ns = str(meta.get("namespace", ""))
    current = OwnerRef("v1", "Pod", ns, str(meta.get("name", "")), str(meta.get("uid", "")))
    obj: Mapping[str, Any] = pod
    for _ in range(max_depth):
        ref = controller_of(obj)
        if ref is None:
            break
        current = OwnerRef(
            str(ref.get("apiVersion", "")),
            str(ref.get("kind", "")),
            ns,
            str(ref.get("name", "")),
            str(ref.get("uid", "")),
        )
        if current.kind == "Job" and current.api_version.startswith("batch/"):
            break
        try:
            obj = await kube.get(resource_for(current.api_version, current.kind), current.name, ns)
        except NotFound:
            break
        except ApiError as exc:
            if exc.status != 403:
                raise
            # A kind outside the groups our RBAC may read (deploy/kustomize): its reference
            # already names the owner; only the walk further up stops here.
            break
    return current


def finished(obj: Mapping[str, Any]) -> tuple[Outcome, float | None] | None:
    """Whether an owner object is done, how, and when (None: still running)."""
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if str(cond.get("status")) != "True":
            continue
        kind = cond.get("type")
        when = _ts(cond.get("lastTransitionTime"))
        if kind in {"Complete", "Succeeded", "Completed"}:
            return "succeeded", _ts(status.get("completionTime")) or when
        if kind == "Failed":
            return "failed", when
    phase = status.get("phase")
    if phase in {"Succeeded", "Completed"}:
        return "succeeded", _ts(status.get("completionTime"))
    if phase == "Failed":
        return "failed", None
    return None


def _ts(text: object) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def template_gpus(obj: Mapping[str, Any]) -> int:
    """GPUs a workload asks for: per-pod template GPUs times parallelism (0 when unknown)."""
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    per_pod = res.whole_gpus(template, "spec.template.spec")
    width = spec.get("parallelism", spec.get("replicas", 1))
    return per_pod * int(width or 1)


def _annotation(obj: Mapping[str, Any], key: str) -> str:
    ann = obj.get("metadata", {}).get("annotations") or {}
    if key in ann:
        return str(ann[key])
    tmpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata", {}).get(
        "annotations"
    ) or {}
    return str(tmpl.get(key, ""))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and math.isfinite(value) else None


def profile_from_hash(fields: Mapping[str, str]) -> Profile:
    stats = {}
    for series in SERIES:
        count = int(float(fields.get(f"{series}:count", "0")))
        if count:
            stats[series] = Stat(
                count,
                float(fields.get(f"{series}:sum", "0")),
                float(fields.get(f"{series}:max", "0")),
            )
    return Profile(stats)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self.redis = redis
        self.metrics = metrics
        self.cluster = cluster
        self.source = source
        self.records = RecordStore(redis)
        self._fold = redis.register_script(_FOLD)
        self._merge = redis.register_script(_MERGE)
        self._owners: OrderedDict[str, OwnerRef] = OrderedDict()
        self._cache_size = cache_size
        self.live_annotation_interval_s = live_annotation_interval_s
        self.idle_ttl_s = idle_ttl_s
        self.finished_ttl_s = finished_ttl_s
        self.late_samples_s = late_samples_s
        self._annotated_at: dict[str, float] = {}
        self._not_annotatable: set[str] = set()
        self.latest: OrderedDict[tuple[str, str], dict[str, PodMetric]] = OrderedDict()
        self._kv: KeyValue | None = None
        self._node_models: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retries: set[asyncio.Task[Any]] = set()
        # Called with the owner object once its record is written and announced (in-process
        # followers such as the TrialJob controller).
        self.on_finalized: list[Callable[[Mapping[str, Any]], Awaitable[None]]] = []

    # -- pod metrics ------------------------------------------------------------------
    async def owner_of(self, metric: PodMetric | PodSummary) -> OwnerRef | None:
        cached = self._owners.get(metric.pod_uid)
        if cached is not None:
            return cached
        stored = await self.redis.hgetall(f"{P}pod:{metric.pod_uid}:meta")
        if stored:
            meta = {_text(k): _text(v) for k, v in stored.items()}
            owner = OwnerRef(
                meta["owner_api_version"],
                meta["owner_kind"],
                meta["namespace"],
                meta["owner_name"],
                meta["owner_uid"],
            )
        else:
            pod: Mapping[str, Any] | None
            try:
                pod = await self.kube.get(PODS, metric.pod, metric.namespace)
            except NotFound:
                pod = None  # gone before we could ask whose it was
            if pod is None or str(pod.get("metadata", {}).get("uid")) != metric.pod_uid:
                # Gone, or a new pod with the old name: a summary still names the controller.
                pod = _pod_of_summary(metric)
                if pod is None:
                    return None
            owner = await resolve_owner(self.kube, pod)
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(
                f"{P}pod:{metric.pod_uid}:meta",
                mapping={
                    "namespace": metric.namespace,
                    "name": metric.pod,
                    "node": metric.node,
                    "owner_api_version": owner.api_version,
                    "owner_kind": owner.kind,
                    "owner_name": owner.name,
                    "owner_uid": owner.uid,
                },
            )
            pipe.sadd(f"{P}owner:{owner.uid}:pods", metric.pod_uid)
            pipe.sadd(f"{P}owner:{owner.uid}:nodes", metric.node)
            pipe.set(f"{P}owner-by-name:{owner.namespace}/{owner.name}", owner.uid)
            pipe.hset(
                f"{P}owner:{owner.uid}:meta",
                mapping={"kind": owner.kind, "name": owner.name, "namespace": owner.namespace},
            )
            await pipe.execute()
        self._owners[metric.pod_uid] = owner
        while len(self._owners) > self._cache_size:
            self._owners.popitem(last=False)
        return owner

    def _working_keys(self, owner_uid: str, pod_uids: list[str], by_name: str | None) -> list[str]:
        keys = [f"{P}owner:{owner_uid}:{part}" for part in ("pods", "nodes", "gpus", "meta")]
        for pod_uid in pod_uids:
            keys += [f"{P}pod:{pod_uid}:meta", f"{P}pod:{pod_uid}:stats"]
        if by_name is not None:
            keys.append(by_name)
        return keys

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
        gpu_id = f"{metric.node}/{metric.gpu_uuid}" if metric.gpu_uuid else ""
        by_name = f"{P}owner-by-name:{owner.namespace}/{owner.name}"
        await self._fold(
            keys=[
                f"{P}pod:{metric.pod_uid}:stats",
                f"{P}owner:{owner.uid}:gpus",
                f"{P}done:{owner.uid}",
                f"{P}pod:{metric.pod_uid}:meta",
                *(f"{P}owner:{owner.uid}:{part}" for part in ("pods", "nodes", "meta")),
                by_name,
            ],
            args=[
                metric.ts.timestamp(),
                gpu_id,
                metric.gpu_util_pct,
                metric.gpu_mem_used_mib,
                metric.sm_util_pct,
                metric.cpu_util_cores,
                metric.mem_used_mib,
                self.idle_ttl_s,
            ],
        )
        await self._annotate_live(owner, metric.ts.timestamp())

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
        args: list[str | float | int] = [
            summary.first_ts.timestamp(),
            summary.last_ts.timestamp(),
            self.idle_ttl_s,
            len(PodSummary.SERIES),
        ]
        for name in PodSummary.SERIES:
            series = summary.series(name)
            args += [name, series.count, series.total, series.max]
        args += [f"{summary.node}/{gpu}" for gpu in summary.gpus]
        await self._merge(
            keys=[
                f"{P}pod:{summary.pod_uid}:stats",
                f"{P}owner:{owner.uid}:gpus",
                f"{P}done:{owner.uid}",
                f"{P}pod:{summary.pod_uid}:meta",
                *(f"{P}owner:{owner.uid}:{part}" for part in ("pods", "nodes", "meta")),
                f"{P}owner-by-name:{owner.namespace}/{owner.name}",
            ],
            args=args,
        )
        self.metrics.summaries_folded.inc()
        if summary.gpu_model and summary.node not in self._node_models:
            self._node_models[summary.node] = summary.gpu_model
        await self._finalize_if_finished(owner)

    async def _finalize_if_finished(self, owner: OwnerRef) -> None:
        if owner.kind == "Pod" or await self.redis.exists(f"{P}done:{owner.uid}"):
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
            await self._finalize_or_retry(obj, resource, done[0], done[1], attempt=0)

    async def _annotate_live(self, owner: OwnerRef, now: float) -> None:
        """Keep the running owner's utilization annotations current, at most once per interval.

        Driven by arriving samples, not a timer: an owner whose pods stopped reporting is not
        touched again until it finishes, when `finalize` writes the final numbers.
        """
        interval = self.live_annotation_interval_s
        if interval <= 0 or owner.kind == "Pod" or owner.uid in self._not_annotatable:
            return
        last = self._annotated_at.get(owner.uid)
        if last is not None and now - last < interval:
            return
        self._annotated_at[owner.uid] = now
        if await self.redis.exists(f"{P}done:{owner.uid}"):
            return
        profile, _ = await self.owner_profile(owner.uid)
        patch = {"metadata": {"annotations": owner_annotations(profile)}}
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

    # -- profiles ---------------------------------------------------------------------
    async def pod_profile(self, pod_uid: str) -> tuple[Profile, dict[str, str]]:
        fields = {
            _text(k): _text(v)
            for k, v in (await self.redis.hgetall(f"{P}pod:{pod_uid}:stats")).items()
        }
        return profile_from_hash(fields), fields

    async def owner_profile(self, owner_uid: str) -> tuple[Profile, list[dict[str, str]]]:
        pods = sorted(_text(p) for p in await self.redis.smembers(f"{P}owner:{owner_uid}:pods"))
        profiles = []
        raw = []
        for uid in pods:
            profile, fields = await self.pod_profile(uid)
            profiles.append(profile)
            raw.append({"pod_uid": uid, **fields})
        return Profile.fold(profiles), raw

    async def owner_uid_by_name(self, namespace: str, name: str) -> str | None:
        uid = await self.redis.get(f"{P}owner-by-name:{namespace}/{name}")
        return _text(uid) if uid is not None else None

    async def gpu_model(self, owner_uid: str) -> str:
        nodes = sorted(_text(n) for n in await self.redis.smembers(f"{P}owner:{owner_uid}:nodes"))
        for node in nodes:
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
        await self._finalize_or_retry(obj, resource, done[0], done[1], attempt=0)

    async def _finalize_or_retry(
        self,
        obj: Mapping[str, Any],
        resource: Resource,
        outcome: Outcome,
        end_ts: float | None,
        attempt: int,
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
        task = spawn(
            self._retry_later(obj, resource, outcome, end_ts, attempt, delay_s),
            name=f"profiler.aggregator.retry-{uid}",
        )
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _samples_may_be_in_flight(self, uid: str, end_ts: float | None) -> bool:
        """A finished owner without samples that ended less than `late_samples_s` ago."""
        if end_ts is None or time.time() - end_ts > self.late_samples_s:
            return False
        if await self.redis.exists(f"{P}done:{uid}"):
            return False
        return not await self.redis.scard(f"{P}owner:{uid}:pods")

    async def close(self) -> None:
        """Stop pending retries (they resume from the next watch event after a restart)."""
        await cancel_all(list(self._retries))

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
        await self._finalize_or_retry(obj, resource, outcome, end_ts, attempt)

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
        done_key = f"{P}done:{uid}"
        if await self.redis.exists(done_key):
            return None
        annotations: dict[str, str] = {}
        if await self.redis.scard(f"{P}owner:{uid}:pods"):
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
        phase = JobPhase.COMPLETED if outcome == "succeeded" else JobPhase.FAILED
        event = JobEvent(
            phase=phase,
            cluster=self.cluster,
            namespace=ns,
            kind=str(obj.get("kind") or _kind_of(resource)),
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
        pod_uids = {_text(p) for p in await self.redis.smembers(f"{P}owner:{uid}:pods")}
        by_name = f"{P}owner-by-name:{ns}/{name}"
        async with self.redis.pipeline(transaction=True) as pipe:
            # Outlives the working keys, so a replay in between still sees "done".
            pipe.set(done_key, "1", ex=2 * self.finished_ttl_s)
            for key in self._working_keys(uid, sorted(pod_uids), None):
                pipe.expire(key, self.finished_ttl_s)
            await pipe.execute()
        if _text(await self.redis.get(by_name) or b"") == uid:
            await self.redis.expire(by_name, self.finished_ttl_s)
        self._annotated_at.pop(uid, None)
        self._not_annotatable.discard(uid)
        for pod_key, by_gpu in list(self.latest.items()):
            if any(m.pod_uid in pod_uids for m in by_gpu.values()):
                self.metrics.forget_pod(*pod_key)
                # The live view is of running pods: a finished job's last samples only filled
                # the cache up to its bound (the soak saw the aggregator grow by them).
                del self.latest[pod_key]
        for pod_uid in pod_uids:
            self._owners.pop(pod_uid, None)
        for follower in self.on_finalized:
            await follower(obj)
        return record

    async def _profiled_record(
        self, obj: Mapping[str, Any], resource: Resource, outcome: Outcome, end_ts: float | None
    ) -> tuple[ExecutionRecord, dict[str, str]]:
        """The record of a job whose samples were folded, and the usage annotations it was
        given (written on it first)."""
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        ns = str(meta.get("namespace", ""))
        name = str(meta.get("name", ""))
        profile, pod_fields = await self.owner_profile(uid)
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
        created = _ts(meta.get("creationTimestamp")) or time.time()
        start = _ts((obj.get("status") or {}).get("startTime")) or (
            first_seen if first_seen != float("inf") else created
        )
        last_seen = max((float(f.get("last_ts", "0")) for f in pod_fields), default=0.0)
        end = end_ts or last_seen or time.time()
        steps, throughput = await self.progress(obj, uid, max(0.0, end - start))
        gpus = template_gpus(obj) or int(await self.redis.scard(f"{P}owner:{uid}:gpus"))
        model = object_model(obj)  # Alnair's annotation names or the seeds'
        record = ExecutionRecord(
            namespace=ns,
            job_name=name,
            uid=uid,
            model_name=model.model_name or "",
            batch_size=model.batch_size or "",
            data_size=model.data_size or "",
            epoch=model.epoch or "",
            gpu_model=await self.gpu_model(uid),
            gpu_count=gpus,
            submit_ts=created,
            start_ts=start,
            end_ts=max(end, start),
            steps=steps,
            throughput_steps_per_s=throughput,
            peak_gpu_mem_mib=profile.get("gpu_mem_used_mib").max,
            mean_gpu_util_pct=profile.get("gpu_util_pct").mean,
            outcome=outcome,
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
        created = _ts(meta.get("creationTimestamp")) or end_ts
        start = _ts((obj.get("status") or {}).get("startTime")) or created
        template = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        selected = (template.get("nodeSelector") or {}).get(res.LABEL_GPU_MODEL, "")
        steps = _number(_annotation(obj, ANN_STEPS))
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
        )

    async def progress(
        self, owner: Mapping[str, Any], owner_uid: str, duration_s: float, max_pods: int = 32
    ) -> tuple[int | None, float | None]:
        """Training steps and steps/s the workload reported, from its owner or its pods.

        Data-parallel workers report the same global step, so pods count by their maximum.
        Steps over the run's duration give the throughput; a reported throughput alone gives
        the steps it implies.
        """
        steps = _number(_annotation(owner, ANN_STEPS))
        rate = _number(_annotation(owner, ANN_THROUGHPUT))
        if steps is None and rate is None:
            pod_uids = sorted(
                _text(p) for p in await self.redis.smembers(f"{P}owner:{owner_uid}:pods")
            )
            for pod_uid in pod_uids[:max_pods]:
                meta = {
                    _text(k): _text(v)
                    for k, v in (await self.redis.hgetall(f"{P}pod:{pod_uid}:meta")).items()
                }
                if not meta:
                    continue
                try:
                    pod = await self.kube.get(PODS, meta["name"], meta["namespace"])
                except NotFound:
                    continue
                ann = pod.get("metadata", {}).get("annotations") or {}
                pod_steps = _number(str(ann.get(ANN_STEPS, "")))
                pod_rate = _number(str(ann.get(ANN_THROUGHPUT, "")))
                if pod_steps is not None:
                    steps = max(steps or 0.0, pod_steps)
                if pod_rate is not None:
                    rate = max(rate or 0.0, pod_rate)
        if steps is not None:
            return int(steps), (steps / duration_s if duration_s > 0 else rate)
        if rate is not None:
            return int(rate * duration_s), rate
        return None, None

    async def is_profiled(self, owner_uid: str) -> bool:
        """Whether any pod of this owner was ever sampled (so a record will follow its end)."""
        return bool(await self.redis.scard(f"{P}owner:{owner_uid}:pods"))


def _pod_of_summary(item: PodMetric | PodSummary) -> dict[str, Any] | None:
    """The pod as its summary remembers it (the object may be gone): enough to find its owner."""
    if not isinstance(item, PodSummary) or not item.owner_uid:
        return None
    return {
        "metadata": {
            "namespace": item.namespace,
            "name": item.pod,
            "uid": item.pod_uid,
            "ownerReferences": [
                {
                    "apiVersion": item.owner_api_version,
                    "kind": item.owner_kind,
                    "name": item.owner_name,
                    "uid": item.owner_uid,
                    "controller": True,
                }
            ],
        }
    }


def _kind_of(resource: Resource) -> str:
    known = {
        "jobs": "Job",
        "elasticjobs": "ElasticJob",
        "trialjobs": "TrialJob",
        "statefulsets": "StatefulSet",
    }
    return known.get(resource.plural, resource.plural)
