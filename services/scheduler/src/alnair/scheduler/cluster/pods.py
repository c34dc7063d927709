"""From a Kubernetes Pod to what the scheduler reasons about (`LivePod`), with clear errors.

Requests are summed over containers (init containers count with their maximum, as upstream).
Whole GPUs come from `nvidia.com/gpu`. A fraction comes from `alnair.io/gpu-compute` (percent of
one GPU, 10 milli-GPU per percent) and/or `alnair.io/gpu-memory-gib` (GiB) or `alnair.io/gpu-memory`
(MiB; the resource's name is its unit, as the device plugin advertises it): memory is converted into
milli-GPU against the smallest GPU memory among the models the pod accepts, so a fraction never
asks for less than its memory needs on any GPU it may land on. Asking for both whole and
fractional GPUs, a fraction over one GPU, an unknown GPU model, a malformed node or pod affinity
(required or preferred) or a malformed topology spread constraint is an `InvalidPodError` that
names the field and value; the binder records it as an Event on the pod.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from alnair.common import resources as r
from alnair.common.annotations import job_model
from alnair.common.colocation import workload_key
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.cluster.selectors import LabelSelector
from alnair.scheduler.cluster.terms import (
    NodeRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
)

MODELLED_RESOURCES = frozenset({"cpu", "memory", r.GPU, r.GPU_COMPUTE, *r.GPU_MEMORY_UNIT_MIB})
"""Requests the snapshot accounts itself (GPU fractions as milli-GPU); any other resource a pod
requests (extended resources, hugepages, ephemeral storage) is an `extra`, checked against
what the node reports."""


class InvalidPodError(InvalidValueError):
    """The pod's request cannot be scheduled as written (not a capacity problem)."""


NODE_NAME_FIELD = "metadata.name"
"""The one node field `matchFields` may name."""

_SET_OPERATORS = frozenset({"In", "NotIn"})
_EXISTENCE_OPERATORS = frozenset({"Exists", "DoesNotExist"})
_NUMERIC_OPERATORS = frozenset({"Gt", "Lt"})


def _requirement(raw: Obj, where: str, on_field: bool) -> NodeRequirement:
    key, operator = raw.get("key", ""), raw.get("operator", "")
    values = tuple(str(v) for v in raw.get("values") or ())
    if not key:
        raise InvalidPodError(f"{where}.key", key, "a requirement needs a key")
    if on_field and key != NODE_NAME_FIELD:
        raise InvalidPodError(f"{where}.key", key, f"matchFields supports only {NODE_NAME_FIELD}")
    if operator in _SET_OPERATORS:
        if not values:
            raise InvalidPodError(f"{where}.values", [], f"{operator} needs at least one value")
    elif operator in _EXISTENCE_OPERATORS:
        if values:
            raise InvalidPodError(f"{where}.values", list(values), f"{operator} takes none")
    elif operator in _NUMERIC_OPERATORS and not on_field:
        if len(values) != 1 or not values[0].lstrip("-").isdigit():
            raise InvalidPodError(
                f"{where}.values", list(values), f"{operator} takes exactly one integer"
            )
    else:
        raise InvalidPodError(f"{where}.operator", operator, "not a node selector operator")
    return NodeRequirement(key=key, operator=operator, values=values, on_field=on_field)


def _term(term: Obj, where: str) -> NodeSelectorTerm:
    return tuple(
        [
            _requirement(e, f"{where}.matchExpressions[{j}]", on_field=False)
            for j, e in enumerate(term.get("matchExpressions") or [])
        ]
        + [
            _requirement(e, f"{where}.matchFields[{j}]", on_field=True)
            for j, e in enumerate(term.get("matchFields") or [])
        ]
    )


def _required_node_affinity(spec: Obj) -> tuple[NodeSelectorTerm, ...]:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    return tuple(
        _term(term, f"{base}.nodeSelectorTerms[{i}]")
        for i, term in enumerate(required.get("nodeSelectorTerms") or [])
    )


T = TypeVar("T")


