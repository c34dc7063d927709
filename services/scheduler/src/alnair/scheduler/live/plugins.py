"""Plugins that only make sense on a live cluster; pure functions of (pod, LiveSnapshot).

- `TaintToleration`: nodes that are not Ready, cordoned, or carry a NoSchedule/NoExecute taint
  the pod does not tolerate are filtered out (upstream's TaintToleration + NodeUnschedulable).
- `NodeSelector`: the pod's `nodeSelector` labels must all match.
- `NodeAffinity`: the pod's required node affinity (any term of
  `requiredDuringSchedulingIgnoredDuringExecution`, every expression of that term; `matchFields`
  on the node name), as upstream.
- `PreferredNodeAffinity`: score, the summed weights of the preferred terms a node matches,
  normalised so the best node scores 100 (upstream's NodeAffinity score); 0 everywhere for a
  pod without preferences, so it never disturbs the placement policy then.
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
- `NodeResourcesExtra`: the node's pod count and the pod's requests of any resource the
  snapshot does not model (extended resources, hugepages, ephemeral storage), as upstream's
  NodeResourcesFit words them.
- `NodeReservation`: a node reserved for a starving pod (see `reservations`) refuses every pod
  that does not outrank that pod.
- `GpuHealth`: a node whose GPUs would fit only by counting unhealthy ones is rejected as
  "GPU unhealthy" (the cache already withholds unhealthy GPUs; this names the reason).
- `TopologyAwareGpus`: GPU selector: a pod asking for several whole GPUs gets the
  best-connected free set of the node (`alnair.common.topology`, the rule the device plugin
  uses too) when the profiler reported the node's topology; otherwise the policy's own choice.
- `GpuUtilization`: prefers nodes whose measured GPU use (from the profiler's pod metrics) leaves
  room, like Alnair's UtilSched: for a fraction, the GPU it would share; for whole GPUs, the
  node's busiest GPU (hot neighbours share PCIe and power).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.common.topology import best_connected
from alnair.scheduler.framework.interface import (
    MAX_NODE_SCORE,
    CycleState,
    GpuSelector,
    NodeVerdicts,
)
from alnair.scheduler.live.cache import TOO_MANY_PODS, LiveSnapshot
from alnair.scheduler.live.pods import (
    LivePod,
    PodAffinityTerm,
    SpreadConstraint,
    node_affinity_matches,
    node_selector_matches,
    untolerated,
)
from alnair.scheduler.live.reservations import REASON as RESERVED_REASON
from alnair.scheduler.snapshot import BoolArray, ClusterSnapshot, FloatArray, IntArray, PodRequest


def _live(snapshot: ClusterSnapshot) -> LiveSnapshot | None:
    return snapshot if isinstance(snapshot, LiveSnapshot) else None


class TaintToleration:
    NAME: ClassVar[str] = "TaintToleration"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        passed = np.ones(nodes.size, dtype=np.bool_)
        if live is None:
            return NodeVerdicts(passed=passed)
        tolerations = pod.tolerations if isinstance(pod, LivePod) else ()
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
    def constraint(self, pod: LivePod) -> Any:
        """The pod's constraint; falsy when it has none (every node passes)."""

    @abstractmethod
    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool: ...

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        constraint = self.constraint(pod) if isinstance(pod, LivePod) else None
        if live is None or not constraint:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        passed = np.array(
            [self.admits(constraint, live.labels[int(n)], live.names[int(n)]) for n in nodes],
            dtype=np.bool_,
        )
        return NodeVerdicts(passed=passed, failures=((self.REASON, ~passed),))


class NodeSelector(_NodeLabelFilter):
    NAME: ClassVar[str] = "NodeSelector"
    REASON: ClassVar[str] = "node selector mismatch"

    def constraint(self, pod: LivePod) -> Any:
        return pod.node_selector

    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool:
        return node_selector_matches(constraint, labels)


class NodeAffinity(_NodeLabelFilter):
    NAME: ClassVar[str] = "NodeAffinity"
    REASON: ClassVar[str] = "node affinity mismatch"

    def constraint(self, pod: LivePod) -> Any:
        return pod.node_affinity

    def admits(self, constraint: Any, labels: Mapping[str, str], name: str) -> bool:
        return node_affinity_matches(constraint, labels, name)


class PreferredNodeAffinity:
    NAME: ClassVar[str] = "PreferredNodeAffinity"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = _live(snapshot)
        preferences = pod.node_preferences if isinstance(pod, LivePod) else ()
        if live is None or not preferences:
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

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        if live is None or not isinstance(pod, LivePod):
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
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
        for holder, node in _placed_with_terms(live, pod):
            for term in holder.pod_anti_affinity:
                value = live.labels[node].get(term.topology_key)
                if value is not None and term.covers(pod.namespace, own):
                    repelled |= _in_domains(live, term.topology_key, {value})
        blocked_anti = repelled[nodes]
        blocked_aff = unmet[nodes] & ~blocked_anti
        return NodeVerdicts(
            passed=~(blocked_anti | blocked_aff),
            failures=(
                ("pod anti-affinity", blocked_anti),
                ("pod affinity not satisfied", blocked_aff),
            ),
        )


