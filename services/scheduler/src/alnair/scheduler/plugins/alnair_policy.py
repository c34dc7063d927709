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

from alnair.scheduler.plugins.fgd import FGDScore
from alnair.scheduler.plugins.fragmentation import TypicalPods
from alnair.scheduler.snapshot import PodRequest

_BEST_GPU = "Alnair/best-gpu"

MEMORY_QUANTILE = 0.5
"""Which of a shape's memory requests stands for the shape (the median)."""


def typical_pods(workload: list[PodRequest] | tuple[PodRequest, ...]) -> TypicalPods:
    """The typical pods alnair measures fragmentation against."""
    return TypicalPods.from_pods(workload, memory_quantile=MEMORY_QUANTILE)


class AlnairScore(FGDScore):
    """Score plugin and GPU selector of the alnair policy: FGD's, over memory-aware shapes.

    The difference lies entirely in the typical pods it is built with (`typical_pods`).
    """

    NAME: ClassVar[str] = "AlnairScore"
    STATE_KEY: ClassVar[str] = _BEST_GPU
