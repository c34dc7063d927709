"""BestFit: the node left with the least free CPU and GPU after placing the pod.

Remaining CPU and GPU are each scaled by the largest node (128 cores, 8 GPUs) and weighted
half each; the score is 100 * (1 - remainder), rounded down, then min-max normalised to 0-100
with integer division, as in the paper's simulator.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.plugins.dot_product import MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI
from alnair.scheduler.plugins.fragmentation import effective_cpu


def min_max_normalize(scores: FloatArray) -> FloatArray:
    """Upstream-style integer min-max rescale to 0..100 (all equal: all 0)."""
    low, high = scores.min(), scores.max()
    if high == low:
        return np.zeros_like(scores)
    result: FloatArray = np.floor((scores - low) * MAX_NODE_SCORE / (high - low))
    return result


class BestFitScore:
    NAME: ClassVar[str] = "BestFitScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        cpu_rest = (snapshot.cpu_free[nodes] - effective_cpu(pod.cpu_milli)) / MAX_SPEC_CPU_MILLI
        gpu_rest = (snapshot.gpu_free[nodes].sum(axis=1) - pod.total_milli_gpu) / MAX_SPEC_GPU_MILLI
        result: FloatArray = np.trunc((1.0 - 0.5 * cpu_rest - 0.5 * gpu_rest) * MAX_NODE_SCORE)
        return result

    def normalize_score(self, pod: PodRequest, state: CycleState, scores: FloatArray) -> FloatArray:
        return min_max_normalize(scores)
