"""Placement constraints a pod states about nodes and other pods, as upstream's plugins.

Pure functions of (pod, snapshot), run by the simulator and the live binder alike. Each one
returns SKIP from PreFilter (or PreScore) when the pod states nothing it checks and the
snapshot holds nothing that acts on the pod (no taints, no placed pod with terms), so a trace
without labels or terms costs one attribute check per plugin and pod.

- `TaintToleration`: nodes that are not Ready, cordoned, or carry a NoSchedule/NoExecute taint
  the pod does not tolerate are filtered out (upstream's TaintToleration + NodeUnschedulable).
- `NodeSelector`: the pod's `nodeSelector` labels must all match.
- `NodeAffinity`: the pod's required node affinity (any term of
  `requiredDuringSchedulingIgnoredDuringExecution`, every expression of that term; `matchFields`
  on the node name), as upstream.
- `PreferredNodeAffinity`: score, the summed weights of the preferred terms a node matches,
  normalised so the best node scores 100 (upstream's NodeAffinity score).
- `InterPodAffinity`: required pod affinity and anti-affinity, as upstream: a term of the pod
  needs (affinity) or forbids (anti-affinity) a matching placed pod in the node's topology
  domain (nodes sharing the value of `topologyKey`); placed pods' anti-affinity terms keep
  matching newcomers out of their domains too (symmetry). The first pod of a group whose
  affinity term matches itself may go anywhere.
- `PreferredInterPodAffinity`: score from the pod's preferred pod affinity (+weight) and
  anti-affinity (-weight) terms, per matching placed pod in the node's domain, normalised to
  0-100; symmetric, as upstream: placed pods' preferred terms (and required affinity, at weight
  1) that select the pod count on their own domains.
- `PodTopologySpread`: topology spread constraints: `DoNotSchedule` ones filter, with
  `minDomains`, `matchLabelKeys` and the node inclusion policies; `ScheduleAnyway` ones score.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import BoolArray, FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot, tally, term_group
from alnair.scheduler.cluster.terms import (
    PodAffinityTerm,
    SpreadConstraint,
    node_affinity_matches,
    node_selector_matches,
    untolerated,
)
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState, NodeVerdicts
from alnair.scheduler.framework.status import SKIP, SUCCESS, Status


class TaintToleration:
    NAME: ClassVar[str] = "TaintToleration"

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        return SUCCESS if snapshot.tainted.any() else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = snapshot
        passed = np.ones(nodes.size, dtype=np.bool_)
        tolerations = pod.tolerations
        not_ready = np.zeros(nodes.size, dtype=np.bool_)
        # Most nodes carry no taint: visit only those that do.
        for k in np.flatnonzero(live.tainted[nodes]).tolist():
            taint = untolerated(tolerations, live.taints[int(nodes[k])])
            if taint is not None:
                passed[k] = False
                not_ready[k] = taint.get("key", "").startswith("node.kubernetes.io/")
        return NodeVerdicts(
            passed=passed,
            failures=(("node not ready or cordoned", not_ready), ("untolerated taint", ~passed)),
        )


class _NodeLabelFilter(ABC):
    """Judges nodes one by one, on their labels and name, against a constraint of the pod."""

    NAME: ClassVar[str] = ""
    REASON: ClassVar[str] = ""

    @abstractmethod
    def constraint(self, pod: PodRequest) -> Any:
        """The pod's constraint; falsy when it has none (every node passes)."""

    @abstractmethod
    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool: ...

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        return SUCCESS if self.constraint(pod) else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        constraint = self.constraint(pod)
        if not constraint:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        judged = snapshot.judged(
            (self.NAME, constraint), lambda labels, name: self.admits(constraint, labels, name)
        )
        passed = judged[nodes]
        return NodeVerdicts(passed=passed, failures=((self.REASON, ~passed),))


class NodeSelector(_NodeLabelFilter):
    NAME: ClassVar[str] = "NodeSelector"
    REASON: ClassVar[str] = "node selector mismatch"

    def constraint(self, pod: PodRequest) -> Any:
        return pod.node_selector

    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool:
        return node_selector_matches(constraint, labels)


class NodeAffinity(_NodeLabelFilter):
    NAME: ClassVar[str] = "NodeAffinity"
    REASON: ClassVar[str] = "node affinity mismatch"

    def constraint(self, pod: PodRequest) -> Any:
        return pod.node_affinity

    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool:
        return node_affinity_matches(constraint, labels, name)


