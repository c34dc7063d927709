"""GPU fragmentation as defined by FGD (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23).

Typical pods: the most popular pod shapes (CPU, per-GPU milli-GPU, GPU count, allowed GPU
models), taken in decreasing popularity until they cover 95% of the workload's pods, with their
popularity renormalised to sum to 1. CPU-only shapes are included.

Fragmentation of a node measured by one typical pod m, F_n(m), is the free milli-GPU on the
node that m cannot use:
- m needs no GPU, m's GPU model is not on the node, m's GPU count or CPU does not fit: all of
  the node's free GPU is fragment for m;
- m fits: the free milli-GPU on the node's GPUs that each have less than m's per-GPU request.
The node's fragmentation is the expectation over typical pods, F_n = sum_m p_m F_n(m). FGD
places a pod where (node, GPU) grows F_n least. That rule keeps the paper's definitions exactly
(including counting all free GPU as fragment for CPU-only typical pods), so the baseline
reproduces the paper's simulator.

Evaluation is vectorised: per node we keep, for each distinct per-GPU threshold u of the typical
pods, how many GPUs have at least u free (`fit`) and how much free milli-GPU lies on GPUs below
u (`below`). A placement changes one GPU (a fraction) or takes whole free GPUs, so the
fragmentation after every candidate placement follows from those counts in a few array
operations instead of one Python loop per node, GPU and typical pod.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.requests import BoolArray, FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot

DEFAULT_COVERAGE = 0.95
"""Share of pods the typical shapes must cover (the paper's setting)."""

NONZERO_CPU_MILLI = 100
"""CPU a pod without a CPU request is charged when scoring (upstream's non-zero default)."""


def effective_cpu(cpu_milli: int) -> int:
    return cpu_milli if cpu_milli > 0 else NONZERO_CPU_MILLI


ShapeKey = tuple[int, int, int, frozenset[str]]


@dataclass(frozen=True)
class TypicalPods:
    """The typical pod shapes of a workload and their popularity.

    A shape is (CPU, per-GPU milli-GPU, GPU count, allowed models), as in the paper. When
    `with_memory` is set each shape also carries a memory request and only counts as fitting
    a node where that memory fits too; FGD leaves memory out. The memory is a quantile of the
    requests of every pod with the shape's CPU and GPUs, whatever models they name: naming a
    model does not change what a pod asks of memory, and where many pods name models the
    shapes split into many small ones whose own quantiles are drawn from few pods (with half
    the GPU pods naming models, per-list quantiles left alnair 0.03 points below FGD at 100%
    demand; pooled, 0.01 above: docs/notes/issue-28.md).
    """

    cpu: IntArray
    memory: IntArray
    gpu_milli: IntArray
    num_gpu: IntArray
    models: tuple[frozenset[str], ...]
    prob: FloatArray
    coverage: float
    with_memory: bool = False
    _access: dict[tuple[str, ...], BoolArray] = field(default_factory=dict, compare=False)

    @classmethod
    def from_pods(
        cls,
        pods: Iterable[PodRequest],
        coverage: float = DEFAULT_COVERAGE,
        *,
        memory_quantile: float | None = None,
    ) -> TypicalPods:
        """Shapes by decreasing popularity until `coverage` of the pods is reached.

        `memory_quantile` (0-1) attaches that quantile of each shape's memory requests.
        """
        counts: Counter[ShapeKey] = Counter()
        memory: dict[tuple[int, int, int], list[int]] = {}
        for pod in pods:
            key = (effective_cpu(pod.cpu_milli), pod.gpu_milli, pod.num_gpu, pod.gpu_models)
            counts[key] += 1
            memory.setdefault(key[:3], []).append(pod.memory_mib)
        total = sum(counts.values())
        # Most popular first; equal counts ordered by shape so the choice is deterministic.
        ranked = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], -kv[0][0], -kv[0][1], -kv[0][2], sorted(kv[0][3])),
        )
        chosen: list[tuple[ShapeKey, int]] = []
        covered = 0
        for key, count in ranked:
            if covered >= coverage * total:
                break
            chosen.append((key, count))
            covered += count
        weights = np.array([c for _, c in chosen], dtype=np.float64)
        q = 0.0 if memory_quantile is None else memory_quantile
        return cls(
            cpu=np.array([k[0] for k, _ in chosen], dtype=np.int64),
            memory=np.array(
                [
                    int(np.quantile(memory[k[:3]], q)) if memory_quantile is not None else 0
                    for k, _ in chosen
                ],
                dtype=np.int64,
            ),
            gpu_milli=np.array([k[1] for k, _ in chosen], dtype=np.int64),
            num_gpu=np.array([k[2] for k, _ in chosen], dtype=np.int64),
            models=tuple(k[3] for k, _ in chosen),
            prob=weights / weights.sum() if chosen else weights,
            coverage=covered / total if total else 0.0,
            with_memory=memory_quantile is not None,
        )

    def __len__(self) -> int:
        return int(self.prob.size)

    def access(self, snapshot: ClusterSnapshot) -> BoolArray:
        """Matrix (snapshot model id, shape): may the shape use GPUs of that model."""
        key = tuple(snapshot.models)
        found = self._access.get(key)
        if found is None:
            found = np.zeros((len(key), len(self)), dtype=np.bool_)
            for m, model in enumerate(key):
                for t, allowed in enumerate(self.models):
                    found[m, t] = bool(model) and (not allowed or model in allowed)
            self._access[key] = found
        return found


