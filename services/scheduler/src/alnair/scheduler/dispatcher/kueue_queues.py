"""Kueue's own queue objects (`kueue.x-k8s.io/v1beta2`) as the dispatcher's queues, for a team
that replaces Kueue's controller with Alnair's and keeps its ClusterQueues, LocalQueues,
ResourceFlavors, Cohorts and WorkloadPriorityClasses (`queue_api: kueue`).

What is read, and how (docs/from-kueue.md has the whole table):
- A ClusterQueue's `resourceGroups`: one covering `nvidia.com/gpu` has a flavor per GPU model
  (a ResourceFlavor whose `spec.nodeLabels` names it under `alnair.io/gpu-model`), and its
  `nominalQuota`, `borrowingLimit` and `lendingLimit` are that model's quota; the others
  (CPU, memory, any resource) are `queueing/resources.py`'s groups, their flavors plain ones.
- `cohortName` (a cohort exists by being named, as in Kueue; a Cohort object is optional),
  `fairSharing.weight`, `namespaceSelector` (null selects no namespace, as in Kueue),
  `preemption` (the rules `queueing.permits` applies to the policy's preemptions) and
  `stopPolicy: Hold` (admits nothing new).
- A LocalQueue's `clusterQueue` and `stopPolicy: Hold`; a WorkloadPriorityClass's `value`,
  named by a workload's `kueue.x-k8s.io/priority-class` label.

What Alnair cannot honour is refused, naming the field: the queue admits nothing (its Active
condition and a Warning Event say why) rather than admit on a guess. That includes flavors
that add node labels, taints or tolerations (other than a GPU model's), hierarchical cohorts,
admission checks, StrictFIFO and HoldAndDrain. Flavor preferences (`flavorFungibility`) change
which flavor, not how much quota: they are read, not applied, and an Event says so.

Only v1beta2 is read. Kueue converts v1beta1 objects with its own webhook, which is not
running when Kueue is not; the API server then converts by changing `apiVersion` only, and
fields v1beta2 renamed (a ClusterQueue's `cohort`, now `cohortName`) are dropped on the way.
An object last written as v1beta1 (its managedFields say so) is therefore refused, naming the
version, instead of being read without its cohort.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj, Resource
from alnair.scheduler.cluster.selectors import LabelSelector
from alnair.scheduler.dispatcher.parsing import GPU, fair_share_weight, flavor_quota
from alnair.scheduler.queueing.model import ClusterQueueSpec, FlavorQuota, PreemptionRules
from alnair.scheduler.queueing.resources import (
    FlavorQuotas,
    QueueResources,
    ResourceGroup,
    ResourceLedger,
    ResourceQuota,
)

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
CLUSTERQUEUES = Resource(GROUP, VERSION, "clusterqueues", namespaced=False)
LOCALQUEUES = Resource(GROUP, VERSION, "localqueues")
COHORTS = Resource(GROUP, VERSION, "cohorts", namespaced=False)
RESOURCEFLAVORS = Resource(GROUP, VERSION, "resourceflavors", namespaced=False)
WORKLOADPRIORITYCLASSES = Resource(GROUP, VERSION, "workloadpriorityclasses", namespaced=False)
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"

_WITHIN = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
_RECLAIM = ("Never", "LowerPriority", "Any")
_BORROW = ("Never", "LowerPriority")
_DEFAULTS = {
    # a field Kueue's CRD defaults: its default is what Alnair does, another value is refused
    "queueingStrategy": "BestEffortFIFO",
}
_NOT_APPLIED: dict[str, str | None] = {
    # preferences whose other values change which flavor, never how much quota, is used:
    # read, not applied, and said so in an Event
    "flavorFungibility.whenCanBorrow": "MayStopSearch",
    "flavorFungibility.whenCanPreempt": "TryNextFlavor",
    "flavorFungibility.preference": None,
}
_UNSUPPORTED = ("admissionChecksStrategy", "admissionScope", "concurrentAdmissionPolicy")


@dataclass(frozen=True, slots=True)
class KueueQueue:
    """A Kueue ClusterQueue as the policies see it, with what only the dispatcher needs."""

    spec: ClusterQueueSpec
    flavors: Mapping[str, str] = field(default_factory=dict)
    """GPU model -> the ResourceFlavor's name (its status is written per flavor)."""
    namespaces: LabelSelector = field(default_factory=LabelSelector)
    hold: bool = False
    """`stopPolicy: Hold`: admits nothing new; what runs keeps running."""
    resources: QueueResources = field(default_factory=lambda: QueueResources(()))
    """Its quota over other resources than GPUs (CPU, memory, ...): `queueing/resources.py`."""
    notes: tuple[str, ...] = ()
    """Fields read but not applied (preferences that change no quota), for an Event."""


