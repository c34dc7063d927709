"""alnair: our placement policy, FGD's objective without its blind spots.

FGD (see `fgd`) is the strongest published rule on this workload; three things it leaves on the
table are fixed here:

1. Resolution. FGD rounds 100 * sigmoid(-delta / 1000) down to an integer, so every placement
   within tens of milli-GPU of the best ties and one is taken at random. We rank by the exact
   fragmentation change.
2. Memory. FGD's fragmentation ignores memory, but a node whose memory runs out strands its free
   GPUs just as surely as one whose CPU does. Typical pods here carry their memory request and
   a typical pod only counts as fitting where its memory fits too.
3. Ties that remain (equal fragmentation change, common on empty nodes) go to the placement
   that leaves the least free GPU on the node (packing keeps whole nodes free for the large
   pods that fragmentation cannot help), then at random.
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

PACKING_WEIGHT = 1e-6
"""Milli-GPU left on the node, per unit of fragmentation: only breaks exact ties."""


class AlnairScore:
    """Score plugin and GPU selector of the alnair policy."""

    NAME: ClassVar[str] = "AlnairScore"

    def __init__(self, typical: TypicalPods, packing_weight: float = PACKING_WEIGHT) -> None:
        self.model = FragmentationModel(typical)
        self.packing_weight = packing_weight
        self._memo_key = f"{self.NAME}/{id(self)}"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        stats = self.model.node_stats(snapshot, self._memo_key)
        cand = candidates(self.model, stats, pod, snapshot, nodes)
        value = -cand.delta - self.packing_weight * cand.left_after
        best, gpu = best_per_node(cand.node_pos, cand.gpu, value, nodes.size)
        state.data[_BEST_GPU] = (nodes, gpu)
        # Squash into the framework's 0-100 range without losing the order.
        return np.where(np.isfinite(best), MAX_NODE_SCORE * sigmoid(best / 1000.0), 0.0)

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        if not pod.is_fractional:
            return exclusive_gpus(pod, snapshot, node)
        return gpu_from_state(state, _BEST_GPU, node)
