"""From a Kubernetes Pod to what the scheduler reasons about (`LivePod`), with clear errors.

Requests are summed over containers (init containers count with their maximum, as upstream).
Whole GPUs come from `nvidia.com/gpu`. A fraction comes from `alnair.io/gpu-compute` (percent of
one GPU, 10 milli-GPU per percent) and/or `alnair.io/gpu-memory` (MiB): memory is converted into
milli-GPU against the smallest GPU memory among the models the pod accepts, so a fraction never
asks for less than its memory needs on any GPU it may land on. Asking for both whole and
fractional GPUs, a fraction over one GPU, an unknown GPU model, a malformed node or pod affinity
(required or preferred) or a malformed topology spread constraint is an `InvalidPodError` that
names the field and value; the binder records it as an Event on the pod.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.scheduler.live.selectors import LabelSelector
from alnair.scheduler.snapshot import PodRequest

MODELLED_RESOURCES = frozenset({"cpu", "memory", r.GPU, r.GPU_MEMORY, r.GPU_COMPUTE})
"""Requests the snapshot accounts itself (GPU fractions as milli-GPU); any other resource a pod
requests (extended resources, hugepages, ephemeral storage) is an `extra`, checked against
what the node reports."""


class InvalidPodError(InvalidValueError):
    """The pod's request cannot be scheduled as written (not a capacity problem)."""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Obj) -> bool:
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.get("key")
        return self.key == taint.get("key") and self.value == taint.get("value", "")


def untolerated(tolerations: Sequence[Toleration], taints: Sequence[Obj]) -> Obj | None:
    """The first of `taints` that none of `tolerations` tolerates, if any."""
    return next((x for x in taints if not any(t.tolerates(x) for t in tolerations)), None)


NODE_NAME_FIELD = "metadata.name"
"""The one node field `matchFields` may name."""

_SET_OPERATORS = frozenset({"In", "NotIn"})
_EXISTENCE_OPERATORS = frozenset({"Exists", "DoesNotExist"})
_NUMERIC_OPERATORS = frozenset({"Gt", "Lt"})


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One `matchExpressions` or `matchFields` entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    on_field: bool = False
    """True for `matchFields` (the node's name), False for a label."""

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        value = node_name if self.on_field else labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        # Gt / Lt: the label must hold an integer (checked at parse time for the pod's side).
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        bound = int(self.values[0])
        return number > bound if self.operator == "Gt" else number < bound


NodeSelectorTerm = tuple[NodeRequirement, ...]
"""Requirements that must all hold (an empty term matches no node, as upstream)."""


