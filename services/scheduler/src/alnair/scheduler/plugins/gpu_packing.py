"""GpuPacking: prefer GPUs already in use, then nodes already in use (the paper's baseline).

Highest: the pod fits on shared GPUs (score falls with the free share left on them, 50-100).
Then: it needs whole free GPUs of a node already in use (33-50). Lowest: an idle node (0-33).
CPU-only pods score 0 everywhere. Integer arithmetic as in the reference.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState


class GpuPackingScore:
    NAME: ClassVar[str] = "GpuPackingScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        if pod.num_gpu == 0:
            return np.zeros(nodes.size, dtype=np.float64)
        free = snapshot.gpu_free[nodes]
        count = snapshot.gpu_count[nodes]
        whole = (free == MILLI_PER_GPU).sum(axis=1)
        idle_node = np.maximum(100 // 3 - whole, whole)
        if pod.is_fractional:
            # The least-free GPU that fits is the one the pod would use.
            fitting = np.where(free >= pod.gpu_milli, free, MILLI_PER_GPU + 1)
            smallest = fitting.min(axis=1)
            shared = np.maximum(100 - (smallest * 100 // MILLI_PER_GPU) // 10, 50)
            used_node = np.where(smallest == MILLI_PER_GPU, np.maximum(50 - 1, 100 // 3), shared)
        else:
            used_node = np.full(nodes.size, max(50 - pod.num_gpu, 100 // 3))
        result: FloatArray = np.where(whole == count, idle_node, used_node).astype(np.float64)
        return result
