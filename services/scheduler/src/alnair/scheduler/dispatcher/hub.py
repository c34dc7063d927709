"""The multi-cluster hub: one queue in the hub cluster, workloads run on worker clusters.

The hub is the second backend of the admission core (`core.QueueCore`): the same queues, kind
adapters, predictions and reporting as the local dispatcher, with placement on a worker instead
of admission here. Users create a workload of any kind whose adapter can hand it to another
controller (`kinds.DELEGABLE`: a batch/v1 Job, a JobSet, a RayJob or RayCluster, a Kubeflow
TrainJob) with `spec.managedBy: alnair.io/multicluster` (so the hub's own controllers leave it
alone) and a queue label. The hub:

1. watches its queues (ClusterQueue, LocalQueue, Cohort, as the single-cluster dispatcher), its
   managed workloads of each kind it serves, and the worker Secrets (`worker_clusters`); for
   each worker it watches GPU nodes and, per kind, the copies it made there (a worker that
   does not serve a kind gets none of that kind);
2. on every change builds one `QueueSnapshot` over every reachable worker's GPUs (capacity keys
   `<cluster>/<type>`, runtimes from the predictor plus the transfer of the job's image, model
   and data over the worker's link, zero for what the worker already holds:
   `multicluster.scoring`) and asks the configured queueing policy, so quotas, fair share,
   order and the choice of cluster are one decision;
3. places a workload by writing the choice on it (a patch conditioned on its resourceVersion,
   so a decision is applied once) and creating its mirror on the worker through its API (same
   spec, released by its kind's adapter onto the GPU model, label `alnair.io/origin-uid`);
4. copies the mirror's status onto the hub's object (for a Job the counts, times and
   conditions, keeping the hub's own; for other kinds the whole status), and publishes the
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
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.errors import InvalidValueError
from alnair.common.events import JobPhase
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    Conflict,
    KubeClient,
    NotFound,
    Obj,
    Unavailable,
)
from alnair.scheduler.dispatcher.core import QueueCore
from alnair.scheduler.dispatcher.hub_report import (
    HubJobState,
    cluster_descriptions,
    hub_explanation,
    report_metrics,
)
from alnair.scheduler.dispatcher.hub_writing import HubWriter
from alnair.scheduler.dispatcher.kinds import DELEGABLE, JOB, KINDS
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics, HubMetrics
from alnair.scheduler.dispatcher.mirrors import (
    ANN_ABANDONED,
    ANN_DATA_SIZE_MB,
    ANN_DATASET,
    ANN_IMAGE_SIZE,
    ANN_MODEL_SIZE,
    ANN_MODEL_URI,
    ANN_PLACED_AT,
    ANN_PLACED_CLUSTER,
    ANN_PLACED_TYPE,
    CONDITION_LOST,
    MANAGED_BY,
    condition,
    delegated,
    job_artifacts,
    mirror_of,
    started,
)
from alnair.scheduler.dispatcher.parsing import Workload, node_gpus
from alnair.scheduler.dispatcher.predictions import PredictorClient
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.worker_clusters import (
    ANN_ORIGIN,
    LABEL_ORIGIN,
    LABEL_WORKER,
    SECRETS,
    WorkerConfig,
    WorkerSet,
)
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.dispatcher.writing import CONDITION_ADMITTED
from alnair.scheduler.multicluster.scoring import (
    Artifact,
    WorkerView,
    hub_snapshot,
    pool_key,
    score,
    split_key,
    unplaceable,
)
from alnair.scheduler.queueing import (
    GpuPool,
    JobSpec,
    QueuePolicy,
    RunningJob,
    WaitReason,
    queue_policy,
)

log = logging.getLogger(__name__)
COMPONENT = "alnair-hub"


class Hub(QueueCore):
    """Places queued workloads on worker clusters by predicted completion."""

    name = "hub"
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
        super().__init__(
            kube, settings, metrics, DELEGABLE, bus=bus, predictor=predictor, policy=policy
        )
        self.hub_metrics = HubMetrics(metrics)
        self.secrets = Informer(
            kube,
            SECRETS,
            namespace=settings.hub_namespace,
            label_selector=f"{LABEL_WORKER}=true",
            name="workers",
        )
        watching = self.workload_informers()
        self.informers = (self.secrets, *self.queue_informers(), *watching)
        self.fleet = WorkerSet(
            self.wake,
            grace_s=settings.worker_grace_s,
            kinds=lambda: [self.kinds[k] for k in self.workload_watches],
        )
        self.workers = self.fleet.workers
        self.invalid_workers = self.fleet.invalid
        self.states: dict[str, HubJobState] = {}
        self.writer = HubWriter(
            kube, settings.cluster, self.jobs,
            event=self._event, publish=self._publish, wake=self._wake.set,
            remember=self._remember,
        )  # fmt: skip
        for informer in (*self.queue_informers(), *watching):
            informer.add_handler(self._poke)
        self.secrets.add_handler(self.fleet.on_secret)

    @property
    def jobs(self) -> Informer:
        """The hub's queued Jobs (the informer by Alnair's queue label)."""
        return self.workload_watches[JOB.kind][0]

    # --- wake-ups and workers -----------------------------------------------------------

    def _poke(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        self._wake.set()

    # --- lifecycle ----------------------------------------------------------------------

    async def stop(self) -> None:
        await self.fleet.stop()
        await super().stop()

    # --- one reconcile ------------------------------------------------------------------

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
            for kind, mirror in worker.mirrored():
                if started(mirror, KINDS[kind]):
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

    def _spec(
        self, wl: Workload, queue: str, state: HubJobState, serving: frozenset[str] | None
    ) -> JobSpec:
        """The workload as the policy sees it; `serving`: the workers that serve its kind."""
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
            priority=self._priority(wl),
            peak_memory_mib=prediction.peak_memory_mib if prediction else None,
            restart_cost_s=wl.restart_cost_s,
            clusters=serving,
        )

    def _serving(self, kind: WorkloadKind) -> frozenset[str] | None:
        """The workers a workload of `kind` may go to (None: any, as every one serves Jobs)."""
        if kind.kind == JOB.kind:
            return None
        return frozenset(name for name, w in self.workers.items() if w.serves(kind.kind))

    def _hub_workloads(self) -> Iterator[tuple[Obj, WorkloadKind]]:
        """Every workload of the kinds the hub takes that names it."""
        for name in self.workload_watches:
            kind = self.kinds[name]
            for obj in self._objects(name).values():
                if delegated(obj):
                    yield obj, kind

    async def reconcile(self) -> None:
        started = time.perf_counter()
        self.reconciles += 1
        queues = self._read_queues()
        now = time.time()
        placed: dict[str, tuple[str, int]] = {}
        running: list[tuple[Workload, str, str, float]] = []
        """Placed workloads: (workload, queue, pool key, placed at)."""
        pending: list[tuple[Workload, str]] = []
        live: set[str] = set()
        lost_running = 0
        abandoned: dict[str, set[str]] = {}
        for obj, kind in self._hub_workloads():
            meta = obj["metadata"]
            key = kind.key_of(obj)
            live.add(key)
            state = self.states.setdefault(key, HubJobState(key))
            annotations = meta.get("annotations") or {}
            for cluster in filter(None, (annotations.get(ANN_ABANDONED) or "").split(",")):
                abandoned.setdefault(cluster, set()).add(meta["uid"])
            try:
                seen = kind.resolve(obj, self._lookup) if kind.resolve is not None else obj
                wl = kind.parse(seen, self.settings.default_restart_cost_s)
                job_artifacts(obj)
            except InvalidValueError as exc:
                if "invalid" not in state.evented:
                    state.evented.add("invalid")
                    await self._event(
                        kind.ref(obj), "InvalidRequest", f"not queued: {exc}", warning=True
                    )
                continue
            cluster = annotations.get(ANN_PLACED_CLUSTER)
            if cluster:
                if kind.finished(obj) is not None:
                    continue  # its last status and its completion event are written
                gpu_type = annotations.get(ANN_PLACED_TYPE, "")
                outcome = await self._follow(wl, kind, cluster, state)
                if outcome == "redispatched":
                    continue
                lost_running += outcome == "lost"
                key_on = pool_key(cluster, gpu_type)
                placed[key] = (key_on, wl.request.gpus)
                start = float(annotations.get(ANN_PLACED_AT) or now)
                running.append((wl, self._cluster_queue_of(wl) or "", key_on, start))
                continue
            if kind.finished(obj) is not None:
                continue
            cq = self._cluster_queue_of(wl)
            if cq is None or cq not in queues:
                state.reason = WaitReason(
                    "queue",
                    f"LocalQueue {wl.namespace}/{wl.local_queue} or its ClusterQueue "
                    "does not exist or is inactive",
                )
                await self.writer.wait_event(wl, state)
                continue
            refused = self._queue_refuses(cq, wl)
            if refused is not None:
                state.reason = WaitReason("queue", refused)
                await self.writer.wait_event(wl, state)
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
            spec = self._spec(wl, queue, self.states[wl.key], None)
            _, gpu_type = split_key(key_on)
            estimate = spec.runtime.get(gpu_type)
            spec = replace(spec, runtime={key_on: estimate} if estimate else {})
            holding.append(RunningJob(spec, key_on, start))
        candidates: list[tuple[JobSpec, list[Artifact]]] = []
        by_id: dict[str, Workload] = {}
        serving = {name: self._serving(self.kinds[name]) for name in self.workload_watches}
        for wl, cq in pending:
            state = self.states[wl.key]
            if state.prediction_error is not None:
                state.reason = WaitReason("prediction", state.prediction_error)
                await self.writer.wait_event(wl, state)
                continue
            spec = self._spec(wl, cq, state, serving[wl.kind])
            artifacts = job_artifacts(wl.obj)
            state.options = score(spec, artifacts, views, now)
            too_large = unplaceable(spec, views)
            if too_large is not None:
                state.reason = WaitReason("capacity", f"no worker cluster can hold it: {too_large}")
                if "too-large" not in state.evented:
                    state.evented.add("too-large")
                    await self._event(wl.ref(), "TooLarge", state.reason.message, warning=True)
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
            await self.writer.wait_event(by_id[job_id], state)
        await self._collect(abandoned, live)
        report_metrics(
            self.hub_metrics, self.workers, len(self.invalid_workers), views, lost_running
        )
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
            updated = await self.kube.patch(wl.resource, wl.name, patch, wl.namespace)
        except (Conflict, NotFound):
            self.metrics.write_conflicts.inc()
            self._wake.set()
            return
        self._remember(wl, updated)
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
        await self._event(KINDS[wl.kind].ref(updated), "Placed", message)
        await self.writer.status(wl, {}, [condition(CONDITION_ADMITTED, "True", "Placed", message)])
        await self._publish(
            wl,
            JobPhase.ADMITTED,
            {"cluster": cluster, "gpu_model": gpu_type, "gpus": wl.request.gpus},
            seq=meta["resourceVersion"],
        )
        worker = self.workers.get(cluster)
        if worker is not None and worker.reachable:
            await self.writer.ensure_mirror(worker, updated, wl, gpu_type)

    async def _follow(
        self, wl: Workload, kind: WorkloadKind, cluster: str, state: HubJobState
    ) -> str:
        """Keep a placed workload's mirror: create it, copy its status, react to a lost
        worker. Returns "ok", "lost" (running, no contact) or "redispatched"."""
        worker = self.workers.get(cluster)
        mirrors = worker.mirrors.get(kind.kind) if worker is not None else None
        mirror = mirrors.get(f"{wl.namespace}/{wl.name}") if mirrors is not None else None
        if (
            mirror is not None
            and (mirror["metadata"].get("labels") or {}).get(LABEL_ORIGIN) != wl.uid
        ):
            mirror = None  # a mirror of an older workload of the same name
        if worker is not None and worker.reachable:
            if mirror is None:
                if kind.finished(wl.obj) is None:
                    gpu_type = wl.annotations.get(ANN_PLACED_TYPE, "")
                    await self.writer.ensure_mirror(worker, wl.obj, wl, gpu_type)
                return "ok"
            if state.lost_evented is not None:
                state.lost_evented = None
                await self._event(wl.ref(), "ContactRestored", f"cluster {cluster} answers again")
                state.mirrored_rv = None
            await self.writer.mirror_status(wl, kind, mirror, cluster, state)
            return "ok"
        if worker is not None and not worker.lost:
            return "ok"  # within the grace period: wait
        why = worker.problem if worker is not None else "its Secret is gone"
        if mirror is None or not started(mirror, kind):
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
                updated = await self.kube.patch(wl.resource, wl.name, patch, wl.namespace)
            except (Conflict, NotFound):
                self._wake.set()
                return "ok"
            self._remember(wl, updated)
            self.hub_metrics.redispatched.labels(cluster).inc()
            message = f"cluster {cluster} does not answer ({why}); the job had not started there"
            await self._event(kind.ref(updated), "Redispatched", message, warning=True)
            await self.writer.status(
                wl, {}, [condition(CONDITION_ADMITTED, "False", "Redispatched", message)]
            )
            self._wake.set()
            return "redispatched"
        if state.lost_evented != cluster:
            state.lost_evented = cluster
            message = (
                f"cluster {cluster} does not answer ({why}); the job was running there "
                "and is not started anywhere else"
            )
            await self._event(wl.ref(), "LostContact", message, warning=True)
            await self.writer.status(
                wl, {}, [condition(CONDITION_LOST, "True", "ClusterUnreachable", message)]
            )
        return "lost"

    async def _collect(self, abandoned: dict[str, set[str]], live: set[str]) -> None:
        """Delete mirrors the hub took back (their cluster answers again) or whose hub
        workload is gone: nothing the hub no longer tracks keeps running, nothing runs twice."""
        live_uids = {
            (
                o["metadata"].get("uid"),
                (o["metadata"].get("annotations") or {}).get(ANN_PLACED_CLUSTER),
            )
            for kind in self.workload_watches
            for o in self._objects(kind).values()
        }
        uids = {u for u, _ in live_uids}
        for name, worker in self.workers.items():
            if not worker.reachable:
                continue
            for kind, mirror in worker.mirrored():
                origin = (mirror["metadata"].get("annotations") or {}).get(ANN_ORIGIN, "")
                if not origin.startswith(f"{self.settings.cluster}/"):
                    continue  # another hub's mirror on a shared worker
                uid = (mirror["metadata"].get("labels") or {}).get(LABEL_ORIGIN)
                stale = uid in abandoned.get(name, set()) and (uid, name) not in live_uids
                if stale or uid not in uids:
                    with contextlib.suppress(NotFound, Conflict, Unavailable):
                        await worker.kube.delete(
                            KINDS[kind].resource,
                            mirror["metadata"]["name"],
                            mirror["metadata"]["namespace"],
                            propagation="Background",
                        )

    # --- reporting ----------------------------------------------------------------------

    def describe_clusters(self) -> dict[str, Any]:
        """`GET /v1/clusters`: every worker, whether it answers, its GPUs and jobs."""
        views = {v.name: v for v in self.views({})}
        clusters = cluster_descriptions(self.workers, views)
        invalid = [{"secret": s, "problem": p} for s, p in sorted(self.invalid_workers.items())]
        return {"policy": self.policy.name, "clusters": clusters, "invalid": invalid}

    def explain(self, namespace: str, name: str, *, kind: str = "Job") -> dict[str, Any]:
        adapter = KINDS[kind]
        key = adapter.key(namespace, name)
        obj = self._object(kind, f"{namespace}/{name}")
        if obj is None or not delegated(obj):
            raise NotFound(
                404, "NotFound", f"no hub {kind} {namespace}/{name} (managedBy {MANAGED_BY})", key
            )
        state = self.states.get(key) or HubJobState(key)
        return hub_explanation(kind, obj, state, adapter.finished(obj))


__all__ = [
    "ANN_ABANDONED",
    "ANN_DATASET",
    "ANN_DATA_SIZE_MB",
    "ANN_IMAGE_SIZE",
    "ANN_MODEL_SIZE",
    "ANN_MODEL_URI",
    "ANN_PLACED_AT",
    "ANN_PLACED_CLUSTER",
    "ANN_PLACED_TYPE",
    "MANAGED_BY",
    "Hub",
    "WorkerConfig",
    "delegated",
    "job_artifacts",
    "mirror_of",
]