@dataclass
class NodeStats:
    """Per-node counts from which fragmentation follows (see the module docstring)."""

    generation: IntArray
    fit: IntArray
    below: IntArray
    left: IntArray
    frag: FloatArray


class FragmentationModel:
    """F_n for many node states at once, for one set of typical pods."""

    def __init__(self, typical: TypicalPods) -> None:
        self.typical = typical
        gpu = typical.num_gpu > 0
        self.p_cpu_only = float(typical.prob[~gpu].sum())
        self.gpu_shapes = np.flatnonzero(gpu)
        self.thresholds = np.unique(typical.gpu_milli[gpu]).astype(np.int64)
        self.shape_threshold = np.searchsorted(self.thresholds, typical.gpu_milli[gpu])
        self.shape_num = typical.num_gpu[gpu]
        self.shape_cpu = typical.cpu[gpu]
        self.shape_mem = typical.memory[gpu]
        self.shape_prob = typical.prob[gpu]
        # Every threshold is at most one GPU, so a whole free GPU always counts as fitting.
        if self.thresholds.size and int(self.thresholds.max()) > MILLI_PER_GPU:
            raise ValueError("typical per-GPU request above one GPU")

    def counts(self, gpu_free: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """(fit, below, left) for rows of per-GPU free milli-GPU."""
        g = gpu_free[:, :, None]
        at_least = g >= self.thresholds[None, None, :]
        fit = at_least.sum(axis=1)
        below = np.where(at_least, 0, g).sum(axis=1)
        return fit, below, gpu_free.sum(axis=1)

    def fragmentation(
        self,
        fit: IntArray,
        below: IntArray,
        left: IntArray,
        cpu_free: IntArray,
        mem_free: IntArray,
        access: BoolArray,
    ) -> FloatArray:
        """Expected unusable milli-GPU per row.

        `access` is (rows, gpu shapes): whether each row's GPU model admits each shape.
        """
        t = self.shape_threshold
        ok = access & (fit[:, t] >= self.shape_num) & (cpu_free[:, None] >= self.shape_cpu)
        if self.typical.with_memory:
            ok &= mem_free[:, None] >= self.shape_mem
        per_shape = np.where(ok, below[:, t], left[:, None])
        return self.p_cpu_only * left + per_shape @ self.shape_prob

    def row_access(self, snapshot: ClusterSnapshot, nodes: IntArray) -> BoolArray:
        return self.typical.access(snapshot)[snapshot.model_id[nodes]][:, self.gpu_shapes]

    def node_stats(self, snapshot: ClusterSnapshot, memo_key: str) -> NodeStats:
        """Counts and fragmentation of every node, recomputed only where nodes changed."""
        found = snapshot.memo.get(memo_key)
        if isinstance(found, NodeStats):
            stale = np.flatnonzero(found.generation != snapshot.generation)
            if stale.size == 0:
                return found
        else:
            found = None
            stale = np.arange(len(snapshot), dtype=np.int64)
        fit, below, left = self.counts(snapshot.gpu_free[stale])
        frag = self.fragmentation(
            fit,
            below,
            left,
            snapshot.cpu_free[stale],
            snapshot.mem_free[stale],
            self.row_access(snapshot, stale),
        )
        if found is None:
            found = NodeStats(snapshot.generation.copy(), fit, below, left, frag)
            snapshot.memo[memo_key] = found
        else:
            found.fit[stale] = fit
            found.below[stale] = below
            found.left[stale] = left
            found.frag[stale] = frag
            found.generation[stale] = snapshot.generation[stale]
        return found


@dataclass(frozen=True)
class Candidates:
    """Every (node, GPU choice) a pod could take, with the fragmentation change of each.

    For a fractional pod there is one candidate per fitting GPU; otherwise one per node with
    `gpu` = -1 (whole GPUs are the lowest-index free ones, which fragmentation does not see).
    """

    node_pos: IntArray
    """Position in the `nodes` array given to `candidates`."""
    gpu: IntArray
    delta: FloatArray
    """F_after - F_before (negative: the placement reduces fragmentation)."""
    frag_after: FloatArray
    left_after: IntArray


def candidates(
    model: FragmentationModel,
    stats: NodeStats,
    pod: PodRequest,
    snapshot: ClusterSnapshot,
    nodes: IntArray,
) -> Candidates:
    """The fragmentation change of every way to place `pod` on `nodes`."""
    cpu = effective_cpu(pod.cpu_milli)
    thresholds = model.thresholds[None, :]
    if pod.is_fractional:
        free = snapshot.gpu_free[nodes]
        # GPUs of one node with the same free share are the same placement as far as
        # fragmentation can tell: keep the lowest index of each (what a tie picks anyway), which
        # cuts the candidates several-fold on a cluster of idle 8-GPU nodes.
        width = free.shape[1]
        earlier = np.tril(np.ones((width, width), dtype=np.bool_), k=-1)
        repeat = ((free[:, :, None] == free[:, None, :]) & earlier[None, :, :]).any(axis=2)
        pos, gpu = np.nonzero((free >= pod.gpu_milli) & ~repeat)
        rows = nodes[pos]
        before = free[pos, gpu][:, None]
        after = before - pod.gpu_milli
        fit = stats.fit[rows] - (before >= thresholds) + (after >= thresholds)
        below = (
            stats.below[rows]
            - np.where(before < thresholds, before, 0)
            + np.where(after < thresholds, after, 0)
        )
        left = stats.left[rows] - pod.gpu_milli
    else:
        pos = np.arange(nodes.size, dtype=np.int64)
        gpu = np.full(nodes.size, -1, dtype=np.int64)
        rows = nodes
        fit = stats.fit[rows] - pod.num_gpu
        below = stats.below[rows]
        left = stats.left[rows] - pod.num_gpu * MILLI_PER_GPU
    frag_after = model.fragmentation(
        fit,
        below,
        left,
        snapshot.cpu_free[rows] - cpu,
        snapshot.mem_free[rows] - pod.memory_mib,
        model.row_access(snapshot, rows),
    )
    return Candidates(
        node_pos=pos.astype(np.int64),
        gpu=gpu.astype(np.int64),
        delta=frag_after - stats.frag[rows],
        frag_after=frag_after,
        left_after=left.astype(np.int64),
    )
