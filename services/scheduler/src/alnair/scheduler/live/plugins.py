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
  affinity term matches itself may go anywhere. Preferred terms are not scored.
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
from alnair.scheduler.live.cache import LiveSnapshot
from alnair.scheduler.live.pods import LivePod, PodAffinityTerm, node_affinity_matches
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
            for taint in live.taints[int(nodes[k])]:
                if not any(t.tolerates(taint) for t in tolerations):
                    passed[k] = False
                    not_ready[k] = taint.get("key", "").startswith("node.kubernetes.io/")
                    break
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
        return all(labels.get(k) == v for k, v in constraint)


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
        if not (pod.pod_affinity or pod.pod_anti_affinity or live.repellers):
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        own = dict(pod.labels)
        unmet = np.zeros(len(live.names), dtype=np.bool_)
        repelled = np.zeros(len(live.names), dtype=np.bool_)
        if pod.pod_affinity or pod.pod_anti_affinity:
            others = [
                (q.namespace, dict(q.labels), p.node)
                for q, p in live.placed.values()
                if isinstance(q, LivePod) and q.key != pod.key
            ]
            for term in pod.pod_affinity:
                domains = _domains(live, term, others)
                if not domains and term.covers(pod.namespace, own):
                    continue  # the first pod of its group
                unmet |= ~_in_domains(live, term.topology_key, domains)
            for term in pod.pod_anti_affinity:
                repelled |= _in_domains(live, term.topology_key, _domains(live, term, others))
        for key, holder in live.repellers.items():
            placed = live.placed.get(key)
            if placed is None or key == pod.key:
                continue
            for term in holder.pod_anti_affinity:
                value = live.labels[placed[1].node].get(term.topology_key)
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


def _domains(
    live: LiveSnapshot, term: PodAffinityTerm, pods: list[tuple[str, dict[str, str], int]]
) -> set[str]:
    """The topology values of the nodes holding a pod that `term` selects."""
    found: set[str] = set()
    for namespace, labels, node in pods:
        if term.covers(namespace, labels):
            value = live.labels[node].get(term.topology_key)
            if value is not None:
                found.add(value)
    return found


def _in_domains(live: LiveSnapshot, key: str, domains: set[str]) -> BoolArray:
    """Per node: does its `key` label hold one of `domains`?"""
    if not domains:
        return np.zeros(len(live.names), dtype=np.bool_)
    return np.array([labels.get(key) in domains for labels in live.labels], dtype=np.bool_)


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
