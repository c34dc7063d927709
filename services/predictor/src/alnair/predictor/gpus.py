"""GPU specifications: the hardware features the predictor learns from.

A job's speed on a GPU it was never measured on is predicted from how that GPU's memory,
memory bandwidth and arithmetic throughput compare with GPUs it was measured on, so every GPU
type the scheduler may ask about needs an entry here. Figures are NVIDIA's published
datasheet values for one GPU device (a K80 board holds two devices; Kubernetes and Gavel both
count one device as one GPU). FP16 figures are dense tensor-core throughput where the GPU has
tensor cores, otherwise the plain FP16 (or, for the K80, the FP32) rate.

Sources: NVIDIA Tesla K80 board specification (BD-07317); Tesla P100 PCIe datasheet; Tesla T4
datasheet; Tesla V100 SXM2 datasheet; A10 datasheet; A100 40GB SXM4 datasheet; H100 SXM5
datasheet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Published specification of one GPU device."""

    name: str
    memory_mib: int
    bandwidth_gbps: float
    fp32_tflops: float
    fp16_tflops: float
    compute_capability: str

    def features(self) -> list[float]:
        """Log-scaled specification features: ratios between GPUs matter, not differences."""
        return [
            math.log(self.fp32_tflops),
            math.log(self.fp16_tflops),
            math.log(self.bandwidth_gbps),
            math.log(self.memory_mib),
        ]


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("K80", 12_288, 240.0, 4.37, 4.37, "3.7"),
        GpuSpec("P100", 16_384, 732.0, 9.3, 18.7, "6.0"),
        GpuSpec("T4", 16_384, 320.0, 8.1, 65.0, "7.5"),
        GpuSpec("V100", 16_384, 900.0, 15.7, 125.0, "7.0"),
        GpuSpec("A10", 24_576, 600.0, 31.2, 125.0, "8.6"),
        GpuSpec("A100", 40_960, 1_555.0, 19.5, 312.0, "8.0"),
        GpuSpec("H100", 81_920, 3_350.0, 67.0, 989.0, "9.0"),
    )
}

# Longest names first so that "A100" is not read as "A10".
_NAMES_BY_LENGTH = sorted(GPU_SPECS, key=len, reverse=True)
_MEMORY_GIB = re.compile(r"(?:M|-|\b)(\d{2,3})\s*(?:G|GB|GIB)?\b")


class UnknownGpuError(ValueError):
    """A GPU name that matches no entry of the specification table."""

    def __init__(self, name: str) -> None:
        self.name = name
        known = ", ".join(GPU_SPECS)
        super().__init__(f"unknown GPU type {name!r} (known: {known})")


@lru_cache(maxsize=256)
def canonical_gpu(name: str) -> str | None:
    """The table name for a GPU name as NVML, node labels or traces spell it, or None.

    Accepts forms such as "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-40GB", "v100", "V100M32".
    """
    upper = name.upper()
    for known in _NAMES_BY_LENGTH:
        if re.search(rf"(?<![A-Z0-9]){known}(?![0-9])", upper):
            return known
    return None


@lru_cache(maxsize=256)
def lookup_gpu(name: str) -> GpuSpec:
    """The specification for a GPU name; a memory size in the name (V100M32) overrides the table.

    Raises UnknownGpuError naming the value when the name matches no GPU type.
    """
    canonical = canonical_gpu(name)
    if canonical is None:
        raise UnknownGpuError(name)
    spec = GPU_SPECS[canonical]
    rest = name.upper().replace(canonical, " ", 1)
    match = _MEMORY_GIB.search(rest)
    if match is not None:
        gib = int(match.group(1))
        if 8 <= gib <= 192 and gib * 1024 != spec.memory_mib:
            return GpuSpec(
                spec.name,
                gib * 1024,
                spec.bandwidth_gbps,
                spec.fp32_tflops,
                spec.fp16_tflops,
                spec.compute_capability,
            )
    return spec