class PreferredNodeAffinity:
    NAME: ClassVar[str] = "PreferredNodeAffinity"

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        return SUCCESS if pod.node_preferences else SKIP

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = snapshot
        preferences = pod.node_preferences
        if not preferences:
            return np.zeros(nodes.size, dtype=np.float64)
        return np.array(
            [
                sum(
                    weight
                    for weight, term in preferences
                    if node_affinity_matches((term,), live.labels[int(n)], live.names[int(n)])
                )
                for n in nodes
            ],
            dtype=np.float64,
        )

    def normalize_score(self, pod: PodRequest, state: CycleState, scores: FloatArray) -> FloatArray:
        top = float(scores.max()) if scores.size else 0.0
        if top <= 0:
            return scores
        normalized: FloatArray = scores * (MAX_NODE_SCORE / top)
        return normalized


class InterPodAffinity:
    NAME: ClassVar[str] = "InterPodAffinity"

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        relevant = pod.pod_affinity or pod.pod_anti_affinity or snapshot.pod_termed
        return SUCCESS if relevant else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = snapshot
        if not (pod.pod_affinity or pod.pod_anti_affinity or live.pod_termed):
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        own = dict(pod.labels)
        unmet = np.zeros(len(live.names), dtype=np.bool_)
        repelled = np.zeros(len(live.names), dtype=np.bool_)
        if pod.pod_affinity or pod.pod_anti_affinity:
            others = _others(live, pod)
            for term in pod.pod_affinity:
                domains = _domains(live, term, others)
                if not domains and term.covers(pod.namespace, own):
                    continue  # the first pod of its group
                unmet |= ~_in_domains(live, term.topology_key, domains)
            for term in pod.pod_anti_affinity:
                repelled |= _in_domains(live, term.topology_key, _domains(live, term, others))
        held_off: dict[str, set[str]] = {}
        for holder, holding in _placed_with_terms(live, pod):
            for term in holder.pod_anti_affinity:
                if term.covers(pod.namespace, own):
                    held_off.setdefault(term.topology_key, set()).update(
                        _values(live, term.topology_key, holding)
                    )
        for key, values in held_off.items():
            repelled |= _in_domains(live, key, values)
        blocked_anti = repelled[nodes]
        blocked_aff = unmet[nodes] & ~blocked_anti
        return NodeVerdicts(
            passed=~(blocked_anti | blocked_aff),
            failures=(
                ("pod anti-affinity", blocked_anti),
                ("pod affinity not satisfied", blocked_aff),
            ),
        )


Placed = list[tuple[str, dict[str, str], Mapping[int, int]]]
"""Placed pods by label group: namespace, labels as a dict, and how many of them each node
holds (see `_others`)."""


def _values(live: ClusterSnapshot, key: str, nodes: Iterable[int]) -> set[str]:
    """The values of label `key` on `nodes` (nodes without it add none)."""
    labels = live.labels
    return {v for n in nodes if (v := labels[n].get(key)) is not None}


def _domains(live: ClusterSnapshot, term: PodAffinityTerm, pods: Placed) -> set[str]:
    """The topology values of the nodes holding a pod that `term` selects."""
    found: set[str] = set()
    for namespace, labels, nodes in pods:
        if term.covers(namespace, labels):
            found |= _values(live, term.topology_key, nodes)
    return found


def _in_domains(live: ClusterSnapshot, key: str, domains: set[str]) -> BoolArray:
    """Per node: does its `key` label hold one of `domains`?"""
    if not domains:
        return np.zeros(len(live.names), dtype=np.bool_)
    codes, values = live.domains(key)
    wanted = [i for i, value in enumerate(values) if value in domains]
    found: BoolArray = np.isin(codes, wanted)
    return found


def _without(nodes: Mapping[int, int], node: int) -> dict[int, int]:
    """`nodes` with one pod fewer on `node`."""
    left = dict(nodes)
    tally(left, node, -1)
    return left


def _others(live: ClusterSnapshot, pod: PodRequest) -> Placed:
    """The placed pods other than `pod`, by label group (a selector is matched once per
    group, whatever the number of replicas in it)."""
    own = live.placed.get(pod.key)
    found: Placed = []
    for (namespace, labels), holding in live.label_groups.items():
        nodes: Mapping[int, int] = holding
        if own is not None and (own[0].namespace, own[0].labels) == (namespace, labels):
            nodes = _without(holding, own[1].node)
            if not nodes:
                continue
        found.append((namespace, dict(labels), nodes))
    return found