def written_as_v1beta1(obj: Obj) -> bool:
    """Whether the object was last written through v1beta1 (see the module's note)."""
    fields = obj["metadata"].get("managedFields") or []
    return any(f.get("apiVersion") == f"{GROUP}/v1beta1" for f in fields)


def _v1beta2_only(obj: Obj, kind: str) -> None:
    if written_as_v1beta1(obj):
        raise InvalidValueError(
            "apiVersion",
            f"{GROUP}/v1beta1",
            f"{kind} {obj['metadata']['name']} was written as v1beta1; without Kueue's "
            "conversion webhook its renamed fields are lost: write it as v1beta2",
        )


def _selector(raw: Any, where: str) -> LabelSelector:
    if raw is None:
        return LabelSelector(nothing=True)
    selector = LabelSelector.parse(raw)
    bad = selector.invalid_operator()
    if bad is not None:
        raise InvalidValueError(f"{where}.matchExpressions", bad, "not a selector operator")
    return selector


def _preemption(spec: Obj) -> PreemptionRules:
    raw = spec.get("preemption") or {}
    within = raw.get("withinClusterQueue", "Never")
    reclaim = raw.get("reclaimWithinCohort", "Never")
    borrow = raw.get("borrowWithinCohort") or {}
    policy = borrow.get("policy", "Never")
    for where, value, allowed in (
        ("spec.preemption.withinClusterQueue", within, _WITHIN),
        ("spec.preemption.reclaimWithinCohort", reclaim, _RECLAIM),
        ("spec.preemption.borrowWithinCohort.policy", policy, _BORROW),
    ):
        if value not in allowed:
            raise InvalidValueError(where, value, f"one of {', '.join(allowed)}")
    if borrow.get("maxPriorityThreshold") is not None:
        raise InvalidValueError(
            "spec.preemption.borrowWithinCohort.maxPriorityThreshold",
            borrow["maxPriorityThreshold"],
            "not supported: Alnair never preempts a job within its queue's quota to borrow",
        )
    return PreemptionRules(within_queue=within, reclaim=reclaim, borrow_within_cohort=policy)


def plain_flavor(flavor: Obj) -> str:
    """A ResourceFlavor for resources other than GPUs: one that adds nothing to the pods it
    admits (node labels, taints, tolerations and topologies are not applied here, so a flavor
    that names any is refused rather than admit pods that would land anywhere)."""
    name = flavor["metadata"]["name"]
    _v1beta2_only(flavor, "ResourceFlavor")
    spec = flavor.get("spec") or {}
    for key in ("nodeLabels", "nodeTaints", "tolerations", "topologyName"):
        value = spec.get(key)
        if value:
            where = f"ResourceFlavor {name} spec.{key}"
            if key == "nodeLabels":
                where += f".{sorted(value)[0]}"
            raise InvalidValueError(
                where, value, "not supported: Alnair does not add a flavor's nodes to its pods"
            )
    return str(name)


def flavor_problem(flavor: Obj) -> None:
    """InvalidValueError when the flavor is neither a GPU model (`flavor_model`) nor a plain
    flavor (`plain_flavor`)."""
    labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
    if res.LABEL_GPU_MODEL in labels:
        flavor_model(flavor)
    else:
        plain_flavor(flavor)


