"""Which GPUs of the chosen node a pod gets.

Whole-GPU pods take fully free GPUs, lowest index first (the device plugin's order, and what the
paper's simulator does). A fractional pod needs one GPU with enough free milli-GPU; which one is
a policy choice with real consequences for fragmentation:

- best fit: the GPU with the least room that still fits (packs shared GPUs, the default);
- worst fit: the GPU with the most room (spreads load across GPUs);
- random: any GPU that fits (the Random baseline).

These are GpuSelector plugins; FGD and the alnair policy choose the GPU themselves while scoring
and expose it through the cycle state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.requests import IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState


def fitting_gpus(pod: PodRequest, snapshot: ClusterSnapshot, node: int) -> IntArray:
    """Indices of the node's GPUs that can take one share of the pod's request."""
    count = int(snapshot.gpu_count[node])
    free = snapshot.gpu_free[node, :count]
    return np.flatnonzero(free >= pod.gpu_milli).astype(np.int64)


def exclusive_gpus(pod: PodRequest, snapshot: ClusterSnapshot, node: int) -> tuple[int, ...] | None:
    """The first `num_gpu` fully free GPUs of the node, or None when there are too few."""
    count = int(snapshot.gpu_count[node])
    whole = np.flatnonzero(snapshot.gpu_free[node, :count] == MILLI_PER_GPU)
    if whole.size < pod.num_gpu:
        return None
    return tuple(int(g) for g in whole[: pod.num_gpu])


class _FittingGpuSelector(ABC):
    """Whole GPUs: the first free ones. A fraction: `choose` picks among the GPUs it fits."""

    NAME: ClassVar[str] = ""

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        if not pod.is_fractional:
            return exclusive_gpus(pod, snapshot, node)
        fits = fitting_gpus(pod, snapshot, node)
        if fits.size == 0:
            return None
        return (int(fits[self.choose(snapshot.gpu_free[node, fits], state)]),)

    @abstractmethod
    def choose(self, free: IntArray, state: CycleState) -> int:
        """The position in `free` (the fitting GPUs' free milli-GPU) of the GPU to use."""


class BestFitGpu(_FittingGpuSelector):
    """Fractional pods take the fitting GPU with the least free milli-GPU (lowest index on ties)."""

    NAME: ClassVar[str] = "BestFitGpu"

    def choose(self, free: IntArray, state: CycleState) -> int:
        return int(np.argmin(free))


class WorstFitGpu(_FittingGpuSelector):
    """Fractional pods take the fitting GPU with the most free milli-GPU (lowest index on ties)."""

    NAME: ClassVar[str] = "WorstFitGpu"

    def choose(self, free: IntArray, state: CycleState) -> int:
        return int(np.argmax(free))


class RandomGpu(_FittingGpuSelector):
    """Fractional pods go to a uniformly random fitting GPU."""

    NAME: ClassVar[str] = "RandomGpu"

    def choose(self, free: IntArray, state: CycleState) -> int:
        return int(state.rng.integers(free.size))
