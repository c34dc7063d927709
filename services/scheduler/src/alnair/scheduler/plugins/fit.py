"""Filter plugins: the hard constraints every profile enforces.

- `NodeResourcesFit`: CPU and memory requests fit the node's free capacity (upstream's plugin of
  the same name).
- `GpuModelFilter`: a GPU pod only goes to nodes with GPUs of an allowed model (the trace's
  `gpu_spec`, the `alnair.io/gpu-model` request). Rejections are unresolvable: no preemption
  can change a node's GPU model.
- `GpuFit`: enough GPUs on the node each have the pod's per-GPU milli-GPU free.

Reasons use the phrasing users see in "0/40 nodes are available: ..." messages.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from alnair.scheduler.cluster.requests import TOO_MANY_PODS, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState, NodeVerdicts


class NodeResourcesFit:
    NAME: ClassVar[str] = "NodeResourcesFit"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        cpu_short = snapshot.cpu_free[nodes] < pod.cpu_milli
        mem_short = snapshot.mem_free[nodes] < pod.memory_mib
        return NodeVerdicts(
            passed=~(cpu_short | mem_short),
            failures=(("Insufficient cpu", cpu_short), ("Insufficient memory", mem_short)),
        )


class GpuModelFilter:
    NAME: ClassVar[str] = "GpuModel"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        if pod.num_gpu == 0:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        no_gpu = snapshot.gpu_count[nodes] == 0
        wrong = ~snapshot.model_mask(pod.gpu_models)[nodes]
        return NodeVerdicts(
            passed=~(no_gpu | wrong),
            failures=(("no GPU", no_gpu), ("GPU model not allowed", wrong)),
        )


class GpuFit:
    NAME: ClassVar[str] = "GpuFit"

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        if pod.num_gpu == 0:
            return NodeVerdicts(passed=np.ones(nodes.size, dtype=np.bool_))
        fitting = (snapshot.gpu_free[nodes] >= pod.gpu_milli).sum(axis=1)
        short = fitting < pod.num_gpu
        reason = "Insufficient GPU share" if pod.is_fractional else "Insufficient whole GPUs"
        return NodeVerdicts(passed=~short, failures=((reason, short),))


DEFAULT_FILTERS = (NodeResourcesFit(), GpuModelFilter(), GpuFit())
"""The filters every built-in profile runs, in order."""


def for_lack_of_room(why: str) -> bool:
    """A filter reason that evicting pods can cure: the pod count, or any "Insufficient ..."
    (cpu, memory, whole GPUs, GPU share, or another resource)."""
    return why == TOO_MANY_PODS or why.startswith("Insufficient ")
