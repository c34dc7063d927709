"""Pod summaries: what the node agent remembers of each pod's run, so that no run goes unrecorded.

Samples travel on core NATS, where losing one is harmless, but a pod that runs entirely while
the bus is away would leave no sample at all, and the aggregator needs one to write a record.
So the agent folds every sample it takes into a running summary per pod (count, sum and max
of each series, first and last sample, GPUs, node's GPU model, the pod's controller), and
when the pod ends it turns that summary into a `PodSummary` event for the JetStream stream
SUMMARIES. Summaries not yet stored by JetStream wait in `pending` (bounded: the oldest are
dropped, counted and logged, beyond `max_pending`) until the connection returns.

The spool: the agent runs on the node and may be SIGKILLed while it holds summaries nobody
else has. `Spool` keeps them in one JSON file in the agent's state directory, rewritten
atomically (temporary file, then rename) when the pending set changes, and, while the bus is
unreachable, with the running summaries too (then no sample reached the aggregator, and a
kill would lose the pod's whole run). While the bus is up the running summaries are not
written: the aggregator already holds their samples. A restarted agent loads the file,
continues the running summaries of pods still running and ends the others at its first
sample (their end happened while it was down).
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from alnair.common.events import PodMetric, PodSummary, SeriesSummary
from alnair.profiler.statistics import GPU_SERIES, POD_SERIES, Stat

log = logging.getLogger(__name__)

SPOOL_FILE = "pod-summaries.json"
_FINISHED = {"Succeeded", "Failed"}


@dataclass
class PodRun:
    """The running summary of one pod (mutable; one per pod uid)."""

    node: str
    namespace: str
    pod: str
    pod_uid: str
    first_ts: float
    last_ts: float
    owner: tuple[str, str, str, str] = ("", "", "", "")
    """apiVersion, kind, name, uid of the pod's controller."""
    gpu_model: str = ""
    gpus: set[str] = field(default_factory=set)
    ticks: int = 0
    stats: dict[str, Stat] = field(default_factory=dict)
    _tick_ts: float = float("-inf")

    def observe(self, metric: PodMetric) -> None:
        ts = metric.ts.timestamp()
        self.first_ts = min(self.first_ts, ts)
        self.last_ts = max(self.last_ts, ts)
        self.node = metric.node
        if metric.gpu_uuid:
            self.gpus.add(metric.gpu_uuid)
            for series in GPU_SERIES:
                self._add(series, float(getattr(metric, series)))
        # A pod on several GPUs reports CPU and memory once per GPU: once per tick here.
        if ts > self._tick_ts:
            self._tick_ts = ts
            self.ticks += 1
            for series in POD_SERIES:
                self._add(series, float(getattr(metric, series)))

    def _add(self, series: str, value: float) -> None:
        self.stats[series] = self.stats.get(series, Stat()).add(value)

    def event(self) -> PodSummary:
        def summary(series: str) -> SeriesSummary:
            s = self.stats.get(series, Stat())
            return SeriesSummary(count=s.count, total=s.total, max=s.max)

        api_version, kind, name, uid = self.owner
        return PodSummary(
            node=self.node,
            namespace=self.namespace,
            pod=self.pod,
            pod_uid=self.pod_uid,
            owner_api_version=api_version,
            owner_kind=kind,
            owner_name=name,
            owner_uid=uid,
            gpu_model=self.gpu_model,
            gpus=sorted(self.gpus)[:64],
            first_ts=_dt(self.first_ts),
            last_ts=_dt(self.last_ts),
            ticks=self.ticks,
            **{series: summary(series) for series in PodSummary.SERIES},
        )

    @staticmethod
    def of(event: PodSummary) -> PodRun:
        """A running summary continued from a spooled one (after a restart)."""
        run = PodRun(
            node=event.node,
            namespace=event.namespace,
            pod=event.pod,
            pod_uid=event.pod_uid,
            first_ts=event.first_ts.timestamp(),
            last_ts=event.last_ts.timestamp(),
            owner=(event.owner_api_version, event.owner_kind, event.owner_name, event.owner_uid),
            gpu_model=event.gpu_model,
            gpus=set(event.gpus),
            ticks=event.ticks,
            stats={
                series: Stat(s.count, s.total, s.max)
                for series in PodSummary.SERIES
                if (s := event.series(series)).count
            },
        )
        run._tick_ts = run.last_ts
        return run


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def controller_ref(pod: Mapping[str, Any]) -> tuple[str, str, str, str]:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    chosen = next((r for r in refs if r.get("controller")), refs[0] if len(refs) == 1 else None)
    if chosen is None:
        return ("", "", "", "")
    return (
        str(chosen.get("apiVersion", "")),
        str(chosen.get("kind", "")),
        str(chosen.get("name", "")),
        str(chosen.get("uid", "")),
    )


