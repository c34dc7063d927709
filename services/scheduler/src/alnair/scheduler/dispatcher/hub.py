"""The multi-cluster hub: one queue in the hub cluster, jobs run on worker clusters.

Users create a batch/v1 Job in the hub with `spec.managedBy: alnair.io/multicluster` (so the
hub's own Job controller leaves it alone) and the queue label `alnair.io/queue-name`. The hub:

1. watches its queues (ClusterQueue, LocalQueue, Cohort, as the single-cluster dispatcher), its
   managed Jobs, and the worker Secrets (`workers`); for each worker it watches GPU nodes and the
   Jobs it mirrored there;
2. on every change builds one `QueueSnapshot` over every reachable worker's GPUs (capacity keys
   `<cluster>/<type>`, runtimes from the predictor plus the transfer of the job's image, model
   and data over the worker's link, zero for what the worker already holds:
   `multicluster.scoring`) and asks the configured queueing policy, so quotas, fair share,
   order and the choice of cluster are one decision;
3. places a job by writing the choice on the hub Job (a patch conditioned on its
   resourceVersion, so a decision is applied once) and creating the mirror Job on the worker
   through its API (same spec, the GPU model as node selector, label `alnair.io/origin-uid`);
4. copies the mirror's status (conditions, counts, times) onto the hub Job, and publishes the
   `completed`/`failed` JobEvent when it ends, so the predictor learns from it;
5. when a worker stops answering for longer than the grace period: its mirrors that had not
   started go back to the queue (the worker is recorded on the hub Job, and the stale mirror is
   deleted when the worker answers again); running ones keep their place, get the
   `alnair.io/LostContact` condition and an Event, and are never started a second time;
6. a job no worker could ever hold (more GPUs of one type than any worker has, or a predicted
   peak above every GPU's memory) gets a `TooLarge` Event and waits.

No timer: informer events (hub or worker), predictor retrains and the workers' own watch
retries wake the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.events import JobEvent, JobPhase
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    CLUSTERQUEUES,
    COHORTS,
    JOBS,
    LOCALQUEUES,
    NAMESPACES,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
    Unavailable,
)
from alnair.common.metrics import Metrics
from alnair.common.tasks import spawn
from alnair.scheduler.dispatcher.loop import ReconcileLoop
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.objects import (
    LABEL_QUEUE,
    MANAGED_BY_HUB,
    Workload,
    is_finished,
    node_gpus,
    parse_cluster_queue,
    parse_workload,
)
from alnair.scheduler.dispatcher.predictions import JobPrediction, PredictionError, PredictorClient
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.workers import (
    ANN_ORIGIN,
    LABEL_ORIGIN,
    LABEL_WORKER,
    SECRETS,
    Worker,
    WorkerConfig,
    parse_worker_secret,
)
from alnair.scheduler.multicluster.scoring import (
    Artifact,
    ClusterOption,
    WorkerView,
    hub_snapshot,
    pool_key,
    score,
    split_key,
    unplaceable,
)
from alnair.scheduler.queueing import (
    ClusterQueueSpec,
    GpuPool,
    JobSpec,
    QueuePolicy,
    RunningJob,
    WaitReason,
    queue_policy,
)

log = logging.getLogger(__name__)
COMPONENT = "alnair-hub"
MANAGED_BY = MANAGED_BY_HUB
ANN_PLACED_CLUSTER = "alnair.io/placed-cluster"
ANN_PLACED_TYPE = "alnair.io/placed-gpu-model"
ANN_PLACED_AT = "alnair.io/placed-at"
ANN_ABANDONED = "alnair.io/abandoned-clusters"
"""Workers a job was taken back from while they did not answer (their mirror is deleted)."""
ANN_IMAGE_SIZE = "alnair.io/image-size-mb"
ANN_MODEL_URI = "alnair.io/model-uri"
ANN_MODEL_SIZE = "alnair.io/model-size-mb"
ANN_DATASET = "alnair.io/dataset"
ANN_DATA_SIZE_MB = "alnair.io/data-size-mb"
CONDITION_ADMITTED = "alnair.io/Admitted"
CONDITION_LOST = "alnair.io/LostContact"
_COPIED_STATUS = ("startTime", "active", "ready", "succeeded", "failed")
_TERMINAL = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
_TEMPLATE_LABELS = (
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
)


def _now_ts() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _size(annotations: dict[str, str], key: str) -> float:
    raw = annotations.get(key)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise InvalidValueError(key, raw, "not a number (MB)") from None
    if not (value >= 0 and math.isfinite(value)):
        raise InvalidValueError(key, raw, "must be >= 0 (MB)")
    return value


def job_artifacts(job: Obj) -> list[Artifact]:
    """The image(s), model and dataset a hub Job names, with their sizes (annotations, MB).

    An image is its reference (`spec.template.spec.containers[].image`, sized by
    `alnair.io/image-size-mb` in all); the model `alnair.io/model-uri` + `alnair.io/model-size-mb`;
    the dataset `alnair.io/dataset` + `alnair.io/data-size-mb` (a size without a name is a
    dataset only this job uses, so it is never found cached)."""
    meta = job["metadata"]
    annotations = meta.get("annotations") or {}
    containers = ((job["spec"].get("template") or {}).get("spec") or {}).get("containers") or []
    images = sorted({str(c.get("image")) for c in containers if c.get("image")})
    out: list[Artifact] = []
    image_mb = _size(annotations, ANN_IMAGE_SIZE)
    out.extend(Artifact(f"image:{image}", image_mb / max(1, len(images))) for image in images)
    model_mb = _size(annotations, ANN_MODEL_SIZE)
    if annotations.get(ANN_MODEL_URI) or model_mb:
        out.append(Artifact(f"model:{annotations.get(ANN_MODEL_URI) or meta.get('uid')}", model_mb))
    data_mb = _size(annotations, ANN_DATA_SIZE_MB)
    if annotations.get(ANN_DATASET) or data_mb:
        out.append(Artifact(f"data:{annotations.get(ANN_DATASET) or meta.get('uid')}", data_mb))
    return out


def _started(mirror: Obj) -> bool:
    status = mirror.get("status") or {}
    return bool(status.get("ready") or status.get("succeeded") or status.get("failed")) or (
        is_finished(mirror) is not None
    )


def mirror_of(hub_job: Obj, gpu_type: str, hub_cluster: str) -> Obj:
    """The Job created on the worker: the hub Job's spec, runnable there, on `gpu_type`."""
    meta = hub_job["metadata"]
    spec = copy.deepcopy(hub_job["spec"])
    for key in ("managedBy", "selector", "manualSelector"):
        spec.pop(key, None)
    spec["suspend"] = False
    template = spec.setdefault("template", {})
    labels = (template.setdefault("metadata", {}).get("labels")) or {}
    template["metadata"]["labels"] = {k: v for k, v in labels.items() if k not in _TEMPLATE_LABELS}
    template.setdefault("spec", {}).setdefault("nodeSelector", {})[res.LABEL_GPU_MODEL] = gpu_type
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if "/" not in k or k.startswith("alnair.io/")
    }
    for key in (ANN_PLACED_CLUSTER, ANN_PLACED_TYPE, ANN_PLACED_AT, ANN_ABANDONED):
        annotations.pop(key, None)
    annotations[ANN_ORIGIN] = f"{hub_cluster}/{meta['namespace']}/{meta['name']}"
    user_labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != LABEL_QUEUE}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**user_labels, LABEL_ORIGIN: meta["uid"]},
            "annotations": annotations,
        },
        "spec": spec,
    }


