"""What the multi-cluster hub puts on worker clusters: the copy (mirror) of a hub workload,
made by its kind's adapter, and what the hub reads back from mirrors (started, counts) and
from hub workloads (the artifacts a worker may already hold). `hub.py` decides; this module
only shapes objects.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.kinds import JOB, KINDS
from alnair.scheduler.dispatcher.parsing import (
    MANAGED_BY_HUB,
    QUEUE_LABELS,
    GpuRequest,
    Workload,
    queue_label,
)
from alnair.scheduler.dispatcher.worker_clusters import ANN_ORIGIN, LABEL_ORIGIN, Worker
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.multicluster.scoring import Artifact

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


def _images(node: Any) -> Iterator[str]:
    """Every container image a spec names, wherever its kind keeps pod templates."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "containers" and isinstance(value, list):
                yield from (
                    str(c["image"]) for c in value if isinstance(c, dict) and c.get("image")
                )
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def job_artifacts(job: Obj) -> list[Artifact]:
    """The image(s), model and dataset a hub workload names, with their sizes (annotations, MB).

    An image is its reference (every pod template's `containers[].image`, sized by
    `alnair.io/image-size-mb` in all); the model `alnair.io/model-uri` + `alnair.io/model-size-mb`;
    the dataset `alnair.io/dataset` + `alnair.io/data-size-mb` (a size without a name is a
    dataset only this job uses, so it is never found cached)."""
    meta = job["metadata"]
    annotations = meta.get("annotations") or {}
    images = sorted(set(_images(job.get("spec"))))
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


def delegated(obj: Obj) -> bool:
    """A workload the hub places: it names the hub in `spec.managedBy`, and a queue."""
    return (obj.get("spec") or {}).get("managedBy") == MANAGED_BY and bool(
        queue_label(obj.get("metadata") or {})
    )


def _as_workload(kind: WorkloadKind, obj: Obj) -> Workload:
    """A mirror as its kind's `ready` reads it (it asks nothing of the hub's queue)."""
    return Workload(key=kind.key_of(obj), obj=obj, local_queue="",
                    request=GpuRequest(gpus=0, pods=1, gpus_per_pod=0), kind=kind.kind)  # fmt: skip


def started(mirror: Obj, kind: WorkloadKind = JOB) -> bool:
    """Whether a mirror's workload started on its worker: a Job with a pod ready or done; any
    other kind once its adapter says it is ready; any that finished."""
    if kind.finished(mirror) is not None:
        return True
    if kind.kind == JOB.kind:
        status = mirror.get("status") or {}
        return bool(status.get("ready") or status.get("succeeded") or status.get("failed"))
    return kind.ready(_as_workload(kind, mirror))


def _merged(base: Obj, patch: Obj) -> Obj:
    """`patch` applied to `base` as a JSON merge patch (RFC 7386)."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def mirror_of(hub_job: Obj, gpu_type: str, hub_cluster: str, wl: Workload | None = None) -> Obj:
    """The copy created on the worker: the hub workload's spec (without `managedBy`, and
    portable for its kind), released by its kind's adapter onto `gpu_type`. `wl` is the
    workload as parsed (its adapter, and what a kind's release reads); a Job's if None."""
    kind = KINDS[wl.kind] if wl is not None else JOB
    meta = hub_job["metadata"]
    spec = copy.deepcopy(hub_job["spec"])
    spec.pop("managedBy", None)
    if kind.export is not None:
        spec = kind.export(spec)
    parsed = wl if wl is not None else _as_workload(kind, hub_job)
    spec = _merged(spec, kind.release(parsed, gpu_type))
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if "/" not in k or k.startswith("alnair.io/")
    }
    for key in (ANN_PLACED_CLUSTER, ANN_PLACED_TYPE, ANN_PLACED_AT, ANN_ABANDONED):
        annotations.pop(key, None)
    annotations[ANN_ORIGIN] = f"{hub_cluster}/{meta['namespace']}/{meta['name']}"
    user_labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in QUEUE_LABELS}
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**user_labels, LABEL_ORIGIN: meta["uid"]},
            "annotations": annotations,
        },
        "spec": spec,
    }


def mirror_counts(worker: Worker) -> dict[str, int]:
    """A worker's mirrors (every kind) by state: queued, running, finished."""
    counts = {"queued": 0, "running": 0, "finished": 0}
    for kind_name, mirror in worker.mirrored():
        kind = KINDS[kind_name]
        if kind.finished(mirror) is not None:
            counts["finished"] += 1
        elif started(mirror, kind):
            counts["running"] += 1
        else:
            counts["queued"] += 1
    return counts


CONDITION_LOST = "alnair.io/LostContact"
_COPIED_STATUS = ("startTime", "active", "ready", "succeeded", "failed")
_TERMINAL = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")


def condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
    """A status condition as the hub writes it on its objects (both times now)."""
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": ts,
        "lastProbeTime": ts,
    }


def job_status(wl: Workload, status: Obj, finished: str | None, cluster: str) -> Obj | None:
    """What a mirrored Job's status puts on the hub Job: the counts and times users read,
    not the worker controller's own bookkeeping (uncounted pods), which the API server
    refuses on a finished Job; its conditions beside the hub's own. None while the worker
    is finishing it."""
    terminal = any(
        c.get("type") in _TERMINAL and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if terminal and finished is None:
        return None
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
    copied["conditions"] = [
        *(status.get("conditions") or []),
        *ours,
        condition(CONDITION_LOST, "False", "Reachable", f"cluster {cluster} answers"),
    ]
    return copied
