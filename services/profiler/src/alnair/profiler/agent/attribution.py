"""Attribution: splitting a shared GPU between the pods on it.

dcgm-exporter labels a GPU's device utilization with every pod on it, so two pods sharing a
GPU both appear to use all of it. The agent instead splits the device utilization between
pods in proportion to their processes' SM samples (NVML per-process utilization), and memory
by each process's own usage. The pods' shares then add up to the device's number, which is
the invariant the tests check. Pure, so it can be tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
