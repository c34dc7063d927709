"""What a pod asks of the nodes and pods around it: tolerations, node selector terms,
inter-pod (anti-)affinity terms, topology spread constraints, and how each matches.

These are values on `PodRequest` (parsed from a Pod by `live.pods`, or made up by a trace), so
the constraint plugins read the same types in the simulator and the live binder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from alnair.common.kube import Obj
from alnair.scheduler.cluster.selectors import LabelSelector


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
