"""DotProduct: the Tetris packing heuristic (Grandl et al., SIGCOMM'14) as the paper ran it.

The node's free vector (CPU, total free milli-GPU) and the pod's request vector are both scaled
by the largest node in the trace (128 cores, 8 GPUs); the score is 100 * (1 - dot / 2), rounded
down, so nodes whose free resources align least with the request score highest (the paper's
"merge" dimension and "max" normalisation).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState
from alnair.scheduler.plugins.fragmentation import effective_cpu

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


class DotProductScore:
    NAME: ClassVar[str] = "DotProductScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        cpu = snapshot.cpu_free[nodes] / MAX_SPEC_CPU_MILLI
        gpu = snapshot.gpu_free[nodes].sum(axis=1) / MAX_SPEC_GPU_MILLI
        dot = (
            cpu * (effective_cpu(pod.cpu_milli) / MAX_SPEC_CPU_MILLI)
            + gpu * (pod.total_milli_gpu / MAX_SPEC_GPU_MILLI)
        ) / 2
        result: FloatArray = np.floor(MAX_NODE_SCORE * (1.0 - dot))
        return result
