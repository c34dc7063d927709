"""Folding samples: `Stat` is a mergeable summary (count, sum, max) of one series, `Profile`
the summaries of every series of a pod or a job.

Merging per-pod summaries gives the same answer as folding all samples at once, so pods are
summarised independently and in any order (the agent's running summaries, the aggregator's
per-pod hashes in Redis, kept across restarts), and a job's profile is the merge of its pods'.
Pure, so it can be tested exhaustively; both profiler processes use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stat:
    """count, sum and max of a series: enough for mean and max, and mergeable."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, value: float) -> Stat:
        return Stat(
            self.count + 1, self.total + value, value if self.count == 0 else max(self.max, value)
        )

    def merge(self, other: Stat) -> Stat:
        if self.count == 0:
            return other
        if other.count == 0:
            return self
        return Stat(self.count + other.count, self.total + other.total, max(self.max, other.max))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @staticmethod
    def of(values: Iterable[float]) -> Stat:
        stat = Stat()
        for value in values:
            stat = stat.add(value)
        return stat


# The series the aggregator keeps per pod. GPU series get one sample per (pod, GPU, tick);
# CPU and memory one per (pod, tick), since a pod on two GPUs reports them twice.
GPU_SERIES = ("gpu_util_pct", "gpu_mem_used_mib", "sm_util_pct")
POD_SERIES = ("cpu_util_cores", "mem_used_mib")
SERIES = GPU_SERIES + POD_SERIES


@dataclass(frozen=True)
class Profile:
    """Summaries of every series, for a pod or for a whole job."""

    stats: Mapping[str, Stat] = field(default_factory=dict)

    def get(self, series: str) -> Stat:
        return self.stats.get(series, Stat())

    def merge(self, other: Profile) -> Profile:
        keys = set(self.stats) | set(other.stats)
        return Profile({k: self.get(k).merge(other.get(k)) for k in keys})

    @staticmethod
    def fold(profiles: Iterable[Profile]) -> Profile:
        out = Profile()
        for profile in profiles:
            out = out.merge(profile)
        return out


# Annotations written on the owner; names carry units as the settings do.
ANNOTATION_PREFIX = "alnair.io/profile-"


def owner_annotations(profile: Profile) -> dict[str, str]:
    """The max/mean utilization annotations for a job's owner object."""

    def fmt(value: float) -> str:
        return f"{value:.2f}"

    gpu = profile.get("gpu_util_pct")
    mem = profile.get("gpu_mem_used_mib")
    cpu = profile.get("cpu_util_cores")
    ram = profile.get("mem_used_mib")
    return {
        f"{ANNOTATION_PREFIX}gpu-util-max-pct": fmt(gpu.max),
        f"{ANNOTATION_PREFIX}gpu-util-mean-pct": fmt(gpu.mean),
        f"{ANNOTATION_PREFIX}gpu-mem-max-mib": fmt(mem.max),
        f"{ANNOTATION_PREFIX}gpu-mem-mean-mib": fmt(mem.mean),
        f"{ANNOTATION_PREFIX}cpu-util-max-cores": fmt(cpu.max),
        f"{ANNOTATION_PREFIX}cpu-util-mean-cores": fmt(cpu.mean),
        f"{ANNOTATION_PREFIX}mem-max-mib": fmt(ram.max),
        f"{ANNOTATION_PREFIX}mem-mean-mib": fmt(ram.mean),
        f"{ANNOTATION_PREFIX}samples": str(gpu.count),
    }
