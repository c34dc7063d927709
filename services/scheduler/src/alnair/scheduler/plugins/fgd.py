"""FGD: fragmentation gradient descent (Weng et al., USENIX ATC'23), as the paper ran it.

For every feasible node, and for a fractional pod every GPU that fits, FGD computes how much the
placement grows the node's expected fragmentation (see `fragmentation`) and prefers the
smallest growth. The node score is the paper's `int(100 * sigmoid(-delta / 1000))`, so
placements within a few tens of milli-GPU of each other tie and the framework breaks the tie
at random; the GPU chosen inside the node is the best-scoring one, lowest index on ties. That
quantisation is kept on purpose: it is what the published numbers were measured with.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.placement import exclusive_gpus
from alnair.scheduler.plugins.fragmentation import (
    FragmentationModel,
    TypicalPods,
    candidates,
)

_BEST_GPU = "FGD/best-gpu"


def sigmoid(x: FloatArray) -> FloatArray:
    result: FloatArray = 1.0 / (1.0 + np.exp(-x))
    return result


def best_per_node(
    node_pos: IntArray, gpu: IntArray, value: FloatArray, nodes: int
) -> tuple[FloatArray, IntArray]:
    """Per node: the highest candidate value and its GPU (first candidate on ties)."""
    best = np.full(nodes, -np.inf)
    np.maximum.at(best, node_pos, value)
    winners = np.flatnonzero(value == best[node_pos])
    chosen = np.full(nodes, -1, dtype=np.int64)
    # Candidates are in (node, GPU index) order; writing in reverse keeps the first winner.
    chosen[node_pos[winners[::-1]]] = gpu[winners[::-1]]
    return best, chosen


class FGDScore:
    """Score plugin and GPU selector of the FGD policy."""

    NAME: ClassVar[str] = "FGDScore"
    STATE_KEY: ClassVar[str] = _BEST_GPU
    """Where `score` leaves each node's best GPU for `select_gpus` in the cycle state."""

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
        state.data[self.STATE_KEY] = (nodes, gpu)
        return np.where(np.isfinite(best), best, 0.0)

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        if not pod.is_fractional:
            return exclusive_gpus(pod, snapshot, node)
        return gpu_from_state(state, self.STATE_KEY, node)


def gpu_from_state(state: CycleState, key: str, node: int) -> tuple[int, ...] | None:
    """The GPU a scoring plugin chose for `node`, stored as (nodes, gpus) in the cycle state."""
    chosen = state.data.get(key)
    if not isinstance(chosen, tuple):
        return None
    nodes, gpus = chosen
    at = int(np.searchsorted(nodes, node))
    if at < nodes.size and int(nodes[at]) == node and int(gpus[at]) >= 0:
        return (int(gpus[at]),)
    return None
