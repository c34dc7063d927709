"""Which pod holds a vGPU, from the kubelet's PodResources API (`pod-resources/kubelet.sock`).

Allocate names devices, not pods. A pod the Alnair scheduler placed carries its decision in
annotations, and the plugin finds it there (`pods.match`); a pod bound by another scheduler,
or by `spec.nodeName`, does not. The kubelet records every allocation it made, per pod and
container, and serves it on its PodResources socket, as it does for monitoring agents. When a
fraction's shim registers (its container is running, so the kubelet has recorded it) and the
vGPU has no pod yet, the registry asks here which container holds its devices; from then on
the pod's measured utilization reaches its shim and the compute share is held.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import grpc.aio

from alnair.deviceplugin.protos import SERVICE_POD_RESOURCES
from alnair.deviceplugin.protos import podresources_v1_pb2 as pb
from alnair.deviceplugin.registry import VgpuRecord

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str


class PodResources:
    """A client of the kubelet's PodResources `List`."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._channel: grpc.aio.Channel | None = None

    def _list(self) -> grpc.aio.UnaryUnaryMultiCallable:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        return self._channel.unary_unary(
            f"/{SERVICE_POD_RESOURCES}/List",
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )

    async def holder(self, resource: str, device_ids: Collection[str]) -> Holder | None:
        """The container holding any of `device_ids` of `resource`; None when none does, or
        when the kubelet does not answer (logged)."""
        wanted = set(device_ids)
        try:
            listed = await self._list()(pb.ListPodResourcesRequest(), timeout=TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "the kubelet's PodResources API did not answer",
                extra={"socket": str(self.socket), "error": exc.details() or str(exc.code())},
            )
            return None
        for pod in listed.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if devices.resource_name == resource and wanted & set(devices.device_ids):
                        return Holder(pod.namespace, pod.name, container.name)
        return None

    async def attribute(self, rec: VgpuRecord) -> VgpuRecord | None:
        """`rec` with its pod filled in from the kubelet's record, or None."""
        if not rec.resource or not rec.device_ids:
            return None
        found = await self.holder(rec.resource, rec.device_ids)
        if found is None:
            return None
        return replace(rec, namespace=found.namespace, pod=found.pod, container=found.container)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
