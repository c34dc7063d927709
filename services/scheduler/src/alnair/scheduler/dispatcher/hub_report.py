"""What the hub reports: a workload it queues and its worker clusters (`GET /v1/{plural}/...`,
`GET /v1/clusters`), and its gauges, from the state its reconcile loop keeps. Nothing here
reads an API server.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.core import WorkloadState
from alnair.scheduler.dispatcher.metrics import HubMetrics
from alnair.scheduler.dispatcher.mirrors import (
    ANN_ABANDONED,
    ANN_PLACED_CLUSTER,
    ANN_PLACED_TYPE,
    mirror_counts,
)
from alnair.scheduler.dispatcher.worker_clusters import Worker
from alnair.scheduler.multicluster.scoring import ClusterOption, WorkerView


@dataclass(slots=True)
class HubJobState(WorkloadState):
    """What the hub knows about one workload, beyond what the core keeps."""

    options: list[ClusterOption] = field(default_factory=list)
    mirrored_rv: str | None = None
    lost_evented: str | None = None


def hub_explanation(
    kind: str, obj: Obj, state: HubJobState, finished: str | None
) -> dict[str, Any]:
    """A hub workload as `GET /v1/{plural}/{namespace}/{name}` shows it: where it was placed
    (or why it waits), the clusters it was weighed on, the ones it was taken back from."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    annotations = meta.get("annotations") or {}
    cluster = annotations.get(ANN_PLACED_CLUSTER)
    status = finished.lower() if finished else ("placed" if cluster else "waiting")
    if cluster and state.lost_evented:
        status = "lost-contact"
    return {
        "job": f"{namespace}/{name}",
        "kind": kind,
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


def cluster_descriptions(
    workers: Mapping[str, Worker], views: Mapping[str, WorkerView]
) -> list[dict[str, Any]]:
    """Every worker as `GET /v1/clusters` shows it: whether it answers, its GPUs and jobs."""
    out: list[dict[str, Any]] = []
    for name, worker in sorted(workers.items()):
        view = views.get(name)
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
                "jobs": mirror_counts(worker),
                "kinds": sorted(k for k in worker.mirrors if worker.serves(k)),
            }
        )
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def report_metrics(
    metrics: HubMetrics,
    workers: Mapping[str, Worker],
    invalid: int,
    views: list[WorkerView],
    lost_running: int,
) -> None:
    """The hub's gauges after a reconcile: each worker up or not, its GPUs and mirrored jobs,
    workers with a problem by kind, running jobs out of contact."""
    by_name = {v.name: v for v in views}
    problems: Counter[str] = Counter({"invalid": invalid})
    for name, worker in workers.items():
        metrics.worker_up.labels(name).set(1 if worker.reachable else 0)
        problem = worker.problem
        if problem:
            problems[problem.split(":", 1)[0]] += 1
        view = by_name.get(name)
        if view is not None:
            metrics.worker_gpus.labels(name, "total").set(sum(p.total for p in view.pools.values()))
            metrics.worker_gpus.labels(name, "free").set(sum(p.free for p in view.pools.values()))
        counts = mirror_counts(worker)
        metrics.worker_jobs.labels(name, "queued").set(counts["queued"])
        metrics.worker_jobs.labels(name, "running").set(counts["running"])
    for kind in ("invalid", "unreachable", "unauthorized"):
        metrics.worker_problems.labels(kind).set(problems[kind])
    metrics.lost_contact.set(lost_running)