def _placed_with_terms(
    live: ClusterSnapshot, pod: PodRequest
) -> list[tuple[PodRequest, Mapping[int, int]]]:
    """The placed pods other than `pod` that carry inter-pod terms: one holder per set of
    terms, with how many pods carrying them each node holds."""
    own = live.placed.get(pod.key)
    mine = term_group(own[0]) if own is not None and own[0].has_pod_terms else None
    found: list[tuple[PodRequest, Mapping[int, int]]] = []
    for terms, (holder, holding) in live.term_groups.items():
        nodes: Mapping[int, int] = holding
        if terms == mine:
            assert own is not None
            nodes = _without(holding, own[1].node)
            if not nodes:
                continue
        found.append((holder, nodes))
    return found


def _admitted(live: ClusterSnapshot, pod: PodRequest, constraint: SpreadConstraint) -> BoolArray:
    """Per node: does it count as a domain for `constraint` (its inclusion policies)?"""
    admitted = np.ones(len(live.names), dtype=np.bool_)
    if constraint.honor_node_affinity and (pod.node_selector or pod.node_affinity):
        admitted &= live.judged(("accepts", pod.node_selector, pod.node_affinity), pod.accepts_node)
    if constraint.honor_node_taints:
        for n in np.flatnonzero(live.tainted).tolist():
            admitted[n] &= untolerated(pod.tolerations, live.taints[n]) is None
    return admitted


def _spread_counts(
    live: ClusterSnapshot,
    pod: PodRequest,
    constraint: SpreadConstraint,
    keys: set[str],
    others: Placed,
) -> tuple[IntArray, BoolArray]:
    """Matching pods (the pod's namespace, the constraint's selector) per domain of the
    constraint's key (indexed as `ClusterSnapshot.domains` numbers them), over the eligible
    nodes: those carrying every key in `keys` and admitted by the inclusion policies; and which
    domains are eligible (hold at least one eligible node)."""
    eligible = _admitted(live, pod, constraint)
    for k in keys:
        eligible &= live.domains(k)[0] >= 0
    codes, values = live.domains(constraint.topology_key)
    present = np.zeros(len(values), dtype=np.bool_)
    present[codes[eligible]] = True
    counts = np.zeros(len(values), dtype=np.int64)
    for namespace, labels, holding in others:
        if namespace == pod.namespace and constraint.selector.matches(labels):
            for node, pods in holding.items():
                if eligible[node]:
                    counts[codes[node]] += pods
    return counts, present


def _per_node(live: ClusterSnapshot, key: str, nodes: IntArray, counts: IntArray) -> IntArray:
    """Each of `nodes`' domain count (0 for a node without the `key` label)."""
    codes = live.domains(key)[0][nodes]
    if not counts.size:  # no node has the label
        return np.zeros(nodes.size, dtype=np.int64)
    found: IntArray = np.where(codes >= 0, counts[np.maximum(codes, 0)], 0)
    return found


