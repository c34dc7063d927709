"""What the dispatcher says about a queued workload and its queues (`GET /v1/{plural}/...`,
`GET /v1/queues`): its status, queue, position, wait reason, predictions and the admission
record, from the state the reconcile loop keeps. Pure: nothing here reads the API server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.core import QueueState
from alnair.scheduler.dispatcher.parsing import queue_label
from alnair.scheduler.dispatcher.progressing import remaining
from alnair.scheduler.dispatcher.writing import JobState


def explanation(
    kind: str, obj: Obj, state: JobState, finished: str | None, policy: str
) -> dict[str, Any]:
    """A queued workload as `GET /v1/{plural}/{namespace}/{name}` shows it."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if finished:
        status = finished.lower()
    elif state.invalid:
        status = "invalid"
    elif state.admitted_type:
        status = "admitted"
    else:
        status = "waiting"
    prediction = state.prediction
    return {
        "job": f"{namespace}/{name}",
        "kind": kind,
        "status": status,
        "queue": queue_label(obj["metadata"]) or (obj.get("spec") or {}).get("queue"),
        "cluster_queue": state.cluster_queue,
        "policy": policy,
        "position": state.position if status == "waiting" else None,
        "gpu_model": state.admitted_type,
        "reason": (
            {"kind": state.reason.kind, "message": state.reason.message}
            if state.reason and status == "waiting"
            else ({"kind": "invalid", "message": state.invalid} if state.invalid else None)
        ),
        "predicted_start_s": state.predicted_start_s,
        "predicted_finish_s": state.predicted_finish_s,
        "prediction": (
            {
                "runtime_s": {t: e.expected_s for t, e in prediction.runtime.items()},
                "runtime_upper_s": {t: e.upper_s for t, e in prediction.runtime.items()},
                "peak_memory_mib": prediction.peak_memory_mib,
                "low_confidence": prediction.low_confidence,
                "model_version": prediction.model_version,
            }
            if prediction
            else None
        ),
        "prediction_error": state.prediction_error,
        "progress": state.progress.describe() if state.progress else None,
        "plan": state.note if status == "admitted" else None,
        "sharing": (
            {m: (found.describe() if found else "alone") for m, found in state.sharing.items()}
            if state.sharing is not None
            else None
        ),
        "remaining_s": (
            {
                t: round(e.expected_s, 1)
                for t, e in remaining(prediction.runtime, state.progress.kept).items()
            }
            if prediction and state.progress and state.progress.reported
            else None
        ),
        "annotations": {
            k: v
            for k, v in (obj["metadata"].get("annotations") or {}).items()
            if k.startswith("alnair.io/")
        },
    }


def queue_descriptions(
    cluster_queues: Iterable[Obj], queues: Mapping[str, QueueState]
) -> list[dict[str, Any]]:
    """Every ClusterQueue, active or why not, with its status (`GET /v1/queues`)."""
    out = []
    for obj in cluster_queues:
        name = obj["metadata"]["name"]
        state = queues.get(name)
        out.append(
            {
                "name": name,
                "active": bool(state and state.spec),
                "problem": state.problem if state else None,
                "status": obj.get("status") or {},
            }
        )
    return out
