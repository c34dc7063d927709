"""Kueue's own `Workload` objects (`kueue.x-k8s.io/v1beta2`) queued as they are, for what creates
Workloads itself: Kueue's scheduler performance runner, and tools built on Kueue's API that
make a Workload per unit of work. Served with Kueue's queue objects (`queue_api: kueue`).

A Workload is its own admission record, as in Kueue:
- it is queued when it names a LocalQueue (`spec.queueName`) and no controller owns it (a
  Workload that Kueue's job integration made for a Job is that Job's, which the dispatcher
  queues itself);
- it asks what its `spec.podSets` ask, every set's `count` pods at once; its priority is
  `spec.priority`;
- it is admitted by writing `status.admission` (the ClusterQueue, and per pod set the flavor of
  each resource and what it uses) with the `QuotaReserved` and `Admitted` conditions, in one
  write to the status subresource;
- it waits with `QuotaReserved` False, reason `Pending`, and the wait reason as its message;
- it is preempted by the `Evicted` (reason `Preempted`) and `Preempted` conditions; it holds its
  quota until whatever runs it takes the reservation back (Kueue's job integrations do, and
  the performance runner does), as in Kueue;
- it has finished when its `Finished` condition is True.

What is read from an admitted Workload is its status, never annotations: its GPU model is the
model of the ResourceFlavor assigned to `nvidia.com/gpu` (`kueue_queues.flavor_model`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from alnair.common.annotations import object_model
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj, Resource
from alnair.scheduler.dispatcher import kueue_queues as kq
from alnair.scheduler.dispatcher.amounts import pod_amounts
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_AT,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    ANN_FLAVORS,
    ANN_STOPPING,
    GPU,
    NO_GPU,
    GpuRequest,
    PodSet,
    Workload,
    controller_ref,
    gpus_asked,
    pod_sets_request,
    restart_cost,
)
from alnair.scheduler.dispatcher.workload_kind import Lookup, StatusWrites, WorkloadKind

WORKLOADS = Resource(kq.GROUP, kq.VERSION, "workloads")
KIND = "Workload"
API_VERSION = f"{kq.GROUP}/{kq.VERSION}"
MANAGER = "alnair-dispatcher"
RECORD = frozenset({ANN_ADMITTED_TYPE, ANN_ADMITTED_AT, ANN_BORROWING, ANN_FLAVORS, ANN_STOPPING})
"""What the core reads of an admission, made here from the status (never the annotations)."""


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {
        str(c.get("type")): c
        for c in (obj.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    }


def _is_true(obj: Obj, kind: str) -> bool:
    return _conditions(obj).get(kind, {}).get("status") == "True"


def workload_queued(obj: Obj) -> bool:
    spec = obj.get("spec") or {}
    return bool(spec.get("queueName")) and controller_ref(obj) is None


def workload_key(namespace: str, name: str) -> str:
    return f"workload:{namespace}/{name}"


def workload_finished(obj: Obj) -> str | None:
    cond = _conditions(obj).get("Finished")
    if cond is None or cond.get("status") != "True":
        return None
    return str(cond.get("reason") or "Finished")


def pod_sets(obj: Obj) -> list[PodSet]:
    out = []
    for i, ps in enumerate((obj.get("spec") or {}).get("podSets") or []):
        if not isinstance(ps, dict):
            raise InvalidValueError(f"spec.podSets[{i}]", ps, "not an object")
        count = ps.get("count", 1)
        if not isinstance(count, int) or count < 0:
            raise InvalidValueError(f"spec.podSets[{i}].count", count, "not a count")
        out.append(PodSet(f"spec.podSets[{i}].template", ps.get("template") or {}, count))
    if not out:
        raise InvalidValueError("spec.podSets", [], "a Workload must have a pod set")
    return out


def _set_field(pod_set: PodSet, field: str) -> str:
    return f"{pod_set.where}.{field.removeprefix('spec.template.')}"


def _epoch(ts: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def admission_record(obj: Obj, lookup: Lookup) -> dict[str, str]:
    """The admission as the core reads it (`alnair.io/admitted-*`), from the status: empty when
    no quota is reserved."""
    status = obj.get("status") or {}
    admission = status.get("admission")
    if not _is_true(obj, "QuotaReserved") or not isinstance(admission, dict):
        return {}
    flavors: dict[str, str] = {}
    for psa in admission.get("podSetAssignments") or []:
        for resource, flavor in ((psa or {}).get("flavors") or {}).items():
            flavors.setdefault(str(resource), str(flavor))
    model = NO_GPU
    if GPU in flavors:
        rf = lookup(kq.RESOURCEFLAVORS, None, flavors[GPU])
        try:
            model = kq.flavor_model(rf) if rf is not None else flavors[GPU]
        except InvalidValueError:
            model = flavors[GPU]
    since = _epoch(_conditions(obj)["QuotaReserved"].get("lastTransitionTime"))
    record = {
        ANN_ADMITTED_TYPE: model,
        ANN_BORROWING: "false",
        ANN_FLAVORS: json.dumps({r: f for r, f in flavors.items() if r != GPU}, sort_keys=True),
    }
    if since is not None:
        record[ANN_ADMITTED_AT] = f"{since:.3f}"
    if _is_true(obj, "Evicted"):
        record[ANN_STOPPING] = "true"  # told to stop, its reservation not given back yet
    return record


def resolve_workload(obj: Obj, lookup: Lookup) -> Obj:
    """The Workload with its admission record made from its status (annotations of those names
    written by anyone else are dropped)."""
    meta = obj["metadata"]
    own = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in RECORD}
    return {**obj, "metadata": {**meta, "annotations": {**own, **admission_record(obj, lookup)}}}


def parse_kueue_workload(obj: Obj, default_restart_cost_s: float) -> Workload:
    meta = obj["metadata"]
    sets = pod_sets(obj)
    asks_gpus = any(
        gpus_asked({"metadata": meta, "spec": {"parallelism": s.count, "template": s.template}})
        for s in sets
        if s.count
    )
    if asks_gpus:
        request, model = pod_sets_request(
            meta, sets, KIND, none_field="spec.podSets", none_reason="",
            field_of=_set_field,
        )  # fmt: skip
    else:
        request, model = GpuRequest(gpus=0, pods=sum(s.count for s in sets), gpus_per_pod=0), None
    return Workload(
        key=workload_key(meta["namespace"], meta["name"]),
        obj=obj,
        local_queue=str((obj.get("spec") or {}).get("queueName") or ""),
        request=request,
        features=object_model(obj).present(),
        gpu_model=model,
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        resource=WORKLOADS,
        kind=KIND,
        api_version=API_VERSION,
        held=ANN_ADMITTED_TYPE not in (meta.get("annotations") or {}),
        pod_sets=tuple(sets),
    )


def priority(wl: Workload) -> int:
    value = (wl.obj.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


def inactive(wl: Workload) -> str | None:
    """Why a Workload is not to be admitted now (`spec.active: false`), or None."""
    if (wl.obj.get("spec") or {}).get("active") is False:
        return "the Workload is deactivated (spec.active: false)"
    return None


# --- status writes ----------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with(obj: Obj, changes: list[tuple[str, str, str, str]]) -> list[Obj]:
    """The Workload's conditions with `changes` (type, status, reason, message) made; a
    condition whose status stays keeps its transition time, as Kueue keeps it."""
    current = _conditions(obj)
    now = _now()
    gen = obj["metadata"].get("generation")
    for kind, status, reason, message in changes:
        old = current.get(kind)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        cond: Obj = {"type": kind, "status": status, "reason": reason,
                     "message": message[:32768], "lastTransitionTime": since or now}  # fmt: skip
        if gen is not None:
            cond["observedGeneration"] = gen
        current[kind] = cond
    return list(current.values())


def _quantity(amount: Decimal) -> str:
    return format(amount.normalize(), "f")


def admitted_status(wl: Workload, queue: str, flavors: Mapping[str, str], message: str) -> Obj:
    """`status` of the merge patch admitting the Workload in `queue`, each resource it asks
    counted in `flavors` (resource -> ResourceFlavor)."""
    assignments = []
    for i, pod_set in enumerate(wl.pod_sets):
        raw = ((wl.obj.get("spec") or {}).get("podSets") or [])[i]
        usage = {
            name.removeprefix("requests."): amount * pod_set.count
            for name, amount in pod_amounts(pod_set.template, pod_set.where).items()
            if name.startswith("requests.")
        }
        assignments.append({
            "name": raw.get("name") or "main",
            "count": pod_set.count,
            "flavors": {r: flavors[r] for r in sorted(usage) if r in flavors},
            "resourceUsage": {r: _quantity(a) for r, a in sorted(usage.items())},
        })  # fmt: skip
    changes = [
        ("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {queue}"),
        ("Admitted", "True", "Admitted", message),
    ]
    current = _conditions(wl.obj)
    changes += [
        (kind, "False", "QuotaReserved", f"Previously: {current[kind].get('message') or ''}")
        for kind in ("Evicted", "Preempted")
        if current.get(kind, {}).get("status") == "True"
    ]
    return {
        "admission": {"clusterQueue": queue, "podSetAssignments": assignments},
        "conditions": _with(wl.obj, changes),
    }


def evicted_status(wl: Workload, cause: str, message: str) -> Obj:
    """`status` of the merge patch that takes the Workload's admission back for `cause`:
    Evicted (and, when preempted, Preempted), its reservation kept until whatever runs it
    stops it, as in Kueue."""
    changes = [("Evicted", "True", cause, message)]
    if cause == "Preempted":
        changes.append(("Preempted", "True", "InClusterQueue", message))
    return {"conditions": _with(wl.obj, changes)}


def pending_status(wl: Workload, message: str) -> Obj | None:
    """`status` of the merge patch that says why the Workload waits (None: said already)."""
    old = _conditions(wl.obj).get("QuotaReserved")
    if old is not None and old.get("status") == "False" and old.get("message") == message:
        return None
    return {"conditions": _with(wl.obj, [("QuotaReserved", "False", "Pending", message)])}


WORKLOAD = WorkloadKind(
    kind=KIND,
    api_version=API_VERSION,
    resource=WORKLOADS,
    label_selectors=(None,),  # a Workload names its queue in spec.queueName
    queued=workload_queued,
    key=workload_key,
    parse=parse_kueue_workload,
    finished=workload_finished,
    writes_conditions=False,
    hold=lambda _obj: [],  # a Workload waits by having no reservation: nothing to hold
    release=lambda _wl, _gpu_type: {},
    reclaim="suspend",
    ready=lambda _wl: True,  # its pods, if any, are its job's (Kueue's PodsReady is the job's)
    references=(kq.RESOURCEFLAVORS,),
    resolve=resolve_workload,
    optional=True,
    status_writes=StatusWrites(
        admitted=admitted_status, evicted=evicted_status, pending=pending_status
    ),
    kueue_only=True,
)