class PodTopologySpread:
    """Topology spread constraints, as upstream: `DoNotSchedule` ones filter (a node whose
    domain would exceed `maxSkew` over the least-loaded eligible domain, or that lacks the
    key), `ScheduleAnyway` ones score (fewer matching pods in the node's domain is better)."""

    NAME: ClassVar[str] = "PodTopologySpread"
    MISSING: ClassVar[str] = "missing topology spread label"
    SKEWED: ClassVar[str] = "topology spread constraint not satisfied"

    @staticmethod
    def _constraints(pod: PodRequest, hard: bool) -> tuple[SpreadConstraint, ...]:
        return tuple(c for c in pod.spread if c.hard == hard)

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        return SUCCESS if any(c.hard for c in pod.spread) else SKIP

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        return SUCCESS if any(not c.hard for c in pod.spread) else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = snapshot
        constraints = self._constraints(pod, hard=True)
        if not constraints:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        keys = {c.topology_key for c in constraints}
        others = _others(live, pod)
        own = dict(pod.labels)
        missing = np.zeros(nodes.size, dtype=np.bool_)
        skewed = np.zeros(nodes.size, dtype=np.bool_)
        for c in constraints:
            counts, present = _spread_counts(live, pod, c, keys, others)
            floor = int(counts[present].min()) if int(present.sum()) >= c.min_domains else 0
            mine = 1 if c.selector.matches(own) else 0
            missing |= live.domains(c.topology_key)[0][nodes] < 0
            skewed |= _per_node(live, c.topology_key, nodes, counts) + mine - floor > c.max_skew
        skewed &= ~missing
        return NodeVerdicts(
            passed=~(missing | skewed),
            failures=((self.MISSING, missing), (self.SKEWED, skewed)),
        )

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = snapshot
        constraints = self._constraints(pod, hard=False)
        if not constraints:
            return np.zeros(nodes.size, dtype=np.float64)
        keys = {c.topology_key for c in constraints}
        others = _others(live, pod)
        raw = np.zeros(nodes.size, dtype=np.float64)
        lacking = np.zeros(nodes.size, dtype=np.bool_)
        for c in constraints:
            counts, present = _spread_counts(live, pod, c, keys, others)
            # More domains make a constraint weigh more (one pod moves its skew less).
            weight = math.log(int(present.sum()) + 2)
            without = live.domains(c.topology_key)[0][nodes] < 0
            lacking |= without
            here = _per_node(live, c.topology_key, nodes, counts) + c.max_skew - 1
            raw += np.where(without, 0.0, weight * here)
        ranked = ~lacking
        if not ranked.any():
            return np.zeros(nodes.size, dtype=np.float64)
        high, low = float(raw[ranked].max()), float(raw[ranked].min())
        spread = (
            MAX_NODE_SCORE * (high + low - raw) / high
            if high > 0
            else np.full(nodes.size, float(MAX_NODE_SCORE))
        )
        scores: FloatArray = np.where(ranked, spread, 0.0)
        return scores


HARD_POD_AFFINITY_WEIGHT = 1
"""What a placed pod's *required* affinity term adds for a newcomer it selects (upstream's
default `hardPodAffinityWeight`)."""


class PreferredInterPodAffinity:
    """Score, as upstream's InterPodAffinity score: for each placed pod a preferred term of the
    pod selects, the term's weight is added (affinity) or taken away (anti-affinity) on every
    node of that pod's topology domain; symmetrically, a placed pod whose preferred terms (or
    required affinity terms, at `HARD_POD_AFFINITY_WEIGHT`) select the pod adds or takes away
    the same on its own domain. Normalised to 0-100 over the candidate nodes and 0 (nothing
    touched: 0 everywhere)."""

    NAME: ClassVar[str] = "PreferredInterPodAffinity"

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        return SUCCESS if _signed(pod) or snapshot.pod_termed else SKIP

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = snapshot
        zeros = np.zeros(nodes.size, dtype=np.float64)
        weighted = _signed(pod)
        if not weighted and not live.pod_termed:
            return zeros
        by_domain: dict[tuple[str, str], float] = {}

        def add(term: PodAffinityTerm, node: int, weight: float) -> None:
            value = live.labels[node].get(term.topology_key)
            if value is not None:
                domain = (term.topology_key, value)
                by_domain[domain] = by_domain.get(domain, 0.0) + weight

        if weighted:
            for namespace, labels, holding in _others(live, pod):
                for weight, term in weighted:
                    if term.covers(namespace, labels):
                        for node, pods in holding.items():
                            add(term, node, weight * pods)
        own = dict(pod.labels)
        for holder, holding in _placed_with_terms(live, pod):
            terms = [(float(HARD_POD_AFFINITY_WEIGHT), t) for t in holder.pod_affinity]
            for weight, term in terms + _signed(holder):
                if term.covers(pod.namespace, own):
                    for node, pods in holding.items():
                        add(term, node, weight * pods)
        if not by_domain:
            return zeros
        keys = {key for key, _value in by_domain}
        raw = np.array(
            [
                sum(by_domain.get((key, live.labels[n].get(key, "")), 0.0) for key in keys)
                for n in nodes.tolist()
            ],
            dtype=np.float64,
        )
        # The range always holds 0 (a node no term touches), as upstream: equal positive
        # scores stay at the top rather than all dropping to 0.
        low, high = min(float(raw.min()), 0.0), max(float(raw.max()), 0.0)
        if high == low:
            return zeros
        scores: FloatArray = MAX_NODE_SCORE * (raw - low) / (high - low)
        return scores


def _signed(pod: PodRequest) -> list[tuple[float, PodAffinityTerm]]:
    """The pod's preferred terms with their weights, negative for anti-affinity."""
    return [(float(w), t) for w, t in pod.pod_preferences] + [
        (-float(w), t) for w, t in pod.pod_aversions
    ]
