"""Binpack and spread: upstream's MostAllocated and LeastAllocated, with GPUs as a resource.

Each scores the node by the mean over CPU, memory and (on GPU nodes) milli-GPU of the share
that would be allocated (binpack) or left free (spread) after placing the pod. Binpack fills
nodes before opening new ones; spread keeps load even (and headroom for bursts).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import MAX_NODE_SCORE, CycleState


def allocated_share(pod: PodRequest, snapshot: ClusterSnapshot, nodes: IntArray) -> FloatArray:
    """Mean allocated fraction over the node's resources after placing `pod`."""
    cpu_cap = np.maximum(snapshot.cpu_cap[nodes], 1)
    mem_cap = np.maximum(snapshot.mem_cap[nodes], 1)
    cpu = 1.0 - (snapshot.cpu_free[nodes] - pod.cpu_milli) / cpu_cap
    mem = 1.0 - (snapshot.mem_free[nodes] - pod.memory_mib) / mem_cap
    gpu_cap = snapshot.gpu_count[nodes] * 1000
    has_gpu = gpu_cap > 0
    gpu_free = snapshot.gpu_free[nodes].sum(axis=1) - pod.total_milli_gpu
    gpu = np.where(has_gpu, 1.0 - gpu_free / np.maximum(gpu_cap, 1), 0.0)
    share: FloatArray = (cpu + mem + gpu) / np.where(has_gpu, 3.0, 2.0)
    return share


class BinpackScore:
    NAME: ClassVar[str] = "BinpackScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        return MAX_NODE_SCORE * allocated_share(pod, snapshot, nodes)


class SpreadScore:
    NAME: ClassVar[str] = "SpreadScore"

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        return MAX_NODE_SCORE * (1.0 - allocated_share(pod, snapshot, nodes))
