"""alnair: our placement policy, fragmentation gradient descent that also sees memory.

FGD (see `fgd`) is the strongest published rule on the Alibaba workload. Its fragmentation
measure asks, for each typical pod, whether the pod's GPUs and CPU still fit on the node, but
never whether its memory does. The filter does check memory, so a node whose memory is nearly
gone strands its free GPUs exactly like a node whose CPU is gone, and FGD cannot see it coming.

alnair gives every typical pod shape the median memory request of the pods of that shape and
counts a typical pod as fitting a node only where its memory fits too. Everything else stays
FGD's, on purpose:

- the same typical shapes (popularity by count, 95% coverage), so memory adds a constraint
  without diluting the distribution (keying shapes by memory as well spreads the same pods over
  many more shapes and measured worse);
- the same node score, `int(100 * sigmoid(-delta / 1000))`. Ranking by the exact change was
  measured worse: the rounding makes near-equal placements tie, and resolving ties in one fixed
  node order packs load onto a prefix of the cluster, which keeps whole nodes free for the
  multi-GPU pods (see docs/notes/issue-3.md for the numbers);
- the GPU inside the node with the best score, lowest index on ties.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.placement import exclusive_gpus
from alnair.scheduler.plugins.fgd import best_per_node, gpu_from_state, sigmoid
from alnair.scheduler.plugins.fragmentation import FragmentationModel, TypicalPods, candidates
from alnair.scheduler.snapshot import ClusterSnapshot, FloatArray, IntArray, PodRequest

_BEST_GPU = "Alnair/best-gpu"

MEMORY_QUANTILE = 0.5
"""Which of a shape's memory requests stands for the shape (the median)."""


def typical_pods(workload: list[PodRequest] | tuple[PodRequest, ...]) -> TypicalPods:
    """The typical pods alnair measures fragmentation against."""
    return TypicalPods.from_pods(workload, memory_quantile=MEMORY_QUANTILE)


class AlnairScore:
    """Score plugin and GPU selector of the alnair policy."""

    NAME: ClassVar[str] = "AlnairScore"

    def __init__(self, typical: TypicalPods) -> None:
        self.model = FragmentationModel(typical)
        self._memo_key = f"{self.NAME}/{id(self)}"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        stats = self.model.node_stats(snapshot, self._memo_key)
        cand = candidates(self.model, stats, pod, snapshot, nodes)
        value = np.floor(sigmoid(-cand.delta / 1000.0) * MAX_NODE_SCORE)
        best, gpu = best_per_node(cand.node_pos, cand.gpu, value, nodes.size)
        state.data[_BEST_GPU] = (nodes, gpu)
        return np.where(np.isfinite(best), best, 0.0)

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        if not pod.is_fractional:
            return exclusive_gpus(pod, snapshot, node)
        return gpu_from_state(state, _BEST_GPU, node)
