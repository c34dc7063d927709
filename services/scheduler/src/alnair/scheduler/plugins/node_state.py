"""Plugins over node state beyond the capacity columns: pod count and other resources, GPU
health, measured GPU use, GPU topology. Pure functions of (pod, snapshot); the simulator's
snapshot has none of that state (unlimited pods, healthy idle GPUs, no topology), and each
plugin then returns SKIP from its PreFilter or PreScore, or defers to the policy's selector.

- `NodeResourcesExtra`: the node's pod count and the pod's requests of any resource the
  snapshot's columns do not model (extended resources, hugepages, ephemeral storage), as
  upstream's NodeResourcesFit words them.
- `GpuHealth`: names "GPU unhealthy" for nodes that fit only by counting unhealthy GPUs.
- `GpuUtilization`: prefers nodes whose measured GPU use (the profiler's pod metrics) leaves
  room, like Alnair's UtilSched: for a fraction, the GPU it would share; for whole GPUs, the
  node's busiest GPU (hot neighbours share PCIe and power).
- `TopologyAwareGpus`: GPU selector: a pod asking for several whole GPUs gets the
  best-connected free set of the node (`alnair.common.topology`, the rule the device plugin
  uses too) when the profiler reported the node's topology; otherwise the policy's own choice.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.common.topology import best_connected
from alnair.scheduler.cluster.requests import (
    TOO_MANY_PODS,
    UNLIMITED,
    BoolArray,
    FloatArray,
    IntArray,
    PodRequest,
)
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState, GpuSelector, NodeVerdicts
from alnair.scheduler.framework.status import SKIP, SUCCESS, Status


class NodeResourcesExtra:
    """The rest of upstream's NodeResourcesFit that the snapshot's arrays do not cover: the
    node's pod count (`Too many pods`) and every other resource the pod requests, such as RDMA
    devices, MIG slices, hugepages or ephemeral storage (`Insufficient <name>`; a node that
    does not report the resource has none). Without it the kubelet would refuse the pod at
    admission and fail it."""

    NAME: ClassVar[str] = "NodeResourcesExtra"

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        # Every node of a trace has an unlimited pod count and no other resource.
        limited = pod.extra or (snapshot.pods_cap.size and snapshot.pods_cap.min() < UNLIMITED)
        return SUCCESS if limited else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = snapshot
        blocked = live.pods_cap[nodes] - live.pods_used[nodes] < 1
        failures: list[tuple[str, BoolArray]] = [(TOO_MANY_PODS, blocked.copy())]
        for name, amount in pod.extra:
            short = (live.extra_room(name)[nodes] < amount) & ~blocked
            failures.append((f"Insufficient {name}", short))
            blocked |= short
        return NodeVerdicts(passed=~blocked, failures=tuple(failures))


class GpuHealth:
    """A node whose GPUs would fit only by counting unhealthy ones is rejected as "GPU
    unhealthy" (the snapshot already withholds unhealthy GPUs; this names the reason)."""

    NAME: ClassVar[str] = "GpuHealth"

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        return SUCCESS if pod.num_gpu and snapshot.unhealthy.any() else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        live = snapshot
        healthy_fit = (live.gpu_free[nodes] >= pod.gpu_milli).sum(axis=1)
        with_sick = (live.gpu_free[nodes] + live.withheld[nodes] >= pod.gpu_milli).sum(axis=1)
        sick = (healthy_fit < pod.num_gpu) & (with_sick >= pod.num_gpu)
        return NodeVerdicts(passed=~sick, failures=(("GPU unhealthy", sick),))


class GpuUtilization:
    """Score: 100 for idle GPUs down to 0 for saturated ones (measured, not requested)."""

    NAME: ClassVar[str] = "GpuUtilization"

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        return SUCCESS if pod.num_gpu and snapshot.gpu_util.any() else SKIP

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        live = snapshot
        util = live.gpu_util[nodes]
        if pod.is_fractional:
            fits = live.gpu_free[nodes] >= pod.gpu_milli
            busy = np.where(fits, util, np.inf).min(axis=1)
            busy = np.where(np.isfinite(busy), busy, 100.0)
        else:
            busy = util.max(axis=1)
        scores: FloatArray = np.clip(100.0 - busy, 0.0, 100.0)
        return scores


class TopologyAwareGpus:
    NAME: ClassVar[str] = "TopologyAwareGpus"

    def __init__(self, base: GpuSelector) -> None:
        self.base = base

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        live = snapshot
        topology = live.topology.get(live.names[node])
        if not topology or pod.is_fractional or pod.num_gpu < 2:
            return self.base.select_gpus(pod, snapshot, state, node)
        count = int(live.gpu_count[node])
        free = np.flatnonzero(live.gpu_free[node, :count] == MILLI_PER_GPU).tolist()
        if len(free) < pod.num_gpu:
            return None
        return tuple(sorted(best_connected(free, pod.num_gpu, topology)))