Placed = list[tuple[LivePod, dict[str, str], int]]
"""Placed pods with their labels as a dict and their node index (see `_others`)."""


def _domains(live: LiveSnapshot, term: PodAffinityTerm, pods: Placed) -> set[str]:
    """The topology values of the nodes holding a pod that `term` selects."""
    found: set[str] = set()
    for other, labels, node in pods:
        if term.covers(other.namespace, labels):
            value = live.labels[node].get(term.topology_key)
            if value is not None:
                found.add(value)
    return found


def _in_domains(live: LiveSnapshot, key: str, domains: set[str]) -> BoolArray:
    """Per node: does its `key` label hold one of `domains`?"""
    if not domains:
        return np.zeros(len(live.names), dtype=np.bool_)
    return np.array([labels.get(key) in domains for labels in live.labels], dtype=np.bool_)


def _others(live: LiveSnapshot, pod: LivePod) -> Placed:
    """The placed pods other than `pod`, with their labels and node index."""
    return [
        (q, dict(q.labels), placed.node)
        for q, placed in live.placed.values()
        if isinstance(q, LivePod) and q.key != pod.key
    ]


def _placed_with_terms(live: LiveSnapshot, pod: LivePod) -> list[tuple[LivePod, int]]:
    """The placed pods other than `pod` that carry inter-pod terms, with their node index."""
    found = []
    for key, holder in live.pod_termed.items():
        placed = live.placed.get(key)
        if placed is not None and key != pod.key:
            found.append((holder, placed[1].node))
    return found


def _admitted(live: LiveSnapshot, pod: LivePod, constraint: SpreadConstraint) -> BoolArray:
    """Per node: does it count as a domain for `constraint` (its inclusion policies)?"""
    admitted = np.ones(len(live.names), dtype=np.bool_)
    if constraint.honor_node_affinity and (pod.node_selector or pod.node_affinity):
        for n, labels in enumerate(live.labels):
            admitted[n] = pod.accepts_node(labels, live.names[n])
    if constraint.honor_node_taints:
        for n in np.flatnonzero(live.tainted).tolist():
            admitted[n] &= untolerated(pod.tolerations, live.taints[n]) is None
    return admitted


def _spread_counts(
    live: LiveSnapshot,
    pod: LivePod,
    constraint: SpreadConstraint,
    keys: set[str],
    others: Placed,
) -> dict[str, int]:
    """Matching pods (the pod's namespace, the constraint's selector) per domain of the
    constraint's key, over the eligible nodes: those carrying every key in `keys` and admitted
    by the inclusion policies. Every eligible domain is present, with 0 when it has none."""
    admitted = _admitted(live, pod, constraint)
    eligible = [
        admitted[n] and all(k in labels for k in keys) for n, labels in enumerate(live.labels)
    ]
    key = constraint.topology_key
    counts = {live.labels[n][key]: 0 for n, ok in enumerate(eligible) if ok}
    for other, labels, node in others:
        if (
            eligible[node]
            and other.namespace == pod.namespace
            and constraint.selector.matches(labels)
        ):
            counts[live.labels[node][key]] += 1
    return counts


class PodTopologySpread:
    """Topology spread constraints, as upstream: `DoNotSchedule` ones filter (a node whose
    domain would exceed `maxSkew` over the least-loaded eligible domain, or that lacks the
    key), `ScheduleAnyway` ones score (fewer matching pods in the node's domain is better)."""

    NAME: ClassVar[str] = "PodTopologySpread"
    MISSING: ClassVar[str] = "missing topology spread label"
    SKEWED: ClassVar[str] = "topology spread constraint not satisfied"

    @staticmethod
    def _constraints(pod: PodRequest, hard: bool) -> tuple[SpreadConstraint, ...]:
        if not isinstance(pod, LivePod):
            return ()
        return tuple(c for c in pod.spread if c.hard == hard)

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        constraints = self._constraints(pod, hard=True)
        if live is None or not constraints or not isinstance(pod, LivePod):
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        keys = {c.topology_key for c in constraints}
        others = _others(live, pod)
        own = dict(pod.labels)
        missing = np.zeros(nodes.size, dtype=np.bool_)
        skewed = np.zeros(nodes.size, dtype=np.bool_)
        for c in constraints:
            counts = _spread_counts(live, pod, c, keys, others)
            floor = min(counts.values()) if len(counts) >= c.min_domains else 0
            mine = 1 if c.selector.matches(own) else 0
            for k, n in enumerate(nodes.tolist()):
                value = live.labels[n].get(c.topology_key)
                if value is None:
                    missing[k] = True
                elif counts.get(value, 0) + mine - floor > c.max_skew:
                    skewed[k] = True
        skewed &= ~missing
        return NodeVerdicts(
            passed=~(missing | skewed),
            failures=((self.MISSING, missing), (self.SKEWED, skewed)),
        )

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = _live(snapshot)
        constraints = self._constraints(pod, hard=False)
        if live is None or not constraints or not isinstance(pod, LivePod):
            return np.zeros(nodes.size, dtype=np.float64)
        keys = {c.topology_key for c in constraints}
        others = _others(live, pod)
        raw = np.zeros(nodes.size, dtype=np.float64)
        lacking = np.zeros(nodes.size, dtype=np.bool_)
        for c in constraints:
            counts = _spread_counts(live, pod, c, keys, others)
            # More domains make a constraint weigh more (one pod moves its skew less).
            weight = math.log(len(counts) + 2)
            for k, n in enumerate(nodes.tolist()):
                value = live.labels[n].get(c.topology_key)
                if value is None:
                    lacking[k] = True
                else:
                    raw[k] += weight * (counts.get(value, 0) + c.max_skew - 1)
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

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = _live(snapshot)
        zeros = np.zeros(nodes.size, dtype=np.float64)
        if live is None or not isinstance(pod, LivePod):
            return zeros
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
            for other, labels, node in _others(live, pod):
                for weight, term in weighted:
                    if term.covers(other.namespace, labels):
                        add(term, node, weight)
        own = dict(pod.labels)
        for holder, node in _placed_with_terms(live, pod):
            terms = [(float(HARD_POD_AFFINITY_WEIGHT), t) for t in holder.pod_affinity]
            for weight, term in terms + _signed(holder):
                if term.covers(pod.namespace, own):
                    add(term, node, weight)
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


