"""The kubelet device plugin API (v1beta1) over gRPC on unix sockets: one endpoint per resource.

`ResourcePlugin` answers the five DevicePlugin calls for one resource; the handlers are built
here over the generated messages (no generated service code). `PluginServer` owns the endpoint's
lifecycle: serve on `<kubelet dir>/alnair-<resource>.sock`, Register with the kubelet, and
register again when the kubelet restarts. A restart is noticed from the kubelet directory
(inotify, `fswatch`: our socket removed, as a starting kubelet clears the directory, or a new
`kubelet.sock`) or when the kubelet's ListAndWatch stream ends: if the kubelet's socket is then
unreachable, or is a new file, or our own socket is gone, the server comes back on a fresh
socket and registers anew; anything else (a stream the same kubelet replaced, our own socket
being recreated) changes nothing, so re-registration can never loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from alnair.common.errors import InvalidValueError
from alnair.common.events import GpuDevice
from alnair.common.resources import gpu_memory_mib as memory_mib
from alnair.common.retry import Backoff, retrying
from alnair.common.tasks import first_of, within
from alnair.deviceplugin import devices as dev
from alnair.deviceplugin import fswatch
from alnair.deviceplugin.allocation import (
    Grant,
    Layout,
    SharingMode,
    grant_fraction,
    grant_whole,
    group_by_gpu,
    pick_fraction,
    pick_whole,
)
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.pods import NoPods, PodMatch, PodSource
from alnair.deviceplugin.protos import API_VERSION, SERVICE_DEVICE_PLUGIN, SERVICE_REGISTRATION
from alnair.deviceplugin.protos import api_pb2 as pb
from alnair.deviceplugin.registry import VgpuRecord, VgpuRegistry
from alnair.deviceplugin.state import NodeDevices, NodeSnapshot

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
POD_LOOKUP_TIMEOUT_S = 5.0
"""Longest an Allocate waits on the API server before going by the kubelet's devices alone."""
KUBELET_MAX_MESSAGE_BYTES = 4 << 20
"""gRPC's default receive limit, which the kubelet keeps for device lists."""


@dataclass(frozen=True)
class PluginConfig:
    mode: SharingMode = "intercept"
    layout: Layout = field(default_factory=Layout)


