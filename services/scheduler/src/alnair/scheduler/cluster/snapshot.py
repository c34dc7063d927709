"""The cluster snapshot every scheduling plugin reads: nodes, their GPUs, and what is placed.

The live binder and the trace simulator both schedule against this one type, so the plugins
never know which of the two is driving them. It is column-oriented (one numpy array per
quantity, one row per node) because policies such as FGD score every node for every pod: with
rows of Python objects a 1,213-node replay of 10,000 pods would take minutes, with columns it
takes seconds.

Units are the trace's and the device plugin's: CPU in milli-cores, memory in MiB, GPU in
milli-GPU per device (1000 is one whole GPU). A node's GPUs are the columns `0..gpu_count-1` of
`gpu_free`; columns past `gpu_count` hold 0 so that they never fit a request.

Mutation is confined to `assume` and `forget` (the scheduler-cache verbs of upstream
Kubernetes): a plugin gets the snapshot read-only and returns a status or scores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.common.resources import MILLI_PER_GPU
from alnair.common.topology import Topology
from alnair.scheduler.cluster.requests import (
    MAX_GPUS_PER_NODE,
    TOO_MANY_PODS,
    UNLIMITED,
    BoolArray,
    FloatArray,
    IntArray,
    NodeSpec,
    Placement,
    PodRequest,
)
from alnair.scheduler.cluster.terms import PodAffinityTerm

MAX_LABEL_VERDICTS = 256
"""Node-label verdicts a snapshot keeps (`ClusterSnapshot.judged`); past it they are dropped."""

LabelGroup = tuple[str, tuple[tuple[str, str], ...]]
"""(namespace, labels): placed pods that every selector sees alike."""
TermGroup = tuple[
    tuple[PodAffinityTerm, ...],
    tuple[PodAffinityTerm, ...],
    tuple[tuple[int, PodAffinityTerm], ...],
    tuple[tuple[int, PodAffinityTerm], ...],
]
"""A placed pod's inter-pod terms: required affinity, required anti-affinity, preferred
affinity and preferred anti-affinity (namespaces resolved, so the terms alone decide)."""

if TYPE_CHECKING:
    from alnair.scheduler.cluster.books import GangBook, Nominations, Reservations
    from alnair.scheduler.cluster.budgets import DisruptionBudgets


@dataclass(slots=True)
class ClusterSnapshot:
    """Columns of node state plus the placements that produced it.

    Build one with `ClusterSnapshot.build`; read the arrays freely; change it only through
    `assume` and `forget`.
    """

    names: list[str]
    models: list[str]
    """Distinct GPU model names; `model_id` indexes into it ("" for GPU-less nodes)."""
    model_id: IntArray
    cpu_cap: IntArray
    mem_cap: IntArray
    gpu_count: IntArray
    cpu_free: IntArray
    mem_free: IntArray
    gpu_free: IntArray
    """Shape (nodes, MAX width): free milli-GPU per device; 0 beyond `gpu_count`."""
    affinity: IntArray
    """Shape (nodes, MAX_GPUS_PER_NODE + 1): pods placed per kind (see AFFINITY_SHARE)."""
    generation: IntArray
    """Bumped on a node whenever assume/forget changes it, so derived data can be cached."""
    placed: dict[str, tuple[PodRequest, Placement]] = field(default_factory=dict)
    memo: dict[str, object] = field(default_factory=dict)
    """Per-node data that plugins derive from this snapshot (checked against `generation`)."""
    _index: dict[str, int] = field(default_factory=dict)

    # What a live cluster has, and a trace may: `build` fills neutral values (no labels, no
    # taints, healthy idle GPUs, unlimited pod count), so the plugins reading them skip at once.
    labels: list[dict[str, str]] = field(default_factory=list)
    """Per node; change one with `set_labels` (the domain codes derived from them follow)."""
    taints: list[tuple[Obj, ...]] = field(default_factory=list)
    """Blocking (NoSchedule/NoExecute) taints per node."""
    tainted: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    """Nodes with at least one blocking taint (so filters visit only those)."""
    unhealthy: BoolArray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.bool_))
    withheld: IntArray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.int64))
    """Free milli-GPU of unhealthy GPUs, parked here so that no plugin places on them."""
    gpu_util: FloatArray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.float64))
    """Measured GPU use in percent (the profiler's pod metrics)."""
    topology: dict[str, Topology] = field(default_factory=dict)
    """Node name -> its GPU link matrix (shared with the owner, not copied)."""
    pods_cap: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Allocatable pod count per node (`UNLIMITED` when the node reports none)."""
    pods_used: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    extra_cap: dict[str, IntArray] = field(default_factory=dict)
    """Allocatable of every other resource a node reports (extended resources such as RDMA
    devices or MIG slices, hugepages, ephemeral storage), per node; 0 where a node has none."""
    extra_used: dict[str, IntArray] = field(default_factory=dict)
    pod_termed: dict[str, PodRequest] = field(default_factory=dict)
    """Placed pods with inter-pod terms, by key, so pods without terms cost nothing."""
    label_groups: dict[LabelGroup, dict[int, int]] = field(default_factory=dict)
    """Placed pods per (namespace, labels), counted per node: a selector is matched once per
    group, not once per pod (thousands of replicas share a handful of label sets)."""
    term_groups: dict[TermGroup, tuple[PodRequest, dict[int, int]]] = field(default_factory=dict)
    """Placed pods with inter-pod terms per set of terms: one holder speaks for its group,
    with the group's pods counted per node."""
    domain_codes: dict[str, tuple[IntArray, list[str]]] = field(default_factory=dict)
    """Label key -> per node the index of its value in the list (-1: no such label), made on
    first use by `domains` and dropped when a node's labels change (shared by copies, as the
    labels are)."""
    label_verdicts: dict[object, BoolArray] = field(default_factory=dict)
    """A node-label test (a node selector, a required node affinity) -> its verdict on every
    node, made on first use by `judged` and dropped, like `domain_codes`, when a node's labels
    change: pods of one Deployment or Job ask the same question of the same nodes."""
    gang_placed: dict[str, int] = field(default_factory=dict)
    """Gang -> how many of its members are placed (assumed or bound)."""
    reservations: Reservations | None = None
    """Nodes held for starving or preempting pods (the owner's object, shared)."""
    gangs: GangBook | None = None
    """The PodGroups and their pending members (the owner's object, shared)."""
    budgets: DisruptionBudgets | None = None
    """PodDisruptionBudgets that preemption respects (live only; shared)."""
    nominations: Nominations | None = None
    """Preemptors waiting for their victims to go, and the victims being deleted (live only;
    the owner's object, shared)."""
    sharers: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    """(node, GPU) -> the fractional pods placed there (key -> workload, "" when unknown):
    which workloads share each GPU, for co-location interference."""

    @classmethod
    def build(
        cls,
        nodes: Sequence[NodeSpec],
        placed: Iterable[tuple[PodRequest, Placement]] = (),
    ) -> ClusterSnapshot:
        """A snapshot of `nodes` with the given placements already applied."""
        names = [n.name for n in nodes]
        index = {name: i for i, name in enumerate(names)}
        if len(index) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise InvalidValueError("nodes", dupes[:5], "node names must be unique")
        models = sorted({n.gpu_model for n in nodes} | {""})
        model_index = {m: i for i, m in enumerate(models)}
        width = max([n.gpu_count for n in nodes] + [1])
        count = np.array([n.gpu_count for n in nodes], dtype=np.int64)
        gpu_free = np.where(np.arange(width)[None, :] < count[:, None], MILLI_PER_GPU, 0).astype(
            np.int64
        )
        snap = cls(
            names=names,
            models=models,
            model_id=np.array([model_index[n.gpu_model] for n in nodes], dtype=np.int64),
            cpu_cap=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            mem_cap=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            gpu_count=count,
            cpu_free=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            mem_free=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            gpu_free=gpu_free,
            affinity=np.zeros((len(nodes), MAX_GPUS_PER_NODE + 1), dtype=np.int64),
            generation=np.zeros(len(nodes), dtype=np.int64),
            _index=index,
            labels=[dict(n.labels) for n in nodes],
            taints=[() for _ in nodes],
            tainted=np.zeros(len(nodes), dtype=np.bool_),
            unhealthy=np.zeros((len(nodes), width), dtype=np.bool_),
            withheld=np.zeros((len(nodes), width), dtype=np.int64),
            gpu_util=np.zeros((len(nodes), width), dtype=np.float64),
            pods_cap=np.full(len(nodes), UNLIMITED, dtype=np.int64),
            pods_used=np.zeros(len(nodes), dtype=np.int64),
        )
        for pod, placement in placed:
            snap.assume(pod, placement)
        return snap

    def __len__(self) -> int:
        return len(self.names)

    def node_index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise InvalidValueError("node", name, "not in the snapshot") from None

    def copy(self) -> ClusterSnapshot:
        """An independent snapshot (for what-if evaluation); node facts are shared."""
        return ClusterSnapshot(
            names=self.names,
            models=self.models,
            model_id=self.model_id,
            cpu_cap=self.cpu_cap,
            mem_cap=self.mem_cap,
            gpu_count=self.gpu_count,
            cpu_free=self.cpu_free.copy(),
            mem_free=self.mem_free.copy(),
            gpu_free=self.gpu_free.copy(),
            affinity=self.affinity.copy(),
            generation=self.generation.copy(),
            placed=dict(self.placed),
            _index=self._index,
            labels=self.labels,
            domain_codes=self.domain_codes,
            label_verdicts=self.label_verdicts,
            taints=self.taints,
            tainted=self.tainted,
            unhealthy=self.unhealthy,
            withheld=self.withheld.copy(),
            gpu_util=self.gpu_util,
            topology=self.topology,
            pods_cap=self.pods_cap,
            pods_used=self.pods_used.copy(),
            extra_cap=self.extra_cap,
            extra_used={name: used.copy() for name, used in self.extra_used.items()},
            pod_termed=dict(self.pod_termed),
            label_groups={k: dict(v) for k, v in self.label_groups.items()},
            term_groups={k: (h, dict(v)) for k, (h, v) in self.term_groups.items()},
            gang_placed=dict(self.gang_placed),
            reservations=self.reservations,
            gangs=self.gangs,
            budgets=self.budgets,
            nominations=self.nominations,
            sharers={gpu: dict(pods) for gpu, pods in self.sharers.items()},
        )

    def domains(self, key: str) -> tuple[IntArray, list[str]]:
        """The topology domains of label `key`: per node the index of its value in the list
        returned beside it, -1 where the node lacks the label."""
        found = self.domain_codes.get(key)
        if found is None:
            values: dict[str, int] = {}
            codes = np.array(
                [
                    -1 if (v := labels.get(key)) is None else values.setdefault(v, len(values))
                    for labels in self.labels
                ],
                dtype=np.int64,
            )
            found = self.domain_codes[key] = (codes, list(values))
        return found

    def judged(self, key: object, admits: Callable[[dict[str, str], str], bool]) -> BoolArray:
        """Per node, `admits(labels, name)`, remembered under `key` (which must name the test
        completely) until a node's labels change. At most `MAX_LABEL_VERDICTS` are kept."""
        found = self.label_verdicts.get(key)
        if found is None:
            if len(self.label_verdicts) >= MAX_LABEL_VERDICTS:
                self.label_verdicts.clear()
            pairs = zip(self.labels, self.names, strict=True)
            found = np.array([admits(labels, name) for labels, name in pairs], dtype=np.bool_)
            self.label_verdicts[key] = found
        return found

    def set_labels(self, n: int, labels: dict[str, str]) -> None:
        """Node `n` now carries `labels`."""
        self.labels[n] = labels
        self.domain_codes.clear()
        self.label_verdicts.clear()

    def model_mask(self, allowed: frozenset[str]) -> BoolArray:
        """Nodes whose GPU model is in `allowed` (every node when `allowed` is empty)."""
        if not allowed:
            return np.ones(len(self.names), dtype=np.bool_)
        ids = [i for i, m in enumerate(self.models) if m and m in allowed]
        return np.isin(self.model_id, np.array(ids, dtype=np.int64))

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI_PER_GPU

    @property
    def gpu_allocated_milli(self) -> int:
        return self.gpu_capacity_milli - int(self.gpu_free.sum())

    def fits(self, pod: PodRequest, placement: Placement) -> str | None:
        """Why `placement` cannot hold `pod` on this snapshot, or None when it can."""
        n = placement.node
        if not 0 <= n < len(self.names):
            return f"no node index {n}"
        if self.cpu_free[n] < pod.cpu_milli:
            return "insufficient cpu"
        if self.mem_free[n] < pod.memory_mib:
            return "insufficient memory"
        if len(placement.gpu_indices) != pod.num_gpu:
            return f"{len(placement.gpu_indices)} GPUs chosen for a {pod.num_gpu}-GPU pod"
        if len(set(placement.gpu_indices)) != len(placement.gpu_indices):
            return "a GPU chosen twice"
        for g in placement.gpu_indices:
            if not 0 <= g < self.gpu_count[n]:
                return f"no GPU {g} on node {self.names[n]}"
            if self.gpu_free[n, g] < pod.gpu_milli:
                return f"insufficient milli-GPU on GPU {g}"
        if pod.gpu_models and pod.num_gpu and self.models[self.model_id[n]] not in pod.gpu_models:
            return "GPU model not allowed"
        if n >= len(self.pods_cap):
            return None
        return self.extra_shortfall(pod, n)

    def extra_shortfall(
        self, pod: PodRequest, n: int, freed: Sequence[PodRequest] = ()
    ) -> str | None:
        """The pod count or other resource `pod` lacks on node `n` (after `freed` leave)."""
        if self.pods_used[n] - len(freed) + 1 > self.pods_cap[n]:
            return TOO_MANY_PODS
        for name, amount in pod.extra:
            room = int(self.extra_room(name)[n])
            room += sum(dict(q.extra).get(name, 0) for q in freed)
            if room < amount:
                return f"Insufficient {name}"
        return None

    def extra_room(self, name: str) -> IntArray:
        """Per node: how much of resource `name` is left (0 where a node reports none)."""
        cap = self.extra_cap.get(name)
        if cap is None:
            return np.zeros(len(self.names), dtype=np.int64)
        used = self.extra_used.get(name)
        room: IntArray = cap if used is None else cap - used
        return room

    def count(self, pod: PodRequest, n: int, sign: int) -> None:
        """Add (`sign` 1) or take back (-1) what `pod` holds beyond the columns: the pod
        count, other resources, its inter-pod terms and its gang membership."""
        if 0 <= n < len(self.pods_used):
            self.pods_used[n] += sign
            for name, amount in pod.extra:
                used = self.extra_used.get(name)
                if used is None:
                    used = self.extra_used[name] = np.zeros(len(self.names), dtype=np.int64)
                used[n] += sign * amount
        if pod.has_pod_terms:
            if sign > 0:
                self.pod_termed[pod.key] = pod
            else:
                self.pod_termed.pop(pod.key, None)
        self._group(pod, n, sign)
        if pod.gang:
            left = self.gang_placed.get(pod.gang, 0) + sign
            if left > 0:
                self.gang_placed[pod.gang] = left
            else:
                self.gang_placed.pop(pod.gang, None)

    def _group(self, pod: PodRequest, n: int, sign: int) -> None:
        """Count `pod` in (1) or out of (-1) its label group and, with terms, its term group."""
        group = (pod.namespace, pod.labels)
        nodes = self.label_groups.get(group) or {}
        if tally(nodes, n, sign):
            self.label_groups[group] = nodes
        else:
            self.label_groups.pop(group, None)
        if pod.has_pod_terms:
            terms = term_group(pod)
            holder, held = self.term_groups.get(terms) or (pod, {})
            if tally(held, n, sign):
                self.term_groups[terms] = (holder, held)
            else:
                self.term_groups.pop(terms, None)

    def relabel(self, pod: PodRequest) -> None:
        """Replace a placed pod's request by `pod` (same key and placement, new labels)."""
        old, placement = self.placed[pod.key]
        self._group(old, placement.node, -1)
        self.placed[pod.key] = (pod, placement)
        if pod.key in self.pod_termed:
            self.pod_termed[pod.key] = pod
        self._group(pod, placement.node, 1)
        if pod.is_fractional:
            for g in placement.gpu_indices:
                self.sharers.setdefault((placement.node, g), {})[pod.key] = pod.workload

    def assume(self, pod: PodRequest, placement: Placement) -> None:
        """Account `pod` on its placement (before the bind completes, as upstream does)."""
        if pod.key in self.placed:
            raise InvalidValueError("pod", pod.key, "already placed in the snapshot")
        problem = self.fits(pod, placement)
        if problem is not None:
            raise InvalidValueError(
                "placement", placement, f"pod {pod.key} does not fit: {problem}"
            )
        n = placement.node
        self.cpu_free[n] -= pod.cpu_milli
        self.mem_free[n] -= pod.memory_mib
        for g in placement.gpu_indices:
            self.gpu_free[n, g] -= pod.gpu_milli
        column = pod.affinity_column
        if column is not None:
            self.affinity[n, column] += 1
        self.generation[n] += 1
        self.placed[pod.key] = (pod, placement)
        self.count(pod, n, 1)
        if pod.is_fractional:
            for g in placement.gpu_indices:
                self.sharers.setdefault((n, g), {})[pod.key] = pod.workload

    def forget(self, key: str) -> tuple[PodRequest, Placement]:
        """Undo `assume` (a failed bind, or a pod that left); returns what was removed."""
        try:
            pod, placement = self.placed.pop(key)
        except KeyError:
            raise InvalidValueError("pod", key, "not placed in the snapshot") from None
        n = placement.node
        self.cpu_free[n] += pod.cpu_milli
        self.mem_free[n] += pod.memory_mib
        for g in placement.gpu_indices:
            self.gpu_free[n, g] += pod.gpu_milli
        column = pod.affinity_column
        if column is not None:
            self.affinity[n, column] -= 1
        self.generation[n] += 1
        self.count(pod, n, -1)
        if pod.is_fractional:
            for g in placement.gpu_indices:
                held = self.sharers.get((n, g))
                if held is not None:
                    held.pop(key, None)
                    if not held:
                        del self.sharers[(n, g)]
        return pod, placement


def term_group(pod: PodRequest) -> TermGroup:
    """The key of `pod`'s term group (see `ClusterSnapshot.term_groups`)."""
    return (pod.pod_affinity, pod.pod_anti_affinity, pod.pod_preferences, pod.pod_aversions)


def tally(nodes: dict[int, int], n: int, sign: int) -> int:
    """Add `sign` to node `n`'s count in `nodes` (dropping a count that reaches 0); returns
    how many nodes still count."""
    left = nodes.get(n, 0) + sign
    if left > 0:
        nodes[n] = left
    else:
        nodes.pop(n, None)
    return len(nodes)