def flavor_model(flavor: Obj) -> str:
    """The GPU model a ResourceFlavor stands for; anything else it would add to the pods it
    admits (other node labels, taints, tolerations, a topology) is refused, naming it."""
    name = flavor["metadata"]["name"]
    _v1beta2_only(flavor, "ResourceFlavor")
    spec = flavor.get("spec") or {}
    labels = dict(spec.get("nodeLabels") or {})
    model = labels.pop(res.LABEL_GPU_MODEL, None)
    if not model:
        raise InvalidValueError(
            f"ResourceFlavor {name} spec.nodeLabels",
            spec.get("nodeLabels"),
            f"names no {res.LABEL_GPU_MODEL}: Alnair's GPU flavors are GPU models",
        )
    for key in sorted(labels):
        raise InvalidValueError(
            f"ResourceFlavor {name} spec.nodeLabels.{key}",
            labels[key],
            f"not supported: a GPU flavor selects nodes by {res.LABEL_GPU_MODEL} alone",
        )
    for key in ("nodeTaints", "tolerations", "topologyName"):
        if spec.get(key):
            raise InvalidValueError(f"ResourceFlavor {name} spec.{key}", spec[key], "not supported")
    return str(model)


def _check_cohort(name: str, cohorts: Mapping[str, Obj]) -> None:
    obj = cohorts.get(name)
    if obj is None:
        return  # named only by its queues, as Kueue allows
    cohort_check(obj)


def cohort_check(obj: Obj) -> None:
    """A Cohort Alnair can honour (flat, with no quota of its own), or InvalidValueError."""
    name = obj["metadata"]["name"]
    _v1beta2_only(obj, "Cohort")
    spec = obj.get("spec") or {}
    for key in ("parentName", "resourceGroups"):
        if spec.get(key):
            raise InvalidValueError(
                f"Cohort {name} spec.{key}", spec[key], "not supported: cohorts are flat here"
            )
    weight = (spec.get("fairSharing") or {}).get("weight")
    if weight is not None and str(weight) != "1":
        raise InvalidValueError(
            f"Cohort {name} spec.fairSharing.weight", weight, "not supported: cohorts are flat"
        )


def parse_kueue_cluster_queue(
    obj: Obj, cohorts: Mapping[str, Obj], flavors: Mapping[str, Obj]
) -> KueueQueue:
    """A Kueue ClusterQueue as Alnair honours it; InvalidValueError names the first field it
    cannot (the queue then admits nothing)."""
    name = obj["metadata"]["name"]
    _v1beta2_only(obj, "ClusterQueue")
    spec = obj.get("spec") or {}
    cohort = spec.get("cohortName") or None
    if cohort is not None:
        _check_cohort(cohort, cohorts)
    weight = fair_share_weight(spec, "spec.fairSharing.weight")
    quota: dict[str, FlavorQuota] = {}
    names: dict[str, str] = {}
    groups: list[ResourceGroup] = []
    for g, group in enumerate(spec.get("resourceGroups") or []):
        covered = list(group.get("coveredResources") or [])
        if covered != [GPU]:
            if GPU in covered:
                raise InvalidValueError(
                    f"spec.resourceGroups[{g}].coveredResources",
                    covered,
                    f"not supported: {GPU} in a group of its own (its flavors are GPU models)",
                )
            groups.append(_plain_group(group, f"spec.resourceGroups[{g}]", cohort, flavors))
            continue
        for f, entry in enumerate(group.get("flavors") or []):
            where = f"spec.resourceGroups[{g}].flavors[{f}]"
            flavor_name = entry.get("name")
            flavor = flavors.get(flavor_name or "")
            if flavor is None:
                raise InvalidValueError(
                    f"{where}.name", flavor_name, "no ResourceFlavor of that name exists"
                )
            model = flavor_model(flavor)
            if model in quota:
                raise InvalidValueError(
                    f"{where}.name", flavor_name, f"a second flavor of GPU model {model}"
                )
            for r, resource in enumerate(entry.get("resources") or []):
                rw = f"{where}.resources[{r}]"
                if resource.get("name") != GPU:
                    raise InvalidValueError(f"{rw}.name", resource.get("name"), f"only {GPU}")
                quota[model] = flavor_quota(resource, rw, cohort, "spec.cohortName")
                names[model] = str(flavor_name)
    # What it asks beyond quota, once the quota itself is readable.
    for key in _UNSUPPORTED:
        if spec.get(key):
            raise InvalidValueError(f"spec.{key}", spec[key], "not supported")
    for path, default in _DEFAULTS.items():
        top, _, sub = path.partition(".")
        value = (spec.get(top) or {}).get(sub) if sub else spec.get(top)
        if value is not None and value != default:
            raise InvalidValueError(
                f"spec.{path}", value, f"not supported (Alnair's policy orders and picks the "
                f"GPU model by predicted completion; only {default} is accepted)"
            )  # fmt: skip
    notes = []
    for preference, usual in _NOT_APPLIED.items():
        top, _, sub = preference.partition(".")
        value = (spec.get(top) or {}).get(sub)
        if value is not None and value != usual:
            notes.append(
                f"spec.{preference}={value!r} is not applied: the GPU model is chosen by predicted "
                "completion, other flavors in order (the first with room; no preemption)"
            )
    stop = spec.get("stopPolicy") or "None"
    if stop not in ("None", "Hold"):
        raise InvalidValueError(
            "spec.stopPolicy", stop, "not supported: admitted workloads are not drained"
        )
    return KueueQueue(
        spec=ClusterQueueSpec(
            name=name, quota=quota, cohort=cohort, weight=weight, preemption=_preemption(spec)
        ),
        flavors=names,
        namespaces=_selector(spec.get("namespaceSelector"), "spec.namespaceSelector"),
        hold=stop == "Hold",
        resources=QueueResources(tuple(groups), cohort),
        notes=tuple(notes),
    )


