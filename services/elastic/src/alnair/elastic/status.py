"""What an ElasticJob's status says, from its workers: the phase, the replica counts
(guaranteed and borrowed), the hosts a rendezvous reads, the conditions (`Running`,
`Resizing`, `Shrunk`, `WaitingForMin`, `Failed`) with their transition times kept while their
value holds, the last resize. Pure; the controller writes what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from alnair.common.kube import Obj
from alnair.common.resources import POD_INDEX_LABEL
from alnair.elastic import manifests as m
from alnair.elastic.sizing import holds_gpus
from alnair.elastic.spec import ElasticSpec


@dataclass
class Resize:
    time: datetime
    previous: int
    replicas: int
    reason: str
    event_id: str = ""

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "time": timestamp(self.time),
            "from": self.previous,
            "to": self.replicas,
            "reason": self.reason,
        }
        if self.event_id:
            out["eventId"] = self.event_id
        return out


def timestamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def ordinal(pod: Obj) -> int:
    """The StatefulSet ordinal of a worker (its pod-index label, else its name's suffix)."""
    meta = pod["metadata"]
    raw = (meta.get("labels") or {}).get(POD_INDEX_LABEL)
    if raw is None:
        raw = meta["name"].rpartition("-")[2]
    try:
        return int(raw)
    except ValueError:
        return -1


def is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return pod_phase(pod) == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def terminating(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


@dataclass(frozen=True)
class WorkerView:
    """The workers of the current target: running ones, ready ones (in ordinal order) and the
    `host:slots` each ready one offers a rendezvous."""

    mine: list[Obj]
    running: list[Obj]
    ready: list[Obj]
    hosts: list[str]
    total: int

    @classmethod
    def of(cls, spec: ElasticSpec, workers: list[Obj], target: int) -> WorkerView:
        mine = [p for p in workers if ordinal(p) < target and not terminating(p)]
        running = [p for p in mine if holds_gpus(p) and pod_phase(p) == "Running"]
        ready = sorted((p for p in mine if is_ready(p)), key=ordinal)
        hosts = [f"{m.host_of(spec, p['metadata']['name'])}:{spec.gpus_per_worker}" for p in ready]
        return cls(mine, running, ready, hosts, len(workers))


def job_status(
    spec: ElasticSpec,
    old: dict[str, Any],
    view: WorkerView,
    *,
    target: int,
    restarts: int,
    counted: list[str],
    failed: bool,
    reason: str,
    last_resize: Resize | None,
    ceiling: int | None,
) -> dict[str, Any]:
    """The job's `status` now (`old` is the one it has, for the conditions' times)."""
    n = len(view.running)
    lo = spec.min_replicas
    if failed:
        phase = "Failed"
    elif spec.succeeded:
        phase = "Succeeded"
    elif spec.suspend:
        phase = "Suspended"
    elif n >= lo:
        phase = "Running"
    elif n == 0 and target <= lo:
        phase = "WaitingForMin"
    else:
        phase = "Pending"
    ready = view.ready
    resizing = len(ready) != target or view.total != len(view.mine) or len(view.mine) != target
    shrunk = last_resize is not None and last_resize.replicas < last_resize.previous
    shrunk = shrunk and target < spec.max_replicas
    before = {c.get("type"): c for c in old.get("conditions") or []}
    conditions = [
        condition(
            "Running",
            n >= lo and not failed,
            "Running" if n >= lo else "BelowMinimum",
            f"{n} of {target} worker(s) running (minimum {lo})",
            before,
        ),
        condition(
            "Resizing",
            resizing and not failed,
            "Resizing" if resizing else "Stable",
            f"{len(ready)} ready, target {target}",
            before,
        ),
        condition(
            "Shrunk",
            shrunk,
            "Shrunk" if shrunk else "NotShrunk",
            last_resize.reason if shrunk and last_resize else "",
            before,
        ),
        condition(
            "WaitingForMin",
            phase == "WaitingForMin",
            "WaitingForMin" if phase == "WaitingForMin" else "MinimumMet",
            reason if phase == "WaitingForMin" else "",
            before,
        ),
    ]
    if failed:
        conditions.append(condition("Failed", True, "MaxRestartsExceeded", reason, before))
    status: dict[str, Any] = {
        "phase": phase,
        "currentReplicas": n,
        "targetReplicas": target,
        "readyReplicas": len(ready),
        "guaranteedReplicas": min(n, lo),
        "borrowedReplicas": max(0, n - lo),
        "restarts": restarts,
        "countedFailures": counted,
        "hosts": view.hosts,
        "conditions": conditions,
        "message": reason,
        "observedGeneration": spec.generation,
        "ceiling": ceiling,
    }
    if last_resize is not None:
        status["lastResize"] = last_resize.as_status()
    return status


def count_failures(workers: list[Obj], status: dict[str, Any]) -> tuple[int, list[str]]:
    """Restarts so far: each failed worker pod counted once (by uid; the last 64 kept)."""
    counted = list(status.get("countedFailures") or [])
    restarts = int(status.get("restarts") or 0)
    for pod in workers:
        uid = pod["metadata"].get("uid", "")
        if (pod.get("status") or {}).get("phase") == "Failed" and uid not in counted:
            counted.append(uid)
            restarts += 1
    return restarts, counted[-64:]


def condition(
    type_: str, on: bool, reason: str, message: str, before: dict[str, Any] | None
) -> dict[str, Any]:
    value = "True" if on else "False"
    prev = (before or {}).get(type_) or {}
    since = prev.get("lastTransitionTime") if prev.get("status") == value else None
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or timestamp(datetime.now(UTC)),
    }
