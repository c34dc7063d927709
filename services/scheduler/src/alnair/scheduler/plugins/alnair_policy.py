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
- the GPU inside the node with the best score.

One rule differs, for fractional pods: among the GPUs of a node that the rounded score cannot
tell apart, the pod goes to the fullest one that fits (best fit), lowest index only among equally
full ones; FGD takes the lowest index. The rounding makes such ties common (one score step is
about 40 milli-GPU of fragmentation), and they matter most where fractional pods are most of the
load: packing a fractional pod onto a GPU that is already shared keeps the emptier GPUs, and
whole free GPUs, for the larger requests that come later, which the expectation over typical pods
only sees once a GPU is already split. On the trace variants with 60-100% of the GPU demand
fractional it is what keeps alnair level with or above FGD (docs/notes/issue-18.md, "Placement
on trace variants").
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.plugins.fgd import FGDScore, sigmoid
from alnair.scheduler.plugins.fragmentation import TypicalPods, candidates

_BEST_GPU = "Alnair/best-gpu"

MEMORY_QUANTILE = 0.5
"""Which of a shape's memory requests stands for the shape (the median)."""


def typical_pods(workload: list[PodRequest] | tuple[PodRequest, ...]) -> TypicalPods:
    """The typical pods alnair measures fragmentation against."""
    return TypicalPods.from_pods(workload, memory_quantile=MEMORY_QUANTILE)


class AlnairScore(FGDScore):
    """Score plugin and GPU selector of the alnair policy: FGD's, over memory-aware shapes
    (`typical_pods`), with best-fit ties among a node's GPUs for fractional pods."""

    NAME: ClassVar[str] = "AlnairScore"
    STATE_KEY: ClassVar[str] = _BEST_GPU

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        stats = self.model.node_stats(snapshot, self._memo_key)
        cand = candidates(self.model, stats, pod, snapshot, nodes)
        value = np.floor(sigmoid(-cand.delta / 1000.0) * MAX_NODE_SCORE)
        free = (
            snapshot.gpu_free[nodes[cand.node_pos], cand.gpu]
            if pod.is_fractional
            else np.zeros(cand.gpu.size, dtype=np.int64)
        )
        best, gpu = best_fit_per_node(cand.node_pos, cand.gpu, value, free, nodes.size)
        state.data[self.STATE_KEY] = (nodes, gpu)
        return np.where(np.isfinite(best), best, 0.0)


def best_fit_per_node(
    node_pos: IntArray, gpu: IntArray, value: FloatArray, free: IntArray, nodes: int
) -> tuple[FloatArray, IntArray]:
    """Per node: the highest candidate value, and among its candidates with that value the GPU
    with the least free share (lowest index among equals)."""
    best = np.full(nodes, -np.inf)
    np.maximum.at(best, node_pos, value)
    winners = np.flatnonzero(value == best[node_pos])
    order = winners[np.lexsort((gpu[winners], free[winners], node_pos[winners]))]
    first = np.ones(order.size, dtype=np.bool_)
    first[1:] = node_pos[order[1:]] != node_pos[order[:-1]]
    chosen = np.full(nodes, -1, dtype=np.int64)
    chosen[node_pos[order[first]]] = gpu[order[first]]
    return best, chosen
