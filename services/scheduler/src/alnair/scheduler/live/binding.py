"""The Bind plugin of the live binder: a Kubernetes Binding with the chosen GPUs.

The Binding subresource carries the `alnair.io/gpu-indices` and `alnair.io/gpu-milli`
annotations in the same request, so the device plugin never sees the pod on its node without
them. API errors propagate as exceptions: the binder tells a Binding that lost a race (Conflict,
NotFound: the pod watch shows the truth) from one that failed (backoff).

A replica that no longer leads sends no Binding: `fence` (the leader elector's `leading`) is
asked right before the request, so a bind decided before leadership was lost is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from alnair.common import resources as r
from alnair.common.kube import KubeClient
from alnair.common.leader import NotLeading
from alnair.scheduler.cluster.requests import Placement, PodRequest
from alnair.scheduler.framework.interface import CycleState
from alnair.scheduler.framework.status import SUCCESS, Status


class KubeBinder:
    NAME: ClassVar[str] = "DefaultBinder"

    def __init__(
        self, kube: KubeClient, identity: str, fence: Callable[[], bool] = lambda: True
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.fence = fence

    async def bind(self, pod: PodRequest, state: CycleState, placement: Placement) -> Status:
        annotations = {
            r.ANN_GPU_INDICES: placement.annotation_indices(),
            r.ANN_GPU_MILLI: str(placement.gpu_milli if pod.num_gpu else 0),
            r.ANN_SCHEDULED_BY: self.identity,
        }
        if not self.fence():
            raise NotLeading(f"not binding {pod.namespace}/{pod.name}: no longer the leader")
        await self.kube.bind(
            pod.namespace, pod.name, placement.node_name, uid=pod.uid, annotations=annotations
        )
        return SUCCESS
