"""Peak GPU memory of a training job, per GPU, so the scheduler never packs a job into an OOM.

The estimate is the usual decomposition of a training process's footprint: the CUDA context
and allocator reserve, the weights with their gradients and Adam's two moments (16 bytes per
fp32 parameter), and activations that grow linearly with the per-GPU batch size. Parameter
counts and activation sizes come from `catalog`; execution records (peak_gpu_mem_mib, measured
by the profiler) replace the catalog's activation figure for their model with the largest
per-sample value they imply, so the estimate errs on the side of not fitting. Gavel has no
memory measurements, only that ResNet-50 at batch 128 did not fit a K80, which the catalog
figures respect.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from alnair.predictor.catalog import describe_model
from alnair.predictor.datasets import JobKey, Observation

CONTEXT_MIB = 600.0
BYTES_PER_PARAMETER = 16.0
MemoryBasis = Literal["records", "catalog", "family"]


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Peak GPU memory per GPU, MiB."""

    peak_mib: float
    basis: MemoryBasis


def _fixed_mib(job: JobKey) -> float:
    info = describe_model(job.model_name)
    return CONTEXT_MIB + info.params_m * 1e6 * BYTES_PER_PARAMETER / 2**20


class MemoryModel:
    """Context + optimizer state + activations, with activations learned from records."""

    def __init__(self) -> None:
        self._activation: dict[str, float] = {}
        self.training_size = 0

    def fit(self, observations: Sequence[Observation]) -> None:
        implied: dict[str, list[float]] = defaultdict(list)
        for obs in observations:
            peak = obs.peak_gpu_mem_mib
            if peak is None or not math.isfinite(peak) or peak <= 0:
                continue
            per_sample = max(0.0, peak - _fixed_mib(obs.job)) / obs.job.batch_size
            implied[obs.job.model_name].append(per_sample)
        self._activation = {name: max(values) for name, values in implied.items()}
        self.training_size = sum(len(v) for v in implied.values())

    def predict(self, job: JobKey) -> MemoryEstimate:
        info = describe_model(job.model_name)
        learned = self._activation.get(job.model_name)
        basis: MemoryBasis = "records"
        activation = learned if learned is not None else info.activation_mib_per_sample
        if learned is None:
            basis = "catalog" if info.in_table else "family"
        peak = _fixed_mib(job) + activation * job.batch_size
        return MemoryEstimate(round(peak, 1), basis)