def _preferred(
    spec: Obj, kind: str, member: str, parse: Callable[[Obj, str], T]
) -> tuple[tuple[int, T], ...]:
    """`spec.affinity.<kind>.preferredDuringSchedulingIgnoredDuringExecution` as (weight,
    parsed `member`) pairs; a weight outside 1-100 is refused, naming it."""
    block = (spec.get("affinity") or {}).get(kind) or {}
    base = f"spec.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution"
    preferences: list[tuple[int, T]] = []
    for i, item in enumerate(block.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        where = f"{base}[{i}]"
        weight = item.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise InvalidPodError(f"{where}.weight", weight, "an integer 1-100")
        preferences.append((weight, parse(item.get(member) or {}, f"{where}.{member}")))
    return tuple(preferences)


def _preferred_node_affinity(spec: Obj) -> tuple[tuple[int, NodeSelectorTerm], ...]:
    return _preferred(spec, "nodeAffinity", "preference", _term)


def _affinity_term(raw: Obj, where: str, namespace: str) -> PodAffinityTerm:
    topology_key = raw.get("topologyKey") or ""
    if not topology_key:
        raise InvalidPodError(f"{where}.topologyKey", topology_key, "a node label key")
    raw_selector = raw.get("labelSelector")
    selector = _selector(raw_selector, f"{where}.labelSelector")
    ns_selector = raw.get("namespaceSelector")
    if ns_selector:
        raise InvalidPodError(
            f"{where}.namespaceSelector", ns_selector, "only {} (all namespaces) is supported"
        )
    if ns_selector is not None:  # {}: every namespace
        namespaces: frozenset[str] = frozenset()
    else:
        namespaces = frozenset(raw.get("namespaces") or ()) or frozenset({namespace})
    return PodAffinityTerm(selector, namespaces, topology_key)


def _selector(raw: Obj | None, where: str) -> LabelSelector:
    """A label selector field; null selects no pod (as the API defines it)."""
    if raw is None:
        return LabelSelector(nothing=True)
    selector = LabelSelector.parse(raw)
    bad = selector.invalid_operator()
    if bad is not None:
        raise InvalidPodError(where, bad, "not a label selector operator")
    return selector


def _pod_affinity_terms(spec: Obj, kind: str, namespace: str) -> tuple[PodAffinityTerm, ...]:
    block = (spec.get("affinity") or {}).get(kind) or {}
    base = f"spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution"
    return tuple(
        _affinity_term(raw, f"{base}[{i}]", namespace)
        for i, raw in enumerate(block.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    )


def _preferred_pod_affinity_terms(
    spec: Obj, kind: str, namespace: str
) -> tuple[tuple[int, PodAffinityTerm], ...]:
    return _preferred(
        spec, kind, "podAffinityTerm", lambda raw, where: _affinity_term(raw, where, namespace)
    )


_WHEN_UNSATISFIABLE = {"DoNotSchedule": True, "ScheduleAnyway": False}
_INCLUSION_POLICIES = {"Honor": True, "Ignore": False}


def _positive_int(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidPodError(where, value, what)
    return value


def _spread_constraints(spec: Obj, labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    constraints: list[SpreadConstraint] = []
    for i, raw in enumerate(spec.get("topologySpreadConstraints") or []):
        where = f"spec.topologySpreadConstraints[{i}]"
        max_skew = _positive_int(raw.get("maxSkew"), f"{where}.maxSkew", "an integer >= 1")
        topology_key = raw.get("topologyKey") or ""
        if not topology_key:
            raise InvalidPodError(f"{where}.topologyKey", topology_key, "a node label key")
        when = raw.get("whenUnsatisfiable")
        if when not in _WHEN_UNSATISFIABLE:
            raise InvalidPodError(
                f"{where}.whenUnsatisfiable", when, "DoNotSchedule or ScheduleAnyway"
            )
        hard = _WHEN_UNSATISFIABLE[when]
        min_domains = 1
        if raw.get("minDomains") is not None:
            min_domains = _positive_int(raw["minDomains"], f"{where}.minDomains", "an integer >= 1")
            if not hard:
                raise InvalidPodError(
                    f"{where}.minDomains", min_domains, "only with whenUnsatisfiable: DoNotSchedule"
                )
        policies: list[bool] = []
        defaults = (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore"))
        for field_name, default in defaults:
            policy = raw.get(field_name) or default
            if policy not in _INCLUSION_POLICIES:
                raise InvalidPodError(f"{where}.{field_name}", policy, "Honor or Ignore")
            policies.append(_INCLUSION_POLICIES[policy])
        selector = _selector(raw.get("labelSelector"), f"{where}.labelSelector")
        # matchLabelKeys: the pod's own values of these keys narrow the selector (a key the
        # pod does not carry is ignored, as upstream).
        extra = tuple((k, labels[k]) for k in raw.get("matchLabelKeys") or () if k in labels)
        if extra and not selector.nothing:
            selector = LabelSelector(
                match_labels=tuple(sorted({*selector.match_labels, *extra})),
                expressions=selector.expressions,
            )
        constraints.append(
            SpreadConstraint(
                max_skew=max_skew,
                topology_key=topology_key,
                hard=hard,
                selector=selector,
                min_domains=min_domains,
                honor_node_affinity=policies[0],
                honor_node_taints=policies[1],
            )
        )
    return tuple(constraints)


LivePod = PodRequest
"""A parsed pod: the snapshot's `PodRequest` carries priority, gang and every constraint, so
the simulator's pods and the live binder's are one type (the old name stays for readers)."""


def _containers_requests(spec: Obj) -> dict[str, Any]:
    total: dict[str, Any] = {}

    for c in spec.get("containers") or []:
        for name, q in r.container_requests(c).items():
            total[name] = total.get(name, 0) + r.parse_quantity(q, f"{c.get('name')}.{name}")
    for c in spec.get("initContainers") or []:
        for name, q in r.container_requests(c).items():
            v = r.parse_quantity(q, f"{c.get('name')}.{name}")
            total[name] = max(total.get(name, 0), v)
    return total


def _readable_requests(spec: Obj) -> dict[str, Any]:
    """`_containers_requests`, leaving out each quantity that cannot be read."""
    total: dict[str, Any] = {}
    for part in ("containers", "initContainers"):
        for c in spec.get(part) or []:
            for name, q in r.container_requests(c).items():
                try:
                    v = r.parse_quantity(q, f"{c.get('name')}.{name}")
                except InvalidValueError:
                    continue
                if part == "containers":
                    total[name] = total.get(name, 0) + v
                else:
                    total[name] = max(total.get(name, 0), v)
    return total


def parse_bound_pod(
    pod: Obj, gpu_memory_mib: dict[str, int] | None = None
) -> tuple[LivePod, str | None]:
    """What a pod the API server shows bound holds, and why its request could not be read in
    full (None when it could). Its node is a fact, whoever bound it: what can be read counts,
    and what cannot is never counted as nothing. A GPU request that names a model no node has
    still holds its GPUs; a fraction whose size cannot be read holds its whole GPU."""
    try:
        return parse_pod(pod, gpu_memory_mib), None
    except InvalidPodError as exc:
        problem = str(exc)
    meta, spec = pod["metadata"], pod.get("spec") or {}
    req = _readable_requests(spec)
    whole = req.get(r.GPU, 0)
    fraction = req.get(r.GPU_COMPUTE, 0) or r.gpu_memory_resource(req)
    num_gpu, milli = 0, 0
    if whole > 0:
        num_gpu, milli = math.ceil(whole), r.MILLI_PER_GPU
    elif fraction:
        num_gpu, milli = 1, r.MILLI_PER_GPU
    held = LivePod(
        name=meta["name"],
        namespace=meta.get("namespace", "default"),
        uid=meta.get("uid", ""),
        cpu_milli=math.ceil(float(req.get("cpu", 0)) * 1000),
        memory_mib=math.ceil(float(req.get("memory", 0)) / 2**20),
        num_gpu=num_gpu,
        gpu_milli=milli,
        labels=tuple(sorted((meta.get("labels") or {}).items())),
    )
    return held, problem


def timestamp(value: str | None) -> float:
    """An RFC 3339 time of the API (`creationTimestamp`) in epoch seconds; 0 when absent."""
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _workload(annotations: Mapping[str, Any]) -> str:
    model = job_model(annotations)
    return workload_key(model.model_name, model.batch_size)


def parse_pod(pod: Obj, gpu_memory_mib: dict[str, int] | None = None) -> LivePod:
    """The scheduler's view of `pod`; raises InvalidPodError naming what is wrong."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    name, ns = meta["name"], meta.get("namespace", "default")
    try:
        req = _containers_requests(spec)
    except InvalidValueError as exc:
        raise InvalidPodError(exc.field, exc.value, exc.reason) from exc
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    selector = dict(spec.get("nodeSelector") or {})

    models_text = annotations.get(r.GPU_MODEL_REQUEST) or selector.pop(r.LABEL_GPU_MODEL, "")
    models = frozenset(m.strip() for m in models_text.split("|") if m.strip())
    memory_table = gpu_memory_mib or r.GPU_MODEL_MEMORY_MIB
    unknown = sorted(m for m in models if m not in memory_table)
    if unknown:
        raise InvalidPodError(r.GPU_MODEL_REQUEST, models_text, f"unknown GPU model {unknown[0]}")

    whole = req.get(r.GPU, 0)
    compute = req.get(r.GPU_COMPUTE, 0)
    memory_resource = r.gpu_memory_resource(req)
    try:
        memory = r.gpu_memory_mib(req, "resources")
    except InvalidValueError as exc:
        raise InvalidPodError(exc.field, exc.value, exc.reason) from exc
    if whole != int(whole) or whole < 0:
        raise InvalidPodError(r.GPU, str(whole), "whole GPUs must be a non-negative integer")
    num_gpu, gpu_milli = int(whole), (r.MILLI_PER_GPU if whole else 0)
    if compute or memory:
        if whole:
            raise InvalidPodError(
                r.GPU, str(whole), f"ask for whole GPUs or a fraction ({r.GPU_COMPUTE}), not both"
            )
        if not 0 <= compute <= 100:
            raise InvalidPodError(r.GPU_COMPUTE, str(compute), "percent of one GPU: 1-100")
        candidates = [memory_table[m] for m in models] or list(memory_table.values())
        smallest = min(candidates)
        if memory > max(candidates):
            raise InvalidPodError(
                memory_resource,
                f"{req[memory_resource]}",
                f"{memory} MiB is more than one GPU holds ({max(candidates)} MiB)",
            )
        from_memory = math.ceil(float(memory) * r.MILLI_PER_GPU / smallest)
        num_gpu = 1
        gpu_milli = max(math.ceil(float(compute) * 10), from_memory, 1)
        gpu_milli = min(gpu_milli, r.MILLI_PER_GPU)

    tolerations = tuple(
        Toleration(
            key=t.get("key", ""),
            operator=t.get("operator", "Equal"),
            value=t.get("value", ""),
            effect=t.get("effect", ""),
        )
        for t in spec.get("tolerations") or []
    )
    group = labels.get(r.POD_GROUP_LABEL)
    affinity = _required_node_affinity(spec)
    preferences = _preferred_node_affinity(spec)
    pod_affinity = _pod_affinity_terms(spec, "podAffinity", ns)
    pod_anti_affinity = _pod_affinity_terms(spec, "podAntiAffinity", ns)
    pod_preferences = _preferred_pod_affinity_terms(spec, "podAffinity", ns)
    pod_aversions = _preferred_pod_affinity_terms(spec, "podAntiAffinity", ns)
    spread = _spread_constraints(spec, labels)
    try:
        return LivePod(
            name=name,
            namespace=ns,
            uid=meta.get("uid", ""),
            cpu_milli=math.ceil(float(req.get("cpu", 0)) * 1000),
            memory_mib=math.ceil(float(req.get("memory", 0)) / 2**20),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli,
            gpu_models=models,
            priority=int(spec.get("priority") or 0),
            gang=f"{ns}/{group}" if group else None,
            tolerations=tolerations,
            node_selector=tuple(sorted(selector.items())),
            node_affinity=affinity,
            node_preferences=preferences,
            labels=tuple(sorted(labels.items())),
            pod_affinity=pod_affinity,
            pod_anti_affinity=pod_anti_affinity,
            pod_preferences=pod_preferences,
            pod_aversions=pod_aversions,
            spread=spread,
            created=timestamp(meta.get("creationTimestamp")),
            workload=_workload(annotations),
            extra=tuple(
                sorted(
                    (name, math.ceil(float(amount)))
                    for name, amount in req.items()
                    if name not in MODELLED_RESOURCES and amount
                )
            ),
        )
    except InvalidValueError as exc:
        raise InvalidPodError(exc.field, exc.value, exc.reason) from exc


def placement_annotations(pod: Obj) -> tuple[list[int], int] | None:
    """GPU indices and milli-GPU the scheduler wrote on a bound pod, if any."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if r.ANN_GPU_INDICES not in ann:
        return None
    indices = r.parse_indices(ann[r.ANN_GPU_INDICES]) if ann[r.ANN_GPU_INDICES] else []
    milli = int(ann.get(r.ANN_GPU_MILLI, r.MILLI_PER_GPU))
    return indices, milli


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}


def wants_us(pod: Obj, scheduler_name: str) -> bool:
    spec = pod.get("spec") or {}
    return spec.get("schedulerName") == scheduler_name
