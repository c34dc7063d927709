"""GpuClustering: keep pods of one kind together (the paper's clustering baseline).

A pod's kind is "fractional" or "n whole GPUs". Nodes are banded by the kinds they already
host: only this kind (75-100), this kind among others (50-75), empty (25-50), other kinds only
(0-25); inside a band, fuller nodes (less free GPU) score higher. CPU-only pods score 0
everywhere, i.e. go to a random feasible node. Integer arithmetic as in the reference.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState
from alnair.scheduler.plugins.dot_product import MAX_SPEC_GPU_MILLI


class GpuClusteringScore:
    NAME: ClassVar[str] = "GpuClusteringScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        column = pod.affinity_column
        if column is None:
            return np.zeros(nodes.size, dtype=np.float64)
        left = snapshot.gpu_free[nodes].sum(axis=1)
        fill = 25 * (MAX_SPEC_GPU_MILLI - left) // MAX_SPEC_GPU_MILLI
        kinds = (snapshot.affinity[nodes] > 0).sum(axis=1)
        same = snapshot.affinity[nodes, column] > 0
        band = np.where(same, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        result: FloatArray = (fill + band).astype(np.float64)
        return result
