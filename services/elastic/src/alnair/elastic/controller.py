"""The ElasticJob controller: watches, one reconcile at a time per job, status and events.

Four informers feed it (ElasticJobs, their StatefulSets, all pods, all nodes); nothing polls.
What wakes a job:
- its own ElasticJob (a new generation), StatefulSet or worker pods changing;
- anything that frees GPUs: a bound pod deleted or finished, a node added or its GPUs, taints or
  readiness changed; these wake every job below its maximum (a grow candidate);
- a scale request (`alnair.scale.<ns>.<job>`, phase requested) from the scheduler or dispatcher;
- the end of a cooldown, when a grow was held back by one (one deferred call, not a timer loop).

Each job has one lock, so its events are handled in order while different jobs run in parallel;
wake-ups that arrive while a pass is queued fold into that pass. A pass is level-based: it reads
the caches, decides the size (`sizing.decide`), creates what is missing, patches only the
StatefulSet's `.spec.replicas`, rewrites the host list, and writes the status. A restarted
controller therefore converges from whatever it finds, and a scale request redelivered after a
crash finds its id in `status.lastResize.eventId` (or an unchanged size) and changes nothing.

Workers the scheduler takes (a surplus worker preempted for a higher-priority job) are noticed
by their deletion while their ordinal is still below the replicas this controller set: the job
shrinks to its highest surviving ordinal + 1 instead of letting the StatefulSet recreate them,
and if fewer than the minimum survive the job re-queues at its minimum (WaitingForMin), which
is not a failure. Failures are worker pods that reached phase Failed; they count against
`maxRestarts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from alnair.common.errors import TemporaryError
from alnair.common.events import ScaleEvent, ScalePhase
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    CONFIGMAPS,
    ELASTICJOBS,
    NODES,
    PODGROUPS,
    PODS,
    STATEFULSETS,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
)
from alnair.common.recorder import EventRecorder
from alnair.common.tasks import in_flight, spawn
from alnair.elastic import manifests as m
from alnair.elastic.metrics import ElasticMetrics
from alnair.elastic.scaling import Outcome, ScaleRequest
from alnair.elastic.settings import ElasticSettings
from alnair.elastic.sizing import (
    FINISHED,
    ClusterView,
    Decision,
    decide,
    holds_gpus,
    node_facts,
    shape_of,
)
from alnair.elastic.spec import (
    JOB_LABEL,
    ROLE_LABEL,
    ElasticSpec,
    Rendezvous,
    SpecError,
    parse,
)
from alnair.elastic.status import (
    Resize,
    WorkerView,
    condition,
    count_failures,
    job_status,
    ordinal,
    parse_ts,
    terminating,
)

log = logging.getLogger(__name__)

Publisher = Callable[[ScaleEvent, str], Awaitable[None]]
"""Publishes a scale event with the given event id (the bus, or nothing without NATS)."""

COMPONENT = "alnair-elastic"
LOST_SETTLE_S = 0.25
"""How long the victims of one preemption take to be deleted, so they make one shrink."""
CONFLICT_RETRY_S = 0.2
"""A status write refused because the job changed since the pass read it: the next pass, on
the newer copy, after this long (the watch has usually brought it by then)."""


@dataclass
class JobState:
    """What the controller remembers of a job between passes (rebuilt from the API on restart)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    target: int | None = None
    last_resize: Resize | None = None
    lost_workers: bool = False
    lost_at: float = 0.0
    ceiling: int | None = None
    gang_min: int | None = None
    """Set by a requested shrink: capacity-driven grows stop there until a request lifts it."""
    deferred: asyncio.TimerHandle | None = None
    ensured_uid: str = ""
    invalid_generation: int = -1
    failed_reported: bool = False
    status: dict[str, Any] | None = None
    hosts: list[str] = field(default_factory=list)
    history: deque[Resize] = field(default_factory=lambda: deque(maxlen=50))


