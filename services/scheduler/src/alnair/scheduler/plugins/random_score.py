"""Random: place each pod on a uniformly random feasible node (and a random fitting GPU).

The paper's baseline: PreScore draws one feasible node, Score gives it the maximum and every
other node the minimum.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.framework.status import SUCCESS, Status

_CHOSEN = "RandomScore/node"


class RandomScore:
    NAME: ClassVar[str] = "RandomScore"

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        state.data[_CHOSEN] = int(nodes[int(state.rng.integers(nodes.size))])
        return SUCCESS

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        chosen = state.data.get(_CHOSEN)
        return np.where(nodes == chosen, MAX_NODE_SCORE, 0.0)