class SummaryBook:
    """Running summaries of the pods being sampled, and ended ones not yet published."""

    def __init__(self, max_pending: int = 10000) -> None:
        self.running: dict[str, PodRun] = {}
        self.pending: OrderedDict[str, PodSummary] = OrderedDict()
        self.max_pending = max_pending
        self.dropped = 0
        self._owners: dict[str, tuple[str, str, str, str]] = {}

    # -- what the watches say -----------------------------------------------------------
    def pod_changed(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """Remember a live pod's controller (its summary names it: the pod object may be gone
        by the time the aggregator reads the summary); forget pods that ended unsampled."""
        uid = str(pod.get("metadata", {}).get("uid", ""))
        if not uid:
            return
        phase = (pod.get("status") or {}).get("phase")
        if deleted or phase in _FINISHED:
            if uid not in self.running:
                self._owners.pop(uid, None)
            return
        owner = controller_ref(pod)
        self._owners[uid] = owner
        run = self.running.get(uid)
        if run is not None and owner[3]:
            run.owner = owner

    # -- what the sampler says ----------------------------------------------------------
    def observe(self, metrics: Iterable[PodMetric], gpu_model: Mapping[str, str]) -> None:
        for metric in metrics:
            run = self.running.get(metric.pod_uid)
            if run is None:
                ts = metric.ts.timestamp()
                run = PodRun(
                    metric.node,
                    metric.namespace,
                    metric.pod,
                    metric.pod_uid,
                    ts,
                    ts,
                    owner=self._owners.get(metric.pod_uid, ("", "", "", "")),
                )
                self.running[metric.pod_uid] = run
            if not run.gpu_model:
                run.gpu_model = gpu_model.get(metric.node, "")
            run.observe(metric)

    def end_all_but(self, alive: set[str]) -> list[PodSummary]:
        """End the runs of pods no longer alive: their summaries become pending."""
        ended = []
        for uid in [u for u in self.running if u not in alive]:
            run = self.running.pop(uid)
            self._owners.pop(uid, None)
            if not run.owner[3]:
                log.info("pod summary without its controller", extra={"pod": run.pod})
            summary = run.event()
            self.add_pending(summary)
            ended.append(summary)
        return ended

    def add_pending(self, summary: PodSummary) -> None:
        self.pending[summary.pod_uid] = summary
        self.pending.move_to_end(summary.pod_uid)
        while len(self.pending) > self.max_pending:
            uid, gone = self.pending.popitem(last=False)
            self.dropped += 1
            log.warning(
                "pod summary dropped: too many unpublished",
                extra={"pod": gone.pod, "uid": uid, "max_pending": self.max_pending},
            )

    def published(self, uid: str) -> None:
        self.pending.pop(uid, None)

    # -- the spool ----------------------------------------------------------------------
    def to_json(self, with_running: bool) -> str:
        doc = {
            "pending": [s.model_dump(mode="json") for s in self.pending.values()],
            "running": [r.event().model_dump(mode="json") for r in self.running.values()]
            if with_running
            else [],
        }
        return json.dumps(doc, separators=(",", ":"))

    def load_json(self, text: str) -> int:
        """Take back what a spool file holds; returns how many summaries it held."""
        doc = json.loads(text)
        n = 0
        for item in doc.get("pending") or []:
            self.add_pending(PodSummary.model_validate(item))
            n += 1
        for item in doc.get("running") or []:
            run = PodRun.of(PodSummary.model_validate(item))
            if run.pod_uid not in self.running and run.pod_uid not in self.pending:
                self.running[run.pod_uid] = run
                n += 1
        return n


class Spool:
    """The book's file in the agent's state directory (None: keep nothing on disk)."""

    def __init__(self, directory: Path | None) -> None:
        self.path = directory / SPOOL_FILE if directory is not None else None
        self._written_empty = False

    def load(self, book: SummaryBook) -> int:
        if self.path is None or not self.path.is_file():
            return 0
        try:
            n = book.load_json(self.path.read_text())
        except (OSError, ValueError, ValidationError) as exc:
            # A torn or foreign file must not keep the agent down: say so and start afresh.
            log.error(
                "pod summary spool unreadable", extra={"path": str(self.path), "error": str(exc)}
            )
            return 0
        log.info("pod summaries taken from the spool", extra={"count": n})
        return n

    def save(self, book: SummaryBook, with_running: bool) -> None:
        if self.path is None:
            return
        empty = not book.pending and not (with_running and book.running)
        if empty and self._written_empty:
            return  # nothing held, and the file already says so
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(book.to_json(with_running))
        os.replace(tmp, self.path)
        self._written_empty = empty