def _amount(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidValueError(where, value, "not a Kubernetes quantity")
    amount = res.parse_quantity(value, where)
    if amount < 0:
        raise InvalidValueError(where, value, "must be >= 0")
    return amount


def _plain_group(
    group: Obj, where: str, cohort: str | None, flavors: Mapping[str, Obj]
) -> ResourceGroup:
    """A resource group over resources other than GPUs, with its flavors' quotas."""
    covered = tuple(str(r) for r in group.get("coveredResources") or [])
    out: list[FlavorQuotas] = []
    for f, entry in enumerate(group.get("flavors") or []):
        fw = f"{where}.flavors[{f}]"
        flavor = flavors.get(entry.get("name") or "")
        if flavor is None:
            raise InvalidValueError(
                f"{fw}.name", entry.get("name"), "no ResourceFlavor of that name exists"
            )
        plain_flavor(flavor)
        quotas: dict[str, ResourceQuota] = {}
        for r, resource in enumerate(entry.get("resources") or []):
            rw = f"{fw}.resources[{r}]"
            name = resource.get("name")
            if name not in covered:
                raise InvalidValueError(f"{rw}.name", name, "not in the group's coveredResources")
            borrow, lend = resource.get("borrowingLimit"), resource.get("lendingLimit")
            if cohort is None and (borrow is not None or lend is not None):
                raise InvalidValueError(
                    f"{rw}.borrowingLimit", borrow, "borrowing and lending need spec.cohortName"
                )
            quotas[str(name)] = ResourceQuota(
                nominal=_amount(resource.get("nominalQuota"), f"{rw}.nominalQuota"),
                borrowing_limit=None if borrow is None else _amount(borrow, f"{rw}.borrowingLimit"),
                lending_limit=None if lend is None else _amount(lend, f"{rw}.lendingLimit"),
            )
        out.append(FlavorQuotas(str(entry["name"]), quotas))
    return ResourceGroup(covered, tuple(out))


def local_queue_problem(lq: Obj) -> str | None:
    """Why a Kueue LocalQueue admits nothing (held, or a field Alnair does not honour)."""
    meta = lq["metadata"]
    where = f"LocalQueue {meta.get('namespace')}/{meta['name']}"
    if written_as_v1beta1(lq):
        return f"{where} was written as v1beta1: write it as v1beta2"
    spec = lq.get("spec") or {}
    stop = spec.get("stopPolicy") or "None"
    if stop == "Hold":
        return f"{where} is held (spec.stopPolicy: Hold)"
    if stop != "None":
        return f"{where}: spec.stopPolicy={stop!r} is not supported (nothing is drained)"
    if spec.get("fairSharing"):
        return f"{where}: spec.fairSharing is not supported"
    return None


def priority_of(labels: Mapping[str, str], classes: Mapping[str, Obj]) -> int | None:
    """The value of the WorkloadPriorityClass a workload names (`kueue.x-k8s.io/priority-class`);
    None when it names none. KeyError when it names one that does not exist."""
    name = labels.get(LABEL_PRIORITY_CLASS)
    if not name:
        return None
    wpc = classes[name]
    return int(wpc.get("value") or 0)


def _condition(active: bool, message: str, current: Obj | None) -> Obj:
    status = "True" if active else "False"
    reason = "Ready" if active else "InvalidSpec"
    if current is not None and current.get("status") == status and current.get("reason") == reason:
        since = current.get("lastTransitionTime")
    else:
        since = None
    return {
        "type": "Active",
        "status": status,
        "reason": reason,
        "message": message or ("Can admit new workloads" if active else ""),
        "lastTransitionTime": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _quantity(amount: Decimal) -> str:
    return format(amount.normalize(), "f")


def kueue_status(
    alnair: Obj,
    queue: KueueQueue | None,
    problem: str | None,
    current: Obj,
    ledger: ResourceLedger | None = None,
) -> dict[str, Any]:
    """A Kueue ClusterQueue's `status` from the counts `queue_status` makes (Alnair's shape)
    and, for its quota over other resources, the dispatcher's `ledger`: usage per flavor by
    its ResourceFlavor's name, borrowed being usage above nominal."""
    names = dict(queue.flavors) if queue is not None else {}
    quota = queue.spec.quota if queue is not None else {}
    usage = []
    for entry in alnair["flavorsUsage"]:
        model, total = entry["name"], int(entry["total"])
        nominal = quota[model].nominal if model in quota else total
        usage.append({
            "name": names.get(model, model),
            "resources": [{"name": GPU, "total": total, "borrowed": max(0, total - nominal)}],
        })  # fmt: skip
    if queue is not None and ledger is not None:
        name, zero = queue.spec.name, Decimal(0)
        for group in queue.resources.groups:
            for flavor in group.flavors:
                used = [
                    (r, ledger.usage(name, flavor.name, r), q.nominal)
                    for r, q in sorted(flavor.quotas.items())
                ]
                if not any(u for _, u, _ in used):
                    continue
                usage.append({"name": flavor.name, "resources": [
                    {"name": r, "total": _quantity(u), "borrowed": _quantity(max(u - n, zero))}
                    for r, u, n in used
                ]})  # fmt: skip
    old = next((c for c in current.get("conditions") or [] if c.get("type") == "Active"), None)
    active = queue is not None and not queue.hold
    message = problem or ("" if queue is None or not queue.hold else "held (spec.stopPolicy)")
    return {
        "pendingWorkloads": alnair["pendingWorkloads"],
        "reservingWorkloads": alnair["admittedWorkloads"],
        "admittedWorkloads": alnair["admittedWorkloads"],
        "flavorsReservation": usage,
        "flavorsUsage": usage,
        "conditions": [_condition(active, message, old)],
    }


def object_problems(
    flavors: Mapping[str, Obj], cohorts: Mapping[str, Obj], local_queues: Mapping[str, Obj]
) -> dict[str, tuple[Obj, str, str]]:
    """What Alnair cannot honour in each ResourceFlavor, Cohort and LocalQueue, whether or not
    a ClusterQueue uses it yet: by uid, (object, kind, problem). Each gets an Event."""
    out: dict[str, tuple[Obj, str, str]] = {}
    for kind, objs, check in (
        ("ResourceFlavor", flavors, flavor_problem),
        ("Cohort", cohorts, cohort_check),
    ):
        for obj in objs.values():
            try:
                check(obj)
            except InvalidValueError as exc:
                out[obj["metadata"].get("uid") or obj["metadata"]["name"]] = (obj, kind, str(exc))
    for lq in local_queues.values():
        problem = local_queue_problem(lq)
        if problem is not None and "is held" not in problem:
            out[lq["metadata"].get("uid") or lq["metadata"]["name"]] = (lq, "LocalQueue", problem)
    return out