@dataclass(slots=True)
class HubJobState:
    key: str
    reason: WaitReason | None = None
    reason_evented: str | None = None
    prediction: JobPrediction | None = None
    prediction_error: str | None = None
    options: list[ClusterOption] = field(default_factory=list)
    mirrored_rv: str | None = None
    lost_evented: str | None = None
    evented: set[str] = field(default_factory=set)


class HubMetrics:
    def __init__(self, base: DispatcherMetrics) -> None:
        m = Metrics("dispatcher", base.registry)
        self.worker_up = m.gauge(
            "worker_up", "1 while a worker cluster answers, 0 when it does not", ["cluster"]
        )
        self.worker_gpus = m.gauge(
            "worker_gpus", "GPUs of a worker cluster, by state (total, free)", ["cluster", "state"]
        )
        self.worker_jobs = m.gauge(
            "worker_jobs", "Mirrored jobs on a worker cluster, by state", ["cluster", "state"]
        )
        self.worker_problems = m.gauge(
            "worker_problems",
            "Worker Secrets or clusters with a problem, by kind (invalid, unreachable, "
            "unauthorized)",
            ["kind"],
        )
        self.placements = m.counter("placements_total", "Jobs placed, per cluster", ["cluster"])
        self.redispatched = m.counter(
            "redispatched_total", "Not-started jobs taken back from a lost cluster", ["cluster"]
        )
        self.lost_contact = m.gauge(
            "lost_contact_jobs", "Running jobs on clusters that do not answer"
        )