class Controller:
    """Runs every ElasticJob in `settings.namespace` (all namespaces when empty)."""

    def __init__(
        self,
        kube: KubeClient,
        settings: ElasticSettings,
        metrics: ElasticMetrics,
        publish: Publisher | None = None,
        on_death: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.kube = kube
        self.events = EventRecorder(kube, COMPONENT)
        self.settings = settings
        self.metrics = metrics
        self.publish = publish
        self.on_death = on_death
        ns = settings.namespace or None
        self.jobs = Informer(kube, ELASTICJOBS, namespace=ns, name="elasticjobs")
        self.sets = Informer(
            kube, STATEFULSETS, namespace=ns, label_selector=JOB_LABEL, name="elastic-sets"
        )
        self.pods = Informer(kube, PODS, name="elastic-pods")
        self.nodes = Informer(kube, NODES, name="elastic-nodes")
        self.jobs.add_handler(self._on_job)
        self.sets.add_handler(self._on_set)
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)
        self.state: dict[str, JobState] = {}
        self._view: ClusterView | None = None
        """Sizing's reading of the nodes and pods, until either changes."""
        self._by_job: dict[tuple[str, str], dict[str, Obj]] = {}
        """Pods by (namespace, the job label they carry), so a pass does not walk every pod."""
        self._kicked: set[str] = set()
        self._passes: set[asyncio.Task[Any]] = set()
        self.tasks: list[asyncio.Task[Any]] = []
        self.started = asyncio.Event()
        self.leading: Callable[[], bool] = lambda: True
        """Whether this replica decides (the leader elector's `leading`, when elected)."""

    # --- lifecycle ------------------------------------------------------------------------

    def informers(self) -> tuple[Informer, ...]:
        return (self.nodes, self.pods, self.sets, self.jobs)

    async def start(self) -> None:
        """Start the informers, wait for their first lists, then reconcile every job once."""
        for inf in (self.nodes, self.pods, self.sets, self.jobs):
            self.tasks.append(
                spawn(inf.run(), name=f"elastic.informer.{inf.name}", on_death=self.on_death)
            )
        for inf in (self.nodes, self.pods, self.sets, self.jobs):
            await inf.synced.wait()
        self.started.set()
        for key in list(self.jobs.store):
            self.kick(key)

    async def stop(self) -> None:
        for st in self.state.values():
            if st.deferred is not None:
                st.deferred.cancel()
        for t in [*self.tasks, *self._passes]:
            t.cancel()
        for t in [*self.tasks, *self._passes]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def _in_scope(self, namespace: str | None) -> bool:
        return not self.settings.namespace or namespace == self.settings.namespace

    def st(self, key: str) -> JobState:
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = JobState(history=deque(maxlen=self.settings.max_history))
        return st

    def _forget(self, key: str) -> None:
        st = self.state.pop(key, None)
        if st is not None and st.deferred is not None:
            st.deferred.cancel()

    # --- wake-ups -------------------------------------------------------------------------

    def kick(self, key: str) -> None:
        """Reconcile `key` soon; wake-ups arriving before that pass starts fold into it."""
        if key in self._kicked:
            return
        self._kicked.add(key)
        in_flight(self._kicked_pass(key), name=f"elastic.reconcile.{key}", into=self._passes)

    async def _kicked_pass(self, key: str) -> None:
        st = self.st(key)
        async with st.lock:
            self._kicked.discard(key)
            try:
                await self.reconcile(key)
            except (TemporaryError, ApiError) as exc:
                # Conflicts and API trouble: the next pass reads fresh caches.
                self.metrics.reconciles.labels("error").inc()
                log.warning("reconcile failed", extra={"job": key, "error": str(exc)})
                self._defer(key, self.settings.error_backoff_s)
        if self.jobs.get(key) is None and self.state.get(key) is st:
            # Gone: a pass its StatefulSet or pods woke after its deletion keeps nothing.
            self._forget(key)

    def _defer(self, key: str, delay_s: float) -> None:
        st = self.st(key)
        if st.deferred is not None:
            st.deferred.cancel()
        st.deferred = asyncio.get_running_loop().call_later(max(delay_s, 0.0), self.kick, key)

    def _growable(self) -> list[str]:
        out = []
        for key, obj in self.jobs.store.items():
            spec = obj.get("spec") or {}
            target = self.st(key).target
            if spec.get("suspend") or (target is not None and target >= spec.get("maxReplicas", 0)):
                continue
            out.append(key)
        return out

    def _kick_growable(self) -> None:
        for key in self._growable():
            self.kick(key)

    def _on_job(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if event is WatchEvent.DELETED:
            self._forget(key)
            return
        if (
            old is None
            or old["metadata"].get("generation") != obj["metadata"].get("generation")
            or old["metadata"].get("uid") != obj["metadata"].get("uid")
            # Completion is reported in the status (the only status change not ours).
            or ((old.get("status") or {}).get("phase") == "Succeeded")
            != ((obj.get("status") or {}).get("phase") == "Succeeded")
        ):
            self.kick(key)

    def _on_set(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        job = (obj["metadata"].get("labels") or {}).get(JOB_LABEL)
        if job and event is not WatchEvent.DELETED:
            if (
                old is not None
                and old.get("status") == obj.get("status")
                and (old.get("spec") or {}).get("replicas")
                == (obj.get("spec") or {}).get("replicas")
            ):
                return
            self.kick(f"{obj['metadata']['namespace']}/{job}")

    def _index(self, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if old is not None:
            before = (old["metadata"].get("labels") or {}).get(JOB_LABEL)
            if before:
                self._unindex(meta["namespace"], before, key)
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        if not job:
            return
        if event is WatchEvent.DELETED:
            self._unindex(meta["namespace"], job, key)
        else:
            self._by_job.setdefault((meta["namespace"], job), {})[key] = pod

    def _unindex(self, namespace: str, job: str, key: str) -> None:
        """`key` is no longer one of `job`'s pods; a job without pods leaves the index."""
        group = self._by_job.get((namespace, job))
        if group is None:
            return
        group.pop(key, None)
        if not group:
            del self._by_job[(namespace, job)]

    def _on_pod(self, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        self._view = None
        self._index(event, pod, old)
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        job = labels.get(JOB_LABEL)
        if job and labels.get(ROLE_LABEL) == "worker" and self._in_scope(meta.get("namespace")):
            key = f"{meta['namespace']}/{job}"
            self._note_worker_change(key, event, pod, old)
            self.kick(key)
        if self._frees_gpus(event, pod, old):
            self._kick_growable()

    def _note_worker_change(self, key: str, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        """A bound worker deleted below the replicas we set was taken from us (preempted)."""
        going = event is WatchEvent.DELETED or (
            terminating(pod) and (old is None or not terminating(old))
        )
        if not going:
            return
        before = old or pod
        if not (before.get("spec") or {}).get("nodeName"):
            return  # a pending worker held nothing
        if (before.get("status") or {}).get("phase") in FINISHED:
            return  # failures are counted, not treated as preemption
        target = self.st(key).target
        if target is not None and ordinal(pod) < target:
            st = self.st(key)
            if not st.lost_workers:
                st.lost_at = time.monotonic()
            st.lost_workers = True

    @staticmethod
    def _frees_gpus(event: WatchEvent, pod: Obj, old: Obj | None) -> bool:
        before = old if old is not None else pod
        if not holds_gpus(before):
            return False
        return event is WatchEvent.DELETED or not holds_gpus(pod)

    def _on_node(self, event: WatchEvent, node: Obj, old: Obj | None) -> None:
        self._view = None
        if event is WatchEvent.DELETED:
            return
        if old is None or node_facts(old) != node_facts(node):
            self._kick_growable()

    # --- scale requests -------------------------------------------------------------------

    async def request(self, namespace: str, name: str, req: ScaleRequest) -> Outcome:
        """Apply a scale request (from the bus or the API) under the job's lock."""
        key = f"{namespace}/{name}"
        if not self._in_scope(namespace) or key not in self.jobs.store:
            outcome = Outcome(None, None, refused=f"no ElasticJob {key} here")
        else:
            async with self.st(key).lock:
                outcome = await self.reconcile(key, req)
        self.metrics.scale_requests.labels("refused" if outcome.refused else "applied").inc()
        if self.publish is not None and req.event_id:
            phase = ScalePhase.REFUSED if outcome.refused else ScalePhase.APPLIED
            event = ScaleEvent(
                phase=phase,
                namespace=namespace,
                job=name,
                replicas=outcome.replicas if outcome.replicas is not None else 0,
                previous_replicas=outcome.previous,
                reason=outcome.refused or outcome.reason,
            )
            # The id follows the request's: a redelivered request publishes no second answer.
            await self.publish(event, f"{req.event_id}.{phase.value}")
        return outcome

    # --- the pass -------------------------------------------------------------------------

    def workers(self, spec: ElasticSpec) -> list[Obj]:
        pods = self._by_job.get((spec.namespace, spec.name), {}).values()
        return [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == "worker"]

    def view(self) -> ClusterView:
        """The nodes and pods as sizing reads them, rebuilt after any of them changed."""
        if self._view is None:
            self._view = ClusterView(self.nodes.values(), self.pods.values())
        return self._view

    async def reconcile(self, key: str, req: ScaleRequest | None = None) -> Outcome:
        t0 = time.perf_counter()
        try:
            return await self._reconcile(key, req)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - t0)

    async def _reconcile(self, key: str, req: ScaleRequest | None) -> Outcome:
        if not self.leading():
            # Another replica decides; it reconciles every job when it starts leading.
            return Outcome(None, None, refused="not the leader: another replica decides")
        obj = self.jobs.get(key)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return Outcome(None, None, refused=f"ElasticJob {key} is gone")
        st = self.st(key)
        status = (
            st.status
            if st.status is not None and st.ensured_uid == obj["metadata"].get("uid")
            else dict(obj.get("status") or {})
        )
        try:
            spec = parse(obj)
        except SpecError as exc:
            await self._invalid(obj, st, exc)
            self.metrics.reconciles.labels("invalid").inc()
            return Outcome(None, None, refused=str(exc))
        if (
            req is not None
            and req.event_id
            and ((status.get("lastResize") or {}).get("eventId") == req.event_id)
        ):
            self.metrics.scale_requests.labels("duplicate").inc()
            return Outcome(st.target, status.get("lastResize", {}).get("from"), reason="duplicate")
        if st.ensured_uid != spec.uid:
            await m.ensure_owned(self.kube, spec)
            st.ensured_uid = spec.uid
            st.status = None
            last = status.get("lastResize") or {}
            when = parse_ts(last.get("time"))
            if status.get("ceiling") is not None:
                st.ceiling = int(status["ceiling"])
            if when is not None and st.last_resize is None:
                st.last_resize = Resize(
                    when,
                    int(last.get("from", 0)),
                    int(last.get("to", 0)),
                    str(last.get("reason", "")),
                    str(last.get("eventId", "")),
                )
        if st.gang_min != spec.min_replicas:
            # The minimum may have been lowered: the gang follows it (never the template).
            await self.kube.patch(
                PODGROUPS, spec.name, {"spec": {"minMember": spec.min_replicas}}, spec.namespace
            )
            st.gang_min = spec.min_replicas
        sts = self.sets.get(f"{spec.namespace}/{m.workers_name(spec)}")
        if st.target is None and sts is not None:
            st.target = int((sts.get("spec") or {}).get("replicas") or 0)
        current = st.target
        workers = self.workers(spec)

        restarts, counted = count_failures(workers, status)
        failed = restarts > spec.max_restarts
        live = [
            p
            for p in workers
            if holds_gpus(p) and not terminating(p) and (current is None or ordinal(p) < current)
        ]
        forced = None
        if st.lost_workers:
            # The scheduler deletes one preemption's victims one by one: let them all go
            # before shrinking, so one preemption is one resize.
            wait = st.lost_at + LOST_SETTLE_S - time.monotonic()
            if wait > 0:
                self._defer(key, wait)
            else:
                st.lost_workers = False
                forced = (max(ordinal(p) for p in live) + 1) if live else 0
        priority = max((int(p["spec"].get("priority") or 0) for p in workers), default=0)
        cap = self.view().capacity(shape_of(spec, priority), (spec.namespace, spec.name), len(live))
        now = datetime.now(UTC)
        if req is not None and current is not None and req.replicas >= current:
            st.ceiling = None  # a request for more lifts an earlier shrink's ceiling
        if failed:
            decision = Decision(0, f"{restarts} worker failure(s), more than maxRestarts")
        else:
            decision = decide(
                spec,
                current=current,
                running=len(live),
                capacity_workers=cap.workers
                if st.ceiling is None
                else min(cap.workers, st.ceiling),
                now_s=now.timestamp(),
                last_resize_s=st.last_resize.time.timestamp() if st.last_resize else None,
                request=req.replicas if req is not None else None,
                forced=forced,
            )
        if req is not None and current is not None:
            # The requester wants GPUs back: the job stays at or below the new size until a
            # later request asks for more (else freed GPUs would grow it straight back).
            st.ceiling = decision.target if req.replicas < current else None
        previous = current
        if sts is None:
            try:
                await self.kube.create(
                    STATEFULSETS,
                    m.stateful_set(spec, decision.target, self._hosts_url(spec)),
                    spec.namespace,
                )
                current = st.target = decision.target
            except Conflict:
                # Created by an earlier pass whose watch event has not arrived yet.
                found = await self.kube.get(STATEFULSETS, m.workers_name(spec), spec.namespace)
                current = st.target = int((found.get("spec") or {}).get("replicas") or 0)
        if current is not None and decision.target != current:
            await self.kube.patch(
                STATEFULSETS,
                m.workers_name(spec),
                {"spec": {"replicas": decision.target}},
                spec.namespace,
            )
            st.target = decision.target
            resize = Resize(
                now, current, decision.target, decision.reason, req.event_id if req else ""
            )
            await self._resized(spec, obj, st, resize, req)
        if decision.defer_s is not None:
            self._defer(key, decision.defer_s + 0.05)
        target = st.target if st.target is not None else decision.target
        await self._write_status(
            spec, obj, st, status, target, workers, restarts, counted, failed, decision
        )
        self.metrics.reconciles.labels("ok").inc()
        if req is None:
            return Outcome(target, previous, reason=decision.reason)
        if target == req.replicas or (previous is not None and target != previous):
            return Outcome(target, previous, reason=decision.clamped or decision.reason)
        return Outcome(target, previous, refused=decision.clamped or decision.reason)

    def _hosts_url(self, spec: ElasticSpec) -> str | None:
        if spec.rendezvous is not Rendezvous.HOROVOD or not self.settings.hosts_url:
            return None
        base = self.settings.hosts_url.rstrip("/")
        return f"{base}/v1/elasticjobs/{spec.namespace}/{spec.name}/hosts"

    async def _resized(
        self, spec: ElasticSpec, obj: Obj, st: JobState, resize: Resize, req: ScaleRequest | None
    ) -> None:
        st.last_resize = resize
        st.history.append(resize)
        direction = "grow" if resize.replicas > resize.previous else "shrink"
        self.metrics.resizes.labels(direction).inc()
        log.info(
            "resized",
            extra={
                "job": spec.key,
                "from": resize.previous,
                "to": resize.replicas,
                "reason": resize.reason,
            },
        )
        await self._event(
            obj, "Resized", f"{resize.previous} -> {resize.replicas} worker(s): {resize.reason}"
        )
        if self.publish is not None and req is None:
            event = ScaleEvent(
                phase=ScalePhase.APPLIED,
                namespace=spec.namespace,
                job=spec.name,
                replicas=resize.replicas,
                previous_replicas=resize.previous,
                reason=resize.reason,
            )
            await self.publish(event, str(uuid.uuid4()))

    async def _invalid(self, obj: Obj, st: JobState, exc: SpecError) -> None:
        generation = int(obj["metadata"].get("generation") or 0)
        if st.invalid_generation == generation:
            return
        st.invalid_generation = generation
        log.warning("invalid ElasticJob", extra={"job": obj["metadata"]["name"], "error": str(exc)})
        await self._event(obj, "InvalidSpec", str(exc), warning=True)
        status = {
            "phase": "Invalid",
            "message": str(exc),
            "observedGeneration": generation,
            "conditions": [
                condition("Running", False, "InvalidSpec", str(exc), None),
            ],
        }
        await self._patch_status(obj, status)

    async def _event(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        await self.events.post(obj, reason, message, type_="Warning" if warning else "Normal")

    async def _patch_status(self, obj: Obj, status: dict[str, Any]) -> bool:
        """Write `status` over the copy this pass read, never over a newer one: a trainer's
        completion (`phase: Succeeded`) written meanwhile would otherwise be overwritten by
        the phase computed before it. False when not written; a pass on the newer copy follows."""
        meta = obj["metadata"]
        body: dict[str, Any] = {"status": status}
        if meta.get("resourceVersion"):
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        try:
            await self.kube.patch(ELASTICJOBS, meta["name"], body, meta["namespace"], sub="status")
        except NotFound:
            return False
        except Conflict:
            self._defer(f"{meta['namespace']}/{meta['name']}", CONFLICT_RETRY_S)
            return False
        return True

    async def _write_status(
        self,
        spec: ElasticSpec,
        obj: Obj,
        st: JobState,
        old: dict[str, Any],
        target: int,
        workers: list[Obj],
        restarts: int,
        counted: list[str],
        failed: bool,
        decision: Decision,
    ) -> None:
        view = WorkerView.of(spec, workers, target)
        if spec.rendezvous is Rendezvous.HOROVOD and view.hosts != st.hosts:
            cm = m.discovery_config_map(spec, view.hosts)
            await self.kube.patch(
                CONFIGMAPS, cm["metadata"]["name"], {"data": cm["data"]}, spec.namespace
            )
        st.hosts = view.hosts
        status = job_status(
            spec, old, view, target=target, restarts=restarts, counted=counted, failed=failed,
            reason=decision.reason, last_resize=st.last_resize, ceiling=st.ceiling,
        )  # fmt: skip
        if failed and not st.failed_reported:
            st.failed_reported = True
            await self._event(obj, "Failed", decision.reason, warning=True)
        if any(old.get(k) != v for k, v in status.items()) and not await self._patch_status(
            obj, status
        ):
            return
        st.status = {**old, **status}