def _to_proto(devices: list[dev.Device]) -> pb.ListAndWatchResponse:
    out = pb.ListAndWatchResponse()
    for d in devices:
        item = out.devices.add(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
        if d.numa_node is not None:
            item.topology.nodes.add(ID=d.numa_node)
    return out


def list_message_bytes(devices: list[dev.Device]) -> int:
    """Size of the ListAndWatch message that carries `devices` (the kubelet refuses more than
    KUBELET_MAX_MESSAGE_BYTES)."""
    return int(_to_proto(devices).ByteSize())


def _grant_to_proto(grant: Grant) -> pb.ContainerAllocateResponse:
    resp = pb.ContainerAllocateResponse()
    resp.envs.update(grant.envs)
    resp.annotations.update(grant.annotations)
    for m in grant.mounts:
        resp.mounts.add(
            container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
        )
    return resp


class ResourcePlugin:
    """The DevicePlugin service for one resource."""

    def __init__(
        self,
        resource: str,
        state: NodeDevices,
        *,
        config: PluginConfig | None = None,
        pods: PodSource | None = None,
        vgpus: VgpuRegistry | None = None,
        metrics: DevicePluginMetrics | None = None,
    ) -> None:
        if resource not in dev.RESOURCES:
            raise InvalidValueError("resource", resource, f"not one of {', '.join(dev.RESOURCES)}")
        self.resource = resource
        self.state = state
        self.config = config or PluginConfig()
        self.pods: PodSource = pods or NoPods()
        self.vgpus = vgpus
        self.metrics = metrics or DevicePluginMetrics()
        self.stream_closed = asyncio.Event()
        self.streams = 0

    # --- DevicePlugin service -------------------------------------------------------------

    async def get_options(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def devices(self, snap: NodeSnapshot) -> list[dev.Device]:
        return snap.devices(self.resource)

    async def list_and_watch(
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.streams += 1
        last: list[dev.Device] | None = None
        try:
            async for snap in self.state.changes():
                devices = self.devices(snap)
                if devices == last:
                    continue
                last = devices
                healthy = sum(d.healthy for d in devices)
                self.metrics.devices.labels(self.resource, "healthy").set(healthy)
                self.metrics.devices.labels(self.resource, "unhealthy").set(len(devices) - healthy)
                self.metrics.list_sends.labels(self.resource).inc()
                message = _to_proto(devices)
                size = message.ByteSize()
                if size > KUBELET_MAX_MESSAGE_BYTES:
                    log.error(
                        "device list too large for the kubelet: serve alnair.io/gpu-memory-gib "
                        "instead of alnair.io/gpu-memory",
                        extra={"resource": self.resource, "bytes": size, "devices": len(devices)},
                    )
                yield message
        finally:
            self.streams -= 1
            self.stream_closed.set()

    async def get_preferred(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        snap = self.state.snapshot
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            size = int(req.allocation_size)
            found = await self._find_pod(size)
            chosen = self._prefer(
                snap, list(req.available_deviceIDs), list(req.must_include_deviceIDs), size, found
            )
            out.container_responses.add(deviceIDs=chosen)
            self.metrics.preferred.labels(self.resource).inc()
        return out

    def _prefer(
        self,
        snap: NodeSnapshot,
        available: list[str],
        must: list[str],
        size: int,
        found: PodMatch | None,
    ) -> list[str]:
        index = snap.uuid_to_index
        gpu_of = {d: dev.gpu_index_of(self.resource, d, index) for d in [*available, *must]}
        if self.resource == dev.WHOLE:
            by_index = {gpu_of[d]: d for d in [*available, *must]}
            numa = {g.index: g.numa_node for g in snap.gpus}
            picked = pick_whole(
                [gpu_of[d] for d in available],
                [gpu_of[d] for d in must],
                size,
                snap.topology,
                numa,
                found.gpu_indices if found else (),
            )
            return [by_index[g] for g in picked]
        return pick_fraction(
            group_by_gpu(available, gpu_of),
            must,
            [gpu_of[d] for d in must],
            size,
            found.gpu_indices[0] if found and found.gpu_indices else None,
        )

    async def allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        snap = self.state.snapshot
        out = pb.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                grant = await self._grant(snap, ids)
            except InvalidValueError as exc:
                self.metrics.allocation_errors.labels(self.resource, "invalid-device").inc()
                log.warning(
                    "allocate refused", extra={"resource": self.resource, "error": str(exc)}
                )
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # abort raises; this line only satisfies the type checker
            out.container_responses.append(_grant_to_proto(grant))
        return out

    async def _grant(self, snap: NodeSnapshot, ids: list[str]) -> Grant:
        index = snap.uuid_to_index
        gpus = [dev.gpu_index_of(self.resource, d, index) for d in ids]
        if not ids:
            raise InvalidValueError("devices_ids", ids, "an allocation needs at least one device")
        found = await self._find_pod(len(ids))
        if self.resource == dev.WHOLE:
            if found and sorted(found.gpu_indices) != sorted(gpus):
                # the kubelet's ids are what it accounts; handing out others could double-book
                log.warning(
                    "kubelet chose other GPUs than the scheduler",
                    extra={"pod": found.name, "scheduler": found.gpu_indices, "kubelet": gpus},
                )
            uuids = [self._gpu(snap, g).uuid for g in gpus]
            self.metrics.allocations.labels(self.resource, "kubelet").inc()
            await self._mark(found)
            return grant_whole(uuids)
        return await self._grant_fraction(snap, ids, gpus, found)

    async def _grant_fraction(
        self, snap: NodeSnapshot, ids: list[str], gpus: list[int], found: PodMatch | None
    ) -> Grant:
        if found and found.gpu_indices:
            gpu_index = found.gpu_indices[0]
            placement = "scheduler"
            requests = found.requests
            vgpu_id = found.vgpu_id
        else:
            # units are fungible: the GPU holding most of them is the container's GPU
            gpu_index = Counter(gpus).most_common(1)[0][0]
            placement = "kubelet"
            requests = {self.resource: len(ids)}
            vgpu_id = hashlib.sha256(",".join(sorted(ids)).encode()).hexdigest()[:16]
        gpu = self._gpu(snap, gpu_index)
        if len(set(gpus)) > 1 and placement == "kubelet":
            log.warning("fractional units span GPUs", extra={"gpus": sorted(set(gpus))})
        # the exact MiB the pod was granted, in whichever unit its memory resource names
        memory = int(memory_mib(requests, "container resources"))
        compute = requests.get(dev.COMPUTE)
        grant = grant_fraction(
            uuid=gpu.uuid,
            gpu_index=gpu.index,
            vgpu_id=vgpu_id,
            memory_mib=memory or None,
            compute_pct=compute if compute else None,
            layout=self.config.layout,
            mode=self.config.mode,
        )
        if self.vgpus is not None:
            self.vgpus.record(
                VgpuRecord(
                    vgpu_id=vgpu_id,
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    memory_mib=memory or None,
                    compute_pct=compute if compute else None,
                    namespace=found.namespace if found else "",
                    pod=found.name if found else "",
                    container=found.container if found else "",
                    pod_uid=found.uid if found else "",
                    resource=self.resource,
                    device_ids=tuple(ids),
                )
            )
        self.metrics.allocations.labels(self.resource, placement).inc()
        await self._mark(found)
        return grant

    def _gpu(self, snap: NodeSnapshot, index: int) -> GpuDevice:
        gpu = snap.gpu(index)
        if gpu is None:
            raise InvalidValueError("gpu index", index, f"no such GPU on node {snap.node}")
        return gpu

    async def _find_pod(self, size: int) -> PodMatch | None:
        try:
            return await within(self.pods.find(self.resource, size), POD_LOOKUP_TIMEOUT_S)
        except Exception as exc:  # the API server being slow or down must not block admission
            log.warning("pod lookup failed", extra={"error": repr(exc)})
            return None

    async def _mark(self, found: PodMatch | None) -> None:
        if found is None:
            return
        try:
            await within(self.pods.mark_allocated(found, self.resource), POD_LOOKUP_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "could not mark pod allocated", extra={"pod": found.name, "error": repr(exc)}
            )

    async def pre_start(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_DEVICE_PLUGIN,
            {
                "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                    self.get_options,
                    request_deserializer=pb.Empty.FromString,
                    response_serializer=pb.DevicePluginOptions.SerializeToString,
                ),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=pb.Empty.FromString,
                    response_serializer=pb.ListAndWatchResponse.SerializeToString,
                ),
                "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                    self.get_preferred,
                    request_deserializer=pb.PreferredAllocationRequest.FromString,
                    response_serializer=pb.PreferredAllocationResponse.SerializeToString,
                ),
                "Allocate": grpc.unary_unary_rpc_method_handler(
                    self.allocate,
                    request_deserializer=pb.AllocateRequest.FromString,
                    response_serializer=pb.AllocateResponse.SerializeToString,
                ),
                "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                    self.pre_start,
                    request_deserializer=pb.PreStartContainerRequest.FromString,
                    response_serializer=pb.PreStartContainerResponse.SerializeToString,
                ),
            },
        )


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _reachable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


