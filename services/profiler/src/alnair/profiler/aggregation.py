"""The arithmetic of profiling: splitting a shared GPU between pods, and folding samples.

Two problems live here, both pure so they can be tested exhaustively:

1. Attribution. dcgm-exporter labels a GPU's device utilization with every pod on it, so two
   pods sharing a GPU both appear to use all of it. We instead split the device utilization
   between pods in proportion to their processes' SM samples (NVML per-process
   utilization), and memory by each process's own usage. The pods' shares then add up to
   the device's number, which is the invariant the tests check.

2. Folding. The aggregator turns a stream of per-pod samples into per-job numbers (mean and
   max GPU/CPU/memory utilization, peak GPU memory). `Stat` is a mergeable summary (count,
   sum, max): merging per-pod summaries gives the same answer as folding all samples at
   once, so pods can be summarised independently and in any order, and the summaries can
   live in Redis across aggregator restarts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from alnair.profiler.gpu import GpuSample


@dataclass(frozen=True)
class PodGpuShare:
    """One pod's use of one GPU in one sample window."""

    pod_uid: str
    gpu_index: int
    gpu_uuid: str
    gpu_util_pct: float
    sm_util_pct: float
    mem_used_mib: float


def attribute_device_util(
    device_util_pct: float, sm_by_pod: Mapping[str, float]
) -> dict[str, float]:
    """Split a device's utilization between pods in proportion to their SM samples.

    When no pod has an SM sample (NVML's per-process buffer was empty for the window) but
    the device was busy, the pods on it split it evenly: each ran something, and an even
    split is the least wrong guess. The result always sums to `device_util_pct` (clamped to
    0..100) when there is at least one pod.
    """
    util = min(100.0, max(0.0, device_util_pct))
    if not sm_by_pod:
        return {}
    total = sum(max(0.0, v) for v in sm_by_pod.values())
    if total <= 0:
        even = util / len(sm_by_pod)
        return dict.fromkeys(sm_by_pod, even)
    # The fraction first: util * sm would lose precision when the samples are tiny
    # (subnormal) and the shares would no longer add up.
    return {pod: util * (max(0.0, sm) / total) for pod, sm in sm_by_pod.items()}


def pod_shares(sample: GpuSample, pod_of_pid: Mapping[int, str]) -> list[PodGpuShare]:
    """Per-pod shares of one GPU: processes grouped by pod, utilization split fairly.

    Processes already labelled with a pod (sim backend) use that; others are looked up in
    `pod_of_pid`; processes outside any pod are dropped (their usage stays in the device
    numbers but belongs to no pod).
    """
    mem: dict[str, float] = {}
    sm: dict[str, float] = {}
    for proc in sample.processes:
        uid = proc.pod_uid
        if uid is None and proc.pid is not None:
            uid = pod_of_pid.get(proc.pid)
        if uid is None:
            continue
        mem[uid] = mem.get(uid, 0.0) + proc.mem_used_mib
        sm[uid] = sm.get(uid, 0.0) + (proc.sm_util_pct or 0.0)
    split = attribute_device_util(sample.util_pct, sm)
    return [
        PodGpuShare(
            pod_uid=uid,
            gpu_index=sample.index,
            gpu_uuid=sample.uuid,
            gpu_util_pct=split[uid],
            sm_util_pct=min(100.0, sm[uid]),
            mem_used_mib=mem[uid],
        )
        for uid in sorted(mem)
    ]


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
