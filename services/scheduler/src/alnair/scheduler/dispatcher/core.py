"""The admission core both backends stand on: the local dispatcher (`controller.Dispatcher`),
which admits workloads onto this cluster's GPUs, and the multi-cluster hub (`hub.Hub`), which
places them on worker clusters.

What is the same for both lives here, once:
- the queues (ClusterQueues, LocalQueues, Cohorts), read into the policy's specs, with why a
  queue admits nothing;
- the workloads, read through the kind adapters (`kinds.py`): one informer per kind and queue
  label, kinds from other projects watched only where the cluster serves their API, and the
  objects a kind's workloads name (a TrainJob's runtime);
- predictions, Events and the job events on the bus.

A backend says what it does with the policy's decisions: admit here, or place elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from alnair.common.bus import Bus
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.events import JobEvent, JobPhase
from alnair.common.informer import Informer
from alnair.common.kube import (
    CLUSTERQUEUES,
    COHORTS,
    LOCALQUEUES,
    NAMESPACES,
    KubeClient,
    NotFound,
    Obj,
    Resource,
)
from alnair.common.recorder import EventRecorder
from alnair.scheduler.dispatcher import kueue_queues as kq
from alnair.scheduler.dispatcher import kueue_workload as kw
from alnair.scheduler.dispatcher.loop import ReconcileLoop
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.parsing import Workload, parse_cluster_queue
from alnair.scheduler.dispatcher.predictions import JobPrediction, PredictionError, PredictorClient
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.queueing import ClusterQueueSpec, QueuePolicy, WaitReason

log = logging.getLogger(__name__)


def resource_version(obj: Obj) -> int:
    """resourceVersion as a number: etcd's revision, which the API server hands out in order
    (opaque by contract, so a non-number compares as oldest)."""
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass(slots=True)
class WorkloadState:
    """What a backend knows about one queued workload (dropped when the workload goes)."""

    key: str
    cluster_queue: str | None = None
    reason: WaitReason | None = None
    reason_evented: str | None = None
    prediction: JobPrediction | None = None
    prediction_error: str | None = None
    evented: set[str] = field(default_factory=set)
    """One-time notices already given (submitted, invalid, too large)."""


@dataclass(slots=True)
class QueueState:
    spec: ClusterQueueSpec | None
    problem: str | None
    kueue: kq.KueueQueue | None = None
    """Read from Kueue's objects (`queue_api: kueue`): its flavors' names, namespaces, hold."""


class QueueCore(ReconcileLoop):
    """Queues, workloads of every kind a backend takes, predictions and reporting."""

    component: ClassVar[str] = "alnair-dispatcher"
    """Who Events and bus events come from."""

    def __init__(
        self,
        kube: KubeClient,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics,
        kinds: Iterable[WorkloadKind],
        *,
        bus: Bus | None,
        predictor: PredictorClient | None,
        policy: QueuePolicy,
    ) -> None:
        super().__init__()
        self.kube = kube
        self.events = EventRecorder(kube, self.component)
        self.settings = settings
        self.metrics = metrics
        self.bus = bus
        self.predictor = predictor
        self.policy = policy
        # The queues: Alnair's objects, or Kueue's own (kueue_queues.py) with the flavors,
        # priority classes and namespaces they name.
        kueue = settings.queue_api == "kueue"
        self.kinds: dict[str, WorkloadKind] = {
            k.kind: k for k in kinds if kueue or not k.kueue_only
        }
        queue_apis = (
            (kq.CLUSTERQUEUES, kq.LOCALQUEUES, kq.COHORTS)
            if kueue
            else (CLUSTERQUEUES, LOCALQUEUES, COHORTS)
        )
        self.cluster_queues = Informer(kube, queue_apis[0], name="clusterqueues")
        self.local_queues = Informer(kube, queue_apis[1], name="localqueues")
        self.cohorts = Informer(kube, queue_apis[2], name="cohorts")
        self.kueue_objects: dict[str, Informer] = (
            {
                "flavors": Informer(kube, kq.RESOURCEFLAVORS, name="resourceflavors"),
                "priorities": Informer(
                    kube, kq.WORKLOADPRIORITYCLASSES, name="workloadpriorityclasses"
                ),
                "namespaces": Informer(kube, NAMESPACES, name="namespaces"),
            }
            if kueue
            else {}
        )
        # Informers per kind of workload (kinds.py): one per queue label it reads.
        self.workload_watches: dict[str, tuple[Informer, ...]] = {
            name: tuple(
                Informer(kube, k.resource, label_selector=sel, name=k.informer(sel))
                for sel in k.label_selectors
            )
            for name, k in self.kinds.items()
        }
        # Objects workloads name and their kinds read (a TrainJob's runtime), one informer each.
        self.referenced: dict[str, Informer] = {
            r.plural: Informer(kube, r, name=f"referenced-{r.plural}", optional=True)
            for k in self.kinds.values()
            for r in k.references
        }
        self.queues: dict[str, QueueState] = {}
        self._refusals: dict[tuple[str, str, str, str | None], str | None] = {}
        """`_queue_refuses` by what it reads besides the workload, for one pass: thousands of
        workloads share a few queues, namespaces and priority classes."""
        self._classes: dict[str, Obj] | None = None
        """The WorkloadPriorityClasses by name, for one pass."""

    def queue_informers(self) -> list[Informer]:
        """The queues' informers: ClusterQueues first, then what else a queue reads."""
        return [
            self.cluster_queues,
            self.local_queues,
            self.cohorts,
            *self.kueue_objects.values(),
        ]

    def workload_informers(self) -> list[Informer]:
        return [
            *(i for group in self.workload_watches.values() for i in group),
            *self.referenced.values(),
        ]

    async def start_watching(self) -> None:
        """Watch every kind the cluster serves. A kind from another project whose API is not
        served (its CRD not installed) is left out, and the log says so once: installing it
        later takes a restart. Kueue's queue API, when it is the one asked for, must be."""
        if self.kueue_objects:
            r = kq.CLUSTERQUEUES
            doc = await self._api_resources(r)
            if not any(item.get("name") == r.plural for item in doc):
                raise ConfigError(
                    f"queue_api is kueue but the cluster does not serve {r.plural}.{r.group}/"
                    f"{r.version}: install Kueue's CRDs (v0.16 or later), or use queue_api alnair"
                )
        for name, kind in list(self.kinds.items()):
            if kind.optional and not await self._served(kind):
                r = kind.resource
                log.info(
                    "a kind is not queued: the cluster does not serve its API",
                    extra={"kind": kind.kind, "api": f"{r.plural}.{r.group}/{r.version}"},
                )
                left_out = list(self.workload_watches.pop(name))
                left_out += [self.referenced.pop(r.plural) for r in kind.references
                             if r.plural in self.referenced]  # fmt: skip
                self.informers = tuple(i for i in self.informers if i not in left_out)
        await super().start_watching()

    async def _served(self, kind: WorkloadKind) -> bool:
        r = kind.resource
        return any(item.get("name") == r.plural for item in await self._api_resources(r))

    async def _api_resources(self, r: Resource) -> list[Obj]:
        """The resources the API server serves in `r`'s group and version (none: [])."""
        try:
            doc = await self.kube.request("GET", f"/apis/{r.group}/{r.version}")
        except NotFound:
            return []
        return list(doc.get("resources") or [])

    def _lookup(self, resource: Resource, namespace: str | None, name: str) -> Obj | None:
        """An object a workload names, as its informer holds it (None: not there)."""
        informer = self.referenced.get(resource.plural)
        if informer is None:
            return None
        return informer.get(f"{namespace}/{name}" if namespace else name)

    def _object(self, kind: str, key: str) -> Obj | None:
        """One object of `kind` by namespace/name, the newer copy where two informers hold it
        (what `_objects` would say for it, without copying every store: an explanation)."""
        found: Obj | None = None
        for informer in self.workload_watches.get(kind, ()):
            obj = informer.store.get(key)
            if obj is not None and (
                found is None or resource_version(found) < resource_version(obj)
            ):
                found = obj
        return found

    def _objects(self, kind: str) -> Mapping[str, Obj]:
        """Every object of `kind` its informers hold, by namespace/name; one labelled both
        ways is held twice, and the newer copy counts."""
        informers = self.workload_watches.get(kind, ())
        if len(informers) == 1:
            return dict(informers[0].store)  # one informer: a copy of its store (callers await)
        merged: dict[str, Obj] = {}
        for informer in informers:
            for key, obj in informer.store.items():
                if key not in merged or resource_version(merged[key]) < resource_version(obj):
                    merged[key] = obj
        return merged

    def _remember(self, wl: Workload, updated: Obj) -> None:
        """Put an object we just wrote into the stores of the informers that hold it (unless a
        newer copy is there): the next reconcile must not decide on an older copy while the
        watch event is still on its way."""
        meta = updated["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        for informer in self.workload_watches.get(wl.kind, ()):
            current = informer.store.get(key)
            if current is not None and resource_version(current) <= resource_version(updated):
                informer.store[key] = updated

    # --- queues -------------------------------------------------------------------------

    def _read_queues(self) -> dict[str, ClusterQueueSpec]:
        """The active ClusterQueues' specs; `self.queues` keeps why the others admit nothing."""
        cohort_objs = {c["metadata"]["name"]: c for c in self.cohorts.values()}
        flavors = (
            {f["metadata"]["name"]: f for f in self.kueue_objects["flavors"].values()}
            if self.kueue_objects
            else {}
        )
        queues: dict[str, ClusterQueueSpec] = {}
        seen: dict[str, QueueState] = {}
        for obj in self.cluster_queues.values():
            name = obj["metadata"]["name"]
            try:
                if self.kueue_objects:
                    kueue = kq.parse_kueue_cluster_queue(obj, cohort_objs, flavors)
                    spec, state = kueue.spec, QueueState(kueue.spec, None, kueue)
                else:
                    spec = parse_cluster_queue(obj, set(cohort_objs))
                    state = QueueState(spec, None)
            except InvalidValueError as exc:
                seen[name] = QueueState(None, str(exc))
                continue
            seen[name] = state
            queues[name] = spec
        self.queues = seen
        self._refusals = {}
        self._classes = None
        return queues

    def _queue_refuses(self, cq: str, wl: Workload) -> str | None:
        """Why an active ClusterQueue does not take this workload now (Kueue's objects only:
        a hold, a namespace its selector leaves out, a LocalQueue or priority class it
        cannot use); None when it takes it."""
        state = self.queues.get(cq)
        if state is None or state.kueue is None:
            return None
        if state.kueue.hold:
            return f"ClusterQueue {cq} is held (spec.stopPolicy: Hold)"
        if wl.kind == kw.KIND and (why := kw.inactive(wl)) is not None:
            return why
        labels = wl.obj["metadata"].get("labels") or {}
        key = (cq, wl.namespace, wl.local_queue, labels.get(kq.LABEL_PRIORITY_CLASS))
        if key not in self._refusals:
            self._refusals[key] = self._refuses(state.kueue, key, labels)
        return self._refusals[key]

    def _refuses(
        self, kueue: kq.KueueQueue, key: tuple[str, str, str, str | None], labels: Mapping[str, str]
    ) -> str | None:
        cq, namespace, local_queue, _ = key
        lq = self.local_queues.get(f"{namespace}/{local_queue}")
        problem = kq.local_queue_problem(lq) if lq is not None else None
        if problem is not None:
            return problem
        ns = self.kueue_objects["namespaces"].get(namespace)
        ns_labels = (ns or {}).get("metadata", {}).get("labels") or {}
        if ns is None or not kueue.namespaces.matches(ns_labels):
            return f"ClusterQueue {cq}'s namespaceSelector does not select namespace {namespace}"
        try:
            kq.priority_of(labels, self._priority_classes())
        except KeyError as exc:
            return f"WorkloadPriorityClass {exc.args[0]} does not exist"
        return None

    def _priority_classes(self) -> dict[str, Obj]:
        if self._classes is None:
            informer = self.kueue_objects.get("priorities")
            self._classes = (
                {} if informer is None else {p["metadata"]["name"]: p for p in informer.values()}
            )
        return self._classes

    def _priority(self, wl: Workload) -> int:
        """The workload's priority: its WorkloadPriorityClass's value when it names one (Kueue's
        objects), else its pods' priority."""
        if wl.kind == kw.KIND:
            return kw.priority(wl)  # a Workload states its own (Kueue set it from its class)
        if self.kueue_objects:
            try:
                value = kq.priority_of(
                    wl.obj["metadata"].get("labels") or {}, self._priority_classes()
                )
            except KeyError:
                value = None
            if value is not None:
                return value
        template = (wl.obj.get("spec") or {}).get("template") or {}
        return int((template.get("spec") or {}).get("priority") or 0)

    def _cluster_queue_of(self, wl: Workload) -> str | None:
        lq = self.local_queues.get(f"{wl.namespace}/{wl.local_queue}")
        if lq is None:
            return None
        return str((lq.get("spec") or {}).get("clusterQueue") or "") or None

    # --- predictions and reporting ------------------------------------------------------

    async def _predict(
        self, wl: Workload, models: list[str], state: WorkloadState
    ) -> JobPrediction | None:
        """The predictor's runtimes and peak memory for the workload on `models`, kept on its
        state (None, and why in `prediction_error` where one is required, when there is none)."""
        state.prediction_error = None
        state.prediction = None
        if self.predictor is None or not wl.features.get("model_name"):
            if self.settings.require_predictions:
                state.prediction_error = "no model annotations to predict from (model_name)"
            return None
        try:
            state.prediction = await self.predictor.predict(wl.features, wl.request.gpus, models)
        except PredictionError as exc:
            self.metrics.prediction_errors.inc()
            state.prediction_error = str(exc)
        return state.prediction

    async def _event(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event about `obj` (a Job unless it says its apiVersion and kind), best
        effort: one the API server refuses is logged, never a reason to stop the queue."""
        about = {
            **obj,
            "apiVersion": obj.get("apiVersion", "batch/v1"),
            "kind": obj.get("kind", "Job"),
        }
        await self.events.post(about, reason, message, type_="Warning" if warning else "Normal")

    async def _publish(
        self,
        wl: Workload,
        phase: JobPhase,
        detail: dict[str, Any],
        seq: str = "0",
        cluster: str | None = None,
    ) -> None:
        """The workload's `JobEvent` on the bus (the predictor learns from completions)."""
        if self.bus is None:
            return
        event = JobEvent(
            phase=phase,
            cluster=cluster or self.settings.cluster,
            namespace=wl.namespace,
            kind=wl.kind,
            name=wl.name,
            uid=wl.uid,
            detail=detail,
        )
        try:
            # A deterministic id: a restarted backend republishing a step is deduplicated.
            await self.bus.publish(
                event, source=self.component, event_id=f"{wl.uid}:{phase.value}:{seq}"
            )
        except Exception as exc:
            log.warning("job event not published", extra={"phase": phase.value, "error": repr(exc)})