def _signed(pod: LivePod) -> list[tuple[float, PodAffinityTerm]]:
    """The pod's preferred terms with their weights, negative for anti-affinity."""
    return [(float(w), t) for w, t in pod.pod_preferences] + [
        (-float(w), t) for w, t in pod.pod_aversions
    ]


class NodeResourcesExtra:
    """The rest of upstream's NodeResourcesFit that the snapshot's arrays do not cover: the
    node's pod count (`Too many pods`) and every other resource the pod requests, such as RDMA
    devices, MIG slices, hugepages or ephemeral storage (`Insufficient <name>`; a node that
    does not report the resource has none). Without it the kubelet would refuse the pod at
    admission and fail it."""

    NAME: ClassVar[str] = "NodeResourcesExtra"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        if live is None or len(live.pods_cap) != len(live.names):
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        blocked = live.pods_cap[nodes] - live.pods_used[nodes] < 1
        failures: list[tuple[str, BoolArray]] = [(TOO_MANY_PODS, blocked.copy())]
        for name, amount in pod.extra if isinstance(pod, LivePod) else ():
            short = (live.extra_room(name)[nodes] < amount) & ~blocked
            failures.append((f"Insufficient {name}", short))
            blocked |= short
        return NodeVerdicts(passed=~blocked, failures=tuple(failures))


class NodeReservation:
    NAME: ClassVar[str] = "NodeReservation"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        if live is None or not live.reserved:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        refused = np.zeros(len(live.names), dtype=np.bool_)
        for name, holder in live.reserved.items():
            if name in live._index and not holder.admits(pod):
                refused[live.node_index(name)] = True
        blocked = refused[nodes]
        return NodeVerdicts(passed=~blocked, failures=((RESERVED_REASON, blocked),))


class GpuHealth:
    NAME: ClassVar[str] = "GpuHealth"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = _live(snapshot)
        if live is None or pod.num_gpu == 0 or not live.unhealthy.any():
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        healthy_fit = (live.gpu_free[nodes] >= pod.gpu_milli).sum(axis=1)
        with_sick = (live.gpu_free[nodes] + live.withheld[nodes] >= pod.gpu_milli).sum(axis=1)
        sick = (healthy_fit < pod.num_gpu) & (with_sick >= pod.num_gpu)
        return NodeVerdicts(passed=~sick, failures=(("GPU unhealthy", sick),))


class GpuUtilization:
    """Score: 100 for idle GPUs down to 0 for saturated ones (measured, not requested)."""

    NAME: ClassVar[str] = "GpuUtilization"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = _live(snapshot)
        if live is None or pod.num_gpu == 0:
            return np.zeros(nodes.size, dtype=np.float64)
        util = live.gpu_util[nodes]
        if pod.is_fractional:
            fits = live.gpu_free[nodes] >= pod.gpu_milli
            busy = np.where(fits, util, np.inf).min(axis=1)
            busy = np.where(np.isfinite(busy), busy, 100.0)
        else:
            busy = util.max(axis=1)
        scores: FloatArray = np.clip(100.0 - busy, 0.0, 100.0)
        return scores


class TopologyAwareGpus:
    NAME: ClassVar[str] = "TopologyAwareGpus"

    def __init__(self, base: GpuSelector) -> None:
        self.base = base

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        live = _live(snapshot)
        topology = live.topology.get(live.names[node]) if live is not None else None
        if live is None or not topology or pod.is_fractional or pod.num_gpu < 2:
            return self.base.select_gpus(pod, snapshot, state, node)
        count = int(live.gpu_count[node])
        free = np.flatnonzero(live.gpu_free[node, :count] == MILLI_PER_GPU).tolist()
        if len(free) < pod.num_gpu:
            return None
        return tuple(sorted(best_connected(free, pod.num_gpu, topology)))
