"""What a pod asks and a node offers, and where a pod goes: the values every placement
plugin, the snapshot and the books share (`PodRequest`, `NodeSpec`, `Placement`, and the
array types and limits of the snapshot's columns).

Units are the trace's and the device plugin's: CPU in milli-cores, memory in MiB, GPU in
milli-GPU per device (1000 is one whole GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from alnair.common.errors import InvalidValueError
from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.terms import (
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
    node_affinity_matches,
    node_selector_matches,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

MAX_GPUS_PER_NODE = 16
"""Widest node the snapshot holds; wider nodes are rejected with a clear error."""

# Column of `ClusterSnapshot.affinity` for each pod kind (GpuClustering counts pods per kind).
AFFINITY_SHARE = 0
"""Column for fractional-GPU pods; column n (1..MAX_GPUS_PER_NODE) counts n-whole-GPU pods."""

UNLIMITED = 1 << 40
"""Pod count of a node that reports no `pods` allocatable (every trace node)."""
TOO_MANY_PODS = "Too many pods"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as the scheduler sees it: capacity and GPU model (no usage)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise InvalidValueError("cpu_milli", self.cpu_milli, f"node {self.name} negative")
        if self.memory_mib < 0:
            raise InvalidValueError("memory_mib", self.memory_mib, f"node {self.name} negative")
        if not 0 <= self.gpu_count <= MAX_GPUS_PER_NODE:
            raise InvalidValueError(
                "gpu_count", self.gpu_count, f"node {self.name}: must be 0..{MAX_GPUS_PER_NODE}"
            )


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for, in scheduler units.

    `gpu_milli` is per GPU: a fractional pod has `num_gpu == 1` and `gpu_milli < 1000`; a
    whole-GPU pod has `gpu_milli == 1000`. `gpu_models` lists the acceptable GPU models (empty
    means any), which is the trace's `gpu_spec` and the `alnair.io/gpu-model` request.

    The rest is what a live pod (or a trace that has it) adds: priority, gang, and the placement
    constraints (`alnair.scheduler.cluster.terms`); their defaults mean "none", so a pod from a
    trace that has none costs the constraint plugins nothing.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()
    namespace: str = "default"
    uid: str = ""
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
    workload: str = ""
    """What the pod trains, `model@batch` (`alnair.common.colocation.workload_key`) from its
    model annotations; "" when it does not say. Co-location interference is looked up by it."""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise InvalidValueError("cpu_milli", self.cpu_milli, f"pod {self.name} negative")
        if self.memory_mib < 0:
            raise InvalidValueError("memory_mib", self.memory_mib, f"pod {self.name} negative")
        if self.num_gpu < 0 or self.num_gpu > MAX_GPUS_PER_NODE:
            raise InvalidValueError(
                "num_gpu", self.num_gpu, f"pod {self.name}: must be 0..{MAX_GPUS_PER_NODE}"
            )
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise InvalidValueError("gpu_milli", self.gpu_milli, f"pod {self.name} has no GPU")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidValueError(
                "gpu_milli", self.gpu_milli, f"pod {self.name}: must be 1..{MILLI_PER_GPU}"
            )
        if self.num_gpu > 1 and self.gpu_milli < MILLI_PER_GPU:
            raise InvalidValueError(
                "gpu_milli",
                self.gpu_milli,
                f"pod {self.name}: a fraction is only allowed on a single GPU",
            )

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

    @property
    def key(self) -> str:
        """Identity used by assume/forget: the uid when known, else namespace/name."""
        return self.uid or f"{self.namespace}/{self.name}"

    @property
    def is_fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def total_milli_gpu(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def affinity_column(self) -> int | None:
        """Column of `ClusterSnapshot.affinity` this pod counts in (None: no GPU)."""
        if self.num_gpu == 0:
            return None
        return AFFINITY_SHARE if self.is_fractional else self.num_gpu


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod goes: the node and the GPUs, with the milli-GPU granted on each."""

    node: int
    node_name: str
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0

    def annotation_indices(self) -> str:
        """Value of the `alnair.io/gpu-indices` pod annotation."""
        return ",".join(str(i) for i in self.gpu_indices)