def node_selector_matches(selector: Sequence[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    """A `nodeSelector`: every (key, value) must be a label of the node."""
    return all(labels.get(k) == v for k, v in selector)


def node_affinity_matches(
    terms: tuple[NodeSelectorTerm, ...], labels: Mapping[str, str], node_name: str
) -> bool:
    """Upstream's required node affinity: any term whose requirements all hold."""
    return any(term and all(q.matches(labels, node_name) for q in term) for term in terms)


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


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """An inter-pod (anti-)affinity term, required or preferred: pods matching `selector` in
    `namespaces`, on nodes sharing the value of the `topology_key` label."""

    selector: LabelSelector
    namespaces: frozenset[str]
    """Empty: every namespace (`namespaceSelector: {}`)."""
    topology_key: str

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Does the term select a pod with these namespace and labels?"""
        in_scope = not self.namespaces or namespace in self.namespaces
        return in_scope and self.selector.matches(labels)


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


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One `topologySpreadConstraints` entry: pods matching `selector` (in the pod's own
    namespace) may differ by at most `max_skew` between the domains of `topology_key`."""

    max_skew: int
    topology_key: str
    hard: bool
    """`whenUnsatisfiable: DoNotSchedule` (a filter); False for `ScheduleAnyway` (a score)."""
    selector: LabelSelector
    min_domains: int = 1
    """Fewer eligible domains than this count the global minimum as 0 (hard only)."""
    honor_node_affinity: bool = True
    """`nodeAffinityPolicy: Honor` (default): only nodes the pod's node selector and required
    node affinity admit count as domains."""
    honor_node_taints: bool = False
    """`nodeTaintsPolicy: Honor`: only nodes whose taints the pod tolerates count (default
    Ignore)."""


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


@dataclass(frozen=True, slots=True)
class LivePod(PodRequest):
    """A PodRequest with what only a live cluster has: priority, gang, placement constraints."""

    priority: int = 0
    gang: str | None = None
    """`<namespace>/<podgroup>` when the pod belongs to a gang."""
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    node_affinity: tuple[NodeSelectorTerm, ...] = ()
    """Required node affinity terms (any may match); empty when the pod has none."""
    node_preferences: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    """Preferred node affinity: (weight, term) pairs."""
    labels: tuple[tuple[str, str], ...] = ()
    """The pod's labels (disruption budgets and inter-pod affinity select pods by them)."""
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_preferences: tuple[tuple[int, PodAffinityTerm], ...] = ()
    """Preferred pod affinity: (weight, term) pairs that attract."""
    pod_aversions: tuple[tuple[int, PodAffinityTerm], ...] = ()
    """Preferred pod anti-affinity: (weight, term) pairs that repel."""
    spread: tuple[SpreadConstraint, ...] = ()
    """Topology spread constraints, hard and soft."""
    created: float = 0.0
    """Creation time (epoch seconds): queue order and creation-to-bound latency."""
    extra: tuple[tuple[str, int], ...] = ()
    """Requests of resources outside `MODELLED_RESOURCES`, in whole units (bytes for sizes)."""

    @property
    def counts_placements(self) -> bool:
        """Can another pod's placement make this one fit (required pod affinity, or a hard
        spread constraint)? Only such pods are worth waking when a pod lands."""
        return bool(self.pod_affinity) or any(c.hard for c in self.spread)

    def counts_pod(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Could a pod with these namespace and labels, newly placed, make this pod fit? Yes
        when one of its required pod affinity terms or hard spread constraints selects it."""
        if not self.counts_placements:
            return False
        return any(t.covers(namespace, labels) for t in self.pod_affinity) or (
            namespace == self.namespace
            and any(c.hard and c.selector.matches(labels) for c in self.spread)
        )

    def accepts_node(self, labels: Mapping[str, str], name: str) -> bool:
        """Does the node pass the pod's `nodeSelector` and required node affinity?"""
        if not node_selector_matches(self.node_selector, labels):
            return False
        return not self.node_affinity or node_affinity_matches(self.node_affinity, labels, name)

    @property
    def has_pod_terms(self) -> bool:
        """Does the pod carry inter-pod terms that act on pods placed after it?"""
        required = self.pod_anti_affinity or self.pod_affinity
        return bool(required or self.pod_preferences or self.pod_aversions)


def _containers_requests(spec: Obj) -> dict[str, Any]:
    total: dict[str, Any] = {}

    def requests_of(c: Obj) -> dict[str, Any]:
        res = c.get("resources") or {}
        merged = dict(res.get("limits") or {})
        merged.update(res.get("requests") or {})  # requests win; limits default them
        return merged

    for c in spec.get("containers") or []:
        for name, q in requests_of(c).items():
            total[name] = total.get(name, 0) + r.parse_quantity(q, f"{c.get('name')}.{name}")
    for c in spec.get("initContainers") or []:
        for name, q in requests_of(c).items():
            v = r.parse_quantity(q, f"{c.get('name')}.{name}")
            total[name] = max(total.get(name, 0), v)
    return total


def _ts(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


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
    memory = req.get(r.GPU_MEMORY, 0)
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
                r.GPU_MEMORY, f"{memory}", f"more than one GPU holds ({max(candidates)} MiB)"
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
            created=_ts(meta.get("creationTimestamp")),
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