class PluginServer:
    """One resource's endpoint and its registration with the kubelet."""

    def __init__(
        self,
        plugin: ResourcePlugin,
        kubelet_dir: Path,
        *,
        kubelet_socket: str = "kubelet.sock",
        retry_max_s: float = 5.0,
    ) -> None:
        self.plugin = plugin
        self.kubelet_dir = kubelet_dir
        self.kubelet_socket = kubelet_dir / kubelet_socket
        self.endpoint = f"alnair-{dev.SHORT_NAMES[plugin.resource]}.sock"
        self.socket_path = kubelet_dir / self.endpoint
        self.retry_max_s = retry_max_s
        self.registrations = 0
        self.registered = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._kubelet_inode: int | None = None
        self._fs_changed = asyncio.Event()

    async def serve(self) -> None:
        """Start (or restart) the gRPC server on a fresh socket."""
        await self.stop_server()
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self.plugin.handler(),))
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info(
            "device plugin serving",
            extra={"resource": self.plugin.resource, "socket": str(self.socket_path)},
        )

    async def stop_server(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None

    async def register(self) -> None:
        """Register with the kubelet, retrying with backoff until it accepts."""
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint,
            resource_name=self.plugin.resource,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        # The kubelet is starting or away: nothing to wait on but time.
        async for attempt in retrying(
            "kubelet registration",
            on=grpc.aio.AioRpcError,
            wait_initial_s=0.1,
            wait_max_s=self.retry_max_s,
            extra={"resource": self.plugin.resource},
        ):
            with attempt:
                try:
                    async with grpc.aio.insecure_channel(
                        f"unix://{self.kubelet_socket}"
                    ) as channel:
                        call = channel.unary_unary(
                            f"/{SERVICE_REGISTRATION}/Register",
                            request_serializer=pb.RegisterRequest.SerializeToString,
                            response_deserializer=pb.Empty.FromString,
                        )
                        await call(request, timeout=5.0, wait_for_ready=False)
                except grpc.aio.AioRpcError:
                    self.plugin.metrics.registrations.labels(self.plugin.resource, "failed").inc()
                    raise
        self._kubelet_inode = _inode(self.kubelet_socket)
        self.registrations += 1
        self.plugin.metrics.registrations.labels(self.plugin.resource, "ok").inc()
        self.registered.set()
        log.info("registered with the kubelet", extra={"resource": self.plugin.resource})

    def _kubelet_restarted(self) -> bool:
        if not self.socket_path.exists():
            return True
        if _inode(self.kubelet_socket) != self._kubelet_inode:
            return True
        return not _reachable(self.kubelet_socket)

    def _on_fs(self, what: str, name: str) -> None:
        """The kubelet directory changed: a new kubelet socket, our socket removed (a starting
        kubelet clears the directory), or lost events."""
        if (
            (what == fswatch.CREATED and name == self.kubelet_socket.name)
            or (what == fswatch.DELETED and name == self.endpoint)
            or what == fswatch.OVERFLOW
        ):
            self._fs_changed.set()

    def _watch_directory(self) -> fswatch.DirectoryWatch | None:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        watch = fswatch.DirectoryWatch(self.kubelet_dir, self._on_fs)
        try:
            watch.start()
        except fswatch.WatchUnavailable as exc:
            log.warning(
                "cannot watch the kubelet directory: a kubelet restart is noticed only when its "
                "ListAndWatch stream ends",
                extra={"resource": self.plugin.resource, "error": str(exc)},
            )
            return None
        return watch

    async def run(self) -> None:
        """Serve, register, and re-register whenever the kubelet restarts; runs until cancelled."""
        watch = self._watch_directory()
        try:
            await self.serve()
            await self.register()
            while True:
                self.plugin.stream_closed.clear()
                self._fs_changed.clear()
                if not self._kubelet_restarted():
                    await first_of(self.plugin.stream_closed, self._fs_changed)
                    if not self._kubelet_restarted():
                        continue  # our own socket churn, or a stream the kubelet replaced
                log.info(
                    "kubelet restarted: registering again", extra={"resource": self.plugin.resource}
                )
                self.registered.clear()
                await self._wait_for_kubelet()
                await self.serve()
                await self.register()
        finally:
            if watch is not None:
                watch.close()
            await self.stop_server()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _wait_for_kubelet(self) -> None:
        """Until the kubelet's socket answers: woken by its creation, with a backoff retry for
        the moment between its bind and its listen (and where the directory is not watched)."""
        backoff = Backoff(0.05, self.retry_max_s)
        while True:
            self._fs_changed.clear()
            if _reachable(self.kubelet_socket):
                return
            with contextlib.suppress(TimeoutError):
                await within(self._fs_changed.wait(), backoff.next())