class Hub(ReconcileLoop):
    name = "hub"
    """Dispatches queued hub Jobs to worker clusters by predicted completion."""

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
        super().__init__()
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.hub_metrics = HubMetrics(metrics)
        self.bus = bus
        self.predictor = predictor
        if policy is None:
            # The hub places and never preempts across clusters (a remote restart would pay the
            # transfer again), so `alnair` is asked not to reclaim nor preempt for order: no
            # decision goes unapplied.
            options: dict[str, Any] = (
                {"max_wait_s": settings.max_wait_s, "reclaim": False, "preempt": False}
                if settings.policy == "alnair"
                else {}
            )
            policy = queue_policy(settings.policy, **options)
        self.policy = policy
        ns = settings.hub_namespace
        self.secrets = Informer(
            kube, SECRETS, namespace=ns, label_selector=f"{LABEL_WORKER}=true", name="workers"
        )
        self.cluster_queues = Informer(kube, CLUSTERQUEUES, name="clusterqueues")
        self.local_queues = Informer(kube, LOCALQUEUES, name="localqueues")
        self.cohorts = Informer(kube, COHORTS, name="cohorts")
        self.jobs = Informer(kube, JOBS, label_selector=LABEL_QUEUE, name="hub-jobs")
        self.informers = (
            self.secrets,
            self.cluster_queues,
            self.local_queues,
            self.cohorts,
            self.jobs,
        )
        self.workers: dict[str, Worker] = {}
        self.invalid_workers: dict[str, str] = {}
        self.states: dict[str, HubJobState] = {}
        for informer in (self.cluster_queues, self.local_queues, self.cohorts, self.jobs):
            informer.add_handler(self._poke)
        self.secrets.add_handler(self._on_secret)

    # --- wake-ups and workers -----------------------------------------------------------

    def _poke(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        self._wake.set()

    def _on_secret(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        secret = obj["metadata"]["name"]
        for name, worker in list(self.workers.items()):
            if worker.config.secret == secret:
                if event is not WatchEvent.DELETED and worker.config.resource_version == str(
                    obj["metadata"].get("resourceVersion", "")
                ):
                    return
                del self.workers[name]
                self._tasks = [task for task in self._tasks if not task.done()]
                self._tasks.append(spawn(worker.stop(), name=f"hub.worker.{name}.stop"))
        self.invalid_workers.pop(secret, None)
        if event is not WatchEvent.DELETED:
            try:
                config = parse_worker_secret(obj)
                if config.name in self.workers:
                    raise InvalidValueError(
                        "alnair.io/cluster-name", config.name, "another Secret names it"
                    )
                worker = Worker(
                    config,
                    self.wake,
                    grace_s=self.settings.worker_grace_s,
                    retry_max_s=min(5.0, max(0.5, self.settings.worker_grace_s)),
                )
            except (InvalidValueError, ConfigError, OSError, ValueError) as exc:
                # A CA file that does not exist, a certificate that does not parse: reported,
                # never fatal, as any other bad Secret.
                log.warning("worker Secret refused", extra={"secret": secret, "error": str(exc)})
                self.invalid_workers[secret] = str(exc)
            else:
                self.workers[config.name] = worker
                worker.start()
        self._wake.set()

    # --- lifecycle ----------------------------------------------------------------------

    async def stop(self) -> None:
        for worker in list(self.workers.values()):
            await worker.stop()
        self.workers.clear()
        await super().stop()

    # --- one reconcile ------------------------------------------------------------------

    def _queues(self) -> dict[str, ClusterQueueSpec]:
        cohorts = {c["metadata"]["name"] for c in self.cohorts.values()}
        queues: dict[str, ClusterQueueSpec] = {}
        for obj in self.cluster_queues.values():
            with contextlib.suppress(InvalidValueError):
                spec = parse_cluster_queue(obj, cohorts)
                queues[spec.name] = spec
        return queues

    def _cluster_queue_of(self, wl: Workload) -> str | None:
        lq = self.local_queues.get(f"{wl.namespace}/{wl.local_queue}")
        if lq is None:
            return None
        return str((lq.get("spec") or {}).get("clusterQueue") or "") or None

    def views(self, placed: dict[str, tuple[str, int]]) -> list[WorkerView]:
        """Each worker now: GPUs by model from its nodes, less the GPUs of the hub's jobs placed
        there (`placed`: hub key -> (pool key, GPUs)); artifacts of the mirrors that started."""
        used: Counter[str] = Counter()
        for key, gpus in placed.values():
            used[key] += gpus
        out: list[WorkerView] = []
        for name, worker in sorted(self.workers.items()):
            totals = Counter[str]()
            memory: dict[str, float] = {}
            for node in worker.nodes.values():
                found = node_gpus(node)
                if found is None:
                    continue
                totals[found.model] += found.gpus
                known = found.memory_mib or float(res.GPU_MODEL_MEMORY_MIB.get(found.model, 0))
                memory[found.model] = min(
                    memory.get(found.model, known or math.inf), known or math.inf
                )
            artifacts: set[str] = set()
            for mirror in worker.jobs.values():
                if _started(mirror):
                    with contextlib.suppress(InvalidValueError):  # edited there by hand
                        artifacts.update(a.name for a in job_artifacts(mirror))
            out.append(
                WorkerView(
                    name=name,
                    bandwidth_mbps=worker.config.bandwidth_mbps,
                    pools={
                        model: GpuPool(
                            total,
                            max(0, total - used[pool_key(name, model)]),
                            memory.get(model, math.inf),
                        )
                        for model, total in sorted(totals.items())
                    },
                    artifacts=frozenset(artifacts),
                    region=worker.config.region,
                    reachable=worker.reachable,
                )
            )
        return out

    async def _predict(self, wl: Workload, models: list[str], state: HubJobState) -> None:
        state.prediction_error = None
        if self.predictor is None or not wl.features.get("model_name"):
            state.prediction = None
            if self.settings.require_predictions:
                state.prediction_error = "no model annotations to predict from (model_name)"
            return
        try:
            state.prediction = await self.predictor.predict(wl.features, wl.request.gpus, models)
        except PredictionError as exc:
            self.metrics.prediction_errors.inc()
            state.prediction, state.prediction_error = None, str(exc)

    def _spec(self, wl: Workload, queue: str, state: HubJobState) -> JobSpec:
        prediction = state.prediction
        created = wl.obj["metadata"].get("creationTimestamp")
        arrival = (
            datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
            if created
            else time.time()
        )
        return JobSpec(
            id=wl.key,
            queue=queue,
            gpus=wl.request.gpus,
            arrival_s=arrival,
            runtime=dict(prediction.runtime) if prediction else {},
            team=wl.namespace,
            gpu_model=wl.gpu_model,
            peak_memory_mib=prediction.peak_memory_mib if prediction else None,
            restart_cost_s=wl.restart_cost_s,
        )

    async def reconcile(self) -> None:
        started = time.perf_counter()
        self.reconciles += 1
        queues = self._queues()
        now = time.time()
        placed: dict[str, tuple[str, int]] = {}
        running: list[tuple[Workload, str, str, float]] = []
        """Placed jobs: (workload, queue, pool key, placed at)."""
        pending: list[tuple[Workload, str]] = []
        live: set[str] = set()
        lost_running = 0
        abandoned: dict[str, set[str]] = {}
        for obj in self.jobs.values():
            if (obj.get("spec") or {}).get("managedBy") != MANAGED_BY:
                continue
            meta = obj["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            live.add(key)
            state = self.states.setdefault(key, HubJobState(key))
            annotations = meta.get("annotations") or {}
            for cluster in filter(None, (annotations.get(ANN_ABANDONED) or "").split(",")):
                abandoned.setdefault(cluster, set()).add(meta["uid"])
            try:
                wl = parse_workload(obj, self.settings.default_restart_cost_s)
                job_artifacts(obj)
            except InvalidValueError as exc:
                if "invalid" not in state.evented:
                    state.evented.add("invalid")
                    await self._event(obj, "InvalidRequest", f"not queued: {exc}", warning=True)
                continue
            cluster = annotations.get(ANN_PLACED_CLUSTER)
            if cluster:
                if is_finished(obj) is not None:
                    continue  # its last status and its completion event are written
                gpu_type = annotations.get(ANN_PLACED_TYPE, "")
                outcome = await self._follow(wl, cluster, state)
                if outcome == "redispatched":
                    continue
                lost_running += outcome == "lost"
                key_on = pool_key(cluster, gpu_type)
                placed[key] = (key_on, wl.request.gpus)
                start = float(annotations.get(ANN_PLACED_AT) or now)
                running.append((wl, self._cluster_queue_of(wl) or "", key_on, start))
                continue
            if is_finished(obj) is not None:
                continue
            cq = self._cluster_queue_of(wl)
            if cq is None or cq not in queues:
                state.reason = WaitReason(
                    "queue",
                    f"LocalQueue {wl.namespace}/{wl.local_queue} or its ClusterQueue "
                    "does not exist or is inactive",
                )
                await self._wait_event(wl, state)
                continue
            pending.append((wl, cq))
            if "submitted" not in state.evented:
                state.evented.add("submitted")
                await self._publish(wl, JobPhase.SUBMITTED, {"queue": cq})
        for key in [k for k in self.states if k not in live]:
            del self.states[key]

        views = self.views(placed)
        models = sorted({m for v in views for m in v.pools})
        asked = [wl for wl, _ in pending] + [wl for wl, _, _, _ in running]
        await asyncio.gather(*(self._predict(wl, models, self.states[wl.key]) for wl in asked))
        # A placed job's predicted end tells the policy when its GPUs free up (its runtime on
        # the key it holds; the transfer is behind it or counted in the start).
        holding = []
        for wl, queue, key_on, start in running:
            spec = self._spec(wl, queue, self.states[wl.key])
            _, gpu_type = split_key(key_on)
            estimate = spec.runtime.get(gpu_type)
            spec = replace(spec, runtime={key_on: estimate} if estimate else {})
            holding.append(RunningJob(spec, key_on, start))
        candidates: list[tuple[JobSpec, list[Artifact]]] = []
        by_id: dict[str, Workload] = {}
        for wl, cq in pending:
            state = self.states[wl.key]
            if state.prediction_error is not None:
                state.reason = WaitReason("prediction", state.prediction_error)
                await self._wait_event(wl, state)
                continue
            spec = self._spec(wl, cq, state)
            artifacts = job_artifacts(wl.obj)
            state.options = score(spec, artifacts, views, now)
            too_large = unplaceable(spec, views)
            if too_large is not None:
                state.reason = WaitReason("capacity", f"no worker cluster can hold it: {too_large}")
                if "too-large" not in state.evented:
                    state.evented.add("too-large")
                    await self._event(wl.obj, "TooLarge", state.reason.message, warning=True)
                continue
            candidates.append((spec, artifacts))
            by_id[wl.key] = wl
        decisions = self.policy.decide(hub_snapshot(now, candidates, holding, queues, views))
        for admission in decisions.admissions:
            wl = by_id[admission.job_id]
            cluster, gpu_type = split_key(admission.gpu_type)
            await self._place(wl, cluster, gpu_type, now)
        for job_id, reason in decisions.waiting.items():
            state = self.states[job_id]
            state.reason = reason
            await self._wait_event(by_id[job_id], state)
        await self._collect(abandoned, live)
        self._report(views, lost_running)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    # --- acting -------------------------------------------------------------------------

    async def _place(self, wl: Workload, cluster: str, gpu_type: str, now: float) -> None:
        self.fence(f"placement of {wl.key}")
        meta = wl.obj["metadata"]
        patch = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {
                    ANN_PLACED_CLUSTER: cluster,
                    ANN_PLACED_TYPE: gpu_type,
                    ANN_PLACED_AT: f"{now:.3f}",
                },
            },
            "spec": {"suspend": False},
        }
        try:
            updated = await self.kube.patch(JOBS, wl.name, patch, wl.namespace)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self._wake.set()
            return
        self.jobs.store[f"{wl.namespace}/{wl.name}"] = updated
        state = self.states[wl.key]
        state.reason = None
        state.reason_evented = None
        option = next(
            (o for o in state.options if o.cluster == cluster and o.gpu_type == gpu_type), None
        )
        detail = (
            f"; predicted wait {option.wait_s:.0f} s + transfer {option.transfer_s:.0f} s "
            f"+ runtime {option.runtime_s:.0f} s"
            if option is not None and math.isfinite(option.runtime_s)
            else ""
        )
        message = f"placed on cluster {cluster}, {wl.request.gpus} x {gpu_type}{detail}"
        self.hub_metrics.placements.labels(cluster).inc()
        self.metrics.decisions.labels(self.policy.name, "admitted").inc()
        await self._event(updated, "Placed", message)
        await self._status(
            wl.name, wl.namespace, {}, [self._cond(CONDITION_ADMITTED, "True", "Placed", message)]
        )
        await self._publish(
            wl,
            JobPhase.ADMITTED,
            {"cluster": cluster, "gpu_model": gpu_type, "gpus": wl.request.gpus},
            seq=meta["resourceVersion"],
        )
        worker = self.workers.get(cluster)
        if worker is not None and worker.reachable:
            await self._ensure_mirror(worker, updated, gpu_type)

    async def _ensure_mirror(self, worker: Worker, hub_job: Obj, gpu_type: str) -> None:
        mirror = mirror_of(hub_job, gpu_type, self.settings.cluster)
        ns = mirror["metadata"]["namespace"]
        with contextlib.suppress(Conflict):
            await worker.kube.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
        try:
            created = await worker.kube.create(JOBS, mirror, ns)
            worker.jobs.store[f"{ns}/{mirror['metadata']['name']}"] = created
        except Conflict:
            pass  # already there: created by an earlier attempt
        except (ApiError, Unavailable) as exc:
            await self._event(hub_job, "MirrorFailed", f"on {worker.name}: {exc}", warning=True)

    async def _follow(self, wl: Workload, cluster: str, state: HubJobState) -> str:
        """Keep a placed job's mirror: create it, copy its status, react to a lost worker.
        Returns "ok", "lost" (running, no contact) or "redispatched"."""
        worker = self.workers.get(cluster)
        mirror = worker.jobs.get(wl.key) if worker is not None else None
        if (
            mirror is not None
            and (mirror["metadata"].get("labels") or {}).get(LABEL_ORIGIN) != wl.uid
        ):
            mirror = None  # a mirror of an older Job of the same name
        if worker is not None and worker.reachable:
            if mirror is None:
                if is_finished(wl.obj) is None:
                    gpu_type = wl.annotations.get(ANN_PLACED_TYPE, "")
                    await self._ensure_mirror(worker, wl.obj, gpu_type)
                return "ok"
            if state.lost_evented is not None:
                state.lost_evented = None
                await self._event(wl.obj, "ContactRestored", f"cluster {cluster} answers again")
                state.mirrored_rv = None
            await self._mirror_status(wl, mirror, cluster, state)
            return "ok"
        if worker is not None and not worker.lost:
            return "ok"  # within the grace period: wait
        why = worker.problem if worker is not None else "its Secret is gone"
        if mirror is None or not _started(mirror):
            abandoned = {c for c in (wl.annotations.get(ANN_ABANDONED) or "").split(",") if c}
            patch = {
                "metadata": {
                    "resourceVersion": wl.obj["metadata"]["resourceVersion"],
                    "annotations": {
                        ANN_PLACED_CLUSTER: None,
                        ANN_PLACED_TYPE: None,
                        ANN_PLACED_AT: None,
                        ANN_ABANDONED: ",".join(sorted(abandoned | {cluster})),
                    },
                }
            }
            try:
                updated = await self.kube.patch(JOBS, wl.name, patch, wl.namespace)
            except (Conflict, NotFound):
                self._wake.set()
                return "ok"
            self.jobs.store[wl.key] = updated
            self.hub_metrics.redispatched.labels(cluster).inc()
            message = f"cluster {cluster} does not answer ({why}); the job had not started there"
            await self._event(updated, "Redispatched", message, warning=True)
            await self._status(
                wl.name,
                wl.namespace,
                {},
                [self._cond(CONDITION_ADMITTED, "False", "Redispatched", message)],
            )
            self._wake.set()
            return "redispatched"
        if state.lost_evented != cluster:
            state.lost_evented = cluster
            message = (
                f"cluster {cluster} does not answer ({why}); the job was running there "
                "and is not started anywhere else"
            )
            await self._event(wl.obj, "LostContact", message, warning=True)
            await self._status(
                wl.name,
                wl.namespace,
                {},
                [self._cond(CONDITION_LOST, "True", "ClusterUnreachable", message)],
            )
        return "lost"

    async def _mirror_status(
        self, wl: Workload, mirror: Obj, cluster: str, state: HubJobState
    ) -> None:
        rv = str(mirror["metadata"].get("resourceVersion"))
        if state.mirrored_rv == rv:
            return
        status = mirror.get("status") or {}
        finished = is_finished(mirror)
        terminal = any(
            c.get("type") in _TERMINAL and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if terminal and finished is None:
            return  # the worker's Job controller is finishing it: its final status follows
        # The counts and times users read; not the worker controller's own bookkeeping
        # (uncounted pods), which the API server refuses on a finished Job.
        copied = {k: status[k] for k in _COPIED_STATUS if k in status}
        if (wl.obj.get("status") or {}).get("startTime"):
            # Immutable once set: a job taken back from a lost cluster keeps its first start.
            copied.pop("startTime", None)
        if finished is not None:
            copied.update(active=0, ready=0)
            if finished == "Complete" and status.get("completionTime"):
                copied["completionTime"] = status["completionTime"]
        ours = [
            c
            for c in ((wl.obj.get("status") or {}).get("conditions") or [])
            if str(c.get("type", "")).startswith("alnair.io/") and c.get("type") != CONDITION_LOST
        ]
        conditions = [
            *(status.get("conditions") or []),
            *ours,
            self._cond(CONDITION_LOST, "False", "Reachable", f"cluster {cluster} answers"),
        ]
        copied["conditions"] = conditions
        try:
            await self.kube.patch(JOBS, wl.name, {"status": copied}, wl.namespace, sub="status")
        except (Conflict, NotFound):
            self._wake.set()
            return
        except ApiError as exc:
            log.warning("hub status not written: %s", exc, extra={"job": wl.key, "error": str(exc)})
            return
        state.mirrored_rv = rv
        if finished is not None:
            runtime = None
            start, end = status.get("startTime"), status.get("completionTime")
            if start and end:
                runtime = (
                    datetime.fromisoformat(end.replace("Z", "+00:00"))
                    - datetime.fromisoformat(start.replace("Z", "+00:00"))
                ).total_seconds()
            phase = JobPhase.COMPLETED if finished == "Complete" else JobPhase.FAILED
            await self._publish(
                wl,
                phase,
                {
                    "cluster": cluster,
                    "gpu_model": wl.annotations.get(ANN_PLACED_TYPE),
                    "gpus": wl.request.gpus,
                    "runtime_s": runtime,
                    **wl.features,
                },
                seq="0",
                cluster=cluster,
            )

    async def _collect(self, abandoned: dict[str, set[str]], live: set[str]) -> None:
        """Delete mirrors the hub took back (their cluster answers again) or whose hub Job is
        gone: nothing the hub no longer tracks keeps running, nothing runs twice."""
        live_uids = {
            (
                o["metadata"].get("uid"),
                (o["metadata"].get("annotations") or {}).get(ANN_PLACED_CLUSTER),
            )
            for o in self.jobs.values()
        }
        uids = {u for u, _ in live_uids}
        for name, worker in self.workers.items():
            if not worker.reachable:
                continue
            for mirror in worker.jobs.values():
                origin = (mirror["metadata"].get("annotations") or {}).get(ANN_ORIGIN, "")
                if not origin.startswith(f"{self.settings.cluster}/"):
                    continue  # another hub's mirror on a shared worker
                uid = (mirror["metadata"].get("labels") or {}).get(LABEL_ORIGIN)
                stale = uid in abandoned.get(name, set()) and (uid, name) not in live_uids
                if stale or uid not in uids:
                    with contextlib.suppress(NotFound, Conflict, Unavailable):
                        await worker.kube.delete(
                            JOBS,
                            mirror["metadata"]["name"],
                            mirror["metadata"]["namespace"],
                            propagation="Background",
                        )

    # --- reporting ----------------------------------------------------------------------

    def _cond(self, type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        ts = _now_ts()
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": ts,
            "lastProbeTime": ts,
        }

    async def _status(
        self, name: str, ns: str, fields: dict[str, Any], conditions: list[dict[str, str]]
    ) -> None:
        current = self.jobs.get(f"{ns}/{name}") or {}
        kept = [
            c
            for c in ((current.get("status") or {}).get("conditions") or [])
            if c.get("type") not in {x["type"] for x in conditions}
        ]
        body = {"status": {**fields, "conditions": [*kept, *conditions]}}
        with contextlib.suppress(NotFound, Conflict):
            try:
                await self.kube.patch(JOBS, name, body, ns, sub="status")
            except ApiError as exc:
                log.warning("hub condition not written", extra={"job": name, "error": str(exc)})

    async def _wait_event(self, wl: Workload, state: HubJobState) -> None:
        if state.reason is None or state.reason_evented == state.reason.kind:
            return
        state.reason_evented = state.reason.kind
        text = f"{state.reason.kind}: {state.reason.message}"
        await self._event(
            wl.obj,
            "Waiting",
            f"waiting ({text})",
            warning=state.reason.kind in ("queue", "prediction"),
        )

    async def _event(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        try:
            await self.kube.event(
                {**obj, "apiVersion": "batch/v1", "kind": "Job"},
                reason=reason,
                message=message,
                type_="Warning" if warning else "Normal",
                component=COMPONENT,
            )
        except ApiError as exc:
            log.warning("event not written", extra={"reason": reason, "error": str(exc)})

    async def _publish(
        self,
        wl: Workload,
        phase: JobPhase,
        detail: dict[str, Any],
        seq: str = "0",
        cluster: str | None = None,
    ) -> None:
        if self.bus is None:
            return
        event = JobEvent(
            phase=phase,
            cluster=cluster or self.settings.cluster,
            namespace=wl.namespace,
            kind="Job",
            name=wl.name,
            uid=wl.uid,
            detail=detail,
        )
        try:
            await self.bus.publish(
                event, source=COMPONENT, event_id=f"{wl.uid}:{phase.value}:{seq}"
            )
        except Exception as exc:
            log.warning("job event not published", extra={"phase": phase.value, "error": repr(exc)})

    def _report(self, views: list[WorkerView], lost_running: int) -> None:
        m = self.hub_metrics
        by_name = {v.name: v for v in views}
        problems: Counter[str] = Counter({"invalid": len(self.invalid_workers)})
        for name, worker in self.workers.items():
            m.worker_up.labels(name).set(1 if worker.reachable else 0)
            problem = worker.problem
            if problem:
                problems[problem.split(":", 1)[0]] += 1
            view = by_name.get(name)
            if view is not None:
                m.worker_gpus.labels(name, "total").set(sum(p.total for p in view.pools.values()))
                m.worker_gpus.labels(name, "free").set(sum(p.free for p in view.pools.values()))
            mirrors = worker.jobs.values()
            m.worker_jobs.labels(name, "queued").set(sum(1 for j in mirrors if not _started(j)))
            m.worker_jobs.labels(name, "running").set(
                sum(1 for j in mirrors if _started(j) and is_finished(j) is None)
            )
        for kind in ("invalid", "unreachable", "unauthorized"):
            m.worker_problems.labels(kind).set(problems[kind])
        m.lost_contact.set(lost_running)

    def describe_clusters(self) -> dict[str, Any]:
        """`GET /v1/clusters`: every worker, whether it answers, its GPUs and jobs."""
        views = {v.name: v for v in self.views({})}
        out: list[dict[str, Any]] = []
        for name, worker in sorted(self.workers.items()):
            view = views.get(name)
            mirrors = worker.jobs.values()
            out.append(
                {
                    "name": name,
                    "secret": worker.config.secret,
                    "region": worker.config.region,
                    "bandwidth_mbps": worker.config.bandwidth_mbps,
                    "reachable": worker.reachable,
                    "lost": worker.lost,
                    "synced": worker.synced,
                    "problem": worker.problem,
                    "failing_for_s": round(worker.failing_for_s(), 1),
                    "gpus": {m: p.total for m, p in view.pools.items()} if view else {},
                    "artifacts": sorted(view.artifacts) if view else [],
                    "jobs": {
                        "queued": sum(1 for j in mirrors if not _started(j)),
                        "running": sum(1 for j in mirrors if _started(j) and not is_finished(j)),
                        "finished": sum(1 for j in mirrors if is_finished(j)),
                    },
                }
            )
        invalid = [{"secret": s, "problem": p} for s, p in sorted(self.invalid_workers.items())]
        return {"policy": self.policy.name, "clusters": out, "invalid": invalid}

    def explain(self, namespace: str, name: str) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        obj = self.jobs.get(key)
        if obj is None or (obj.get("spec") or {}).get("managedBy") != MANAGED_BY:
            raise NotFound(404, "NotFound", f"no hub Job {key} (managedBy {MANAGED_BY})", key)
        state = self.states.get(key) or HubJobState(key)
        annotations = obj["metadata"].get("annotations") or {}
        finished = is_finished(obj)
        cluster = annotations.get(ANN_PLACED_CLUSTER)
        status = finished.lower() if finished else ("placed" if cluster else "waiting")
        if cluster and state.lost_evented:
            status = "lost-contact"
        return {
            "job": key,
            "status": status,
            "cluster": cluster,
            "gpu_model": annotations.get(ANN_PLACED_TYPE),
            "abandoned": [c for c in (annotations.get(ANN_ABANDONED) or "").split(",") if c],
            "reason": {"kind": state.reason.kind, "message": state.reason.message}
            if state.reason and status == "waiting"
            else None,
            "options": [
                {
                    "cluster": o.cluster,
                    "gpu_model": o.gpu_type,
                    "wait_s": _finite(o.wait_s),
                    "transfer_s": o.transfer_s,
                    "transfer_mb": o.transfer_mb,
                    "runtime_s": _finite(o.runtime_s),
                    "completion_s": _finite(o.completion_s),
                }
                for o in state.options
            ],
            "prediction_error": state.prediction_error,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = ["MANAGED_BY", "Hub", "WorkerConfig", "job_artifacts", "mirror_of"]
