"""The kubelet DRA plugin: registration, NodePrepareResources / NodeUnprepareResources, slices.

Three parts, each run as a named task by `app` when `ALNAIR_DEVICEPLUGIN_MODE` is `dra` or
`both` (the device plugin stays for clusters without DRA):
- `Registrar` serves the kubelet's plugin-registration service on
  `<plugins_registry>/gpu.alnair.io-reg.sock`. The kubelet watches that directory, calls
  GetInfo (type `DRAPlugin`, our driver name, the DRA socket, services `v1.DRAPlugin` and
  `v1beta1.DRAPlugin`, of which it picks the newest it knows) and reports the outcome.
- `DraDriver` serves `DRAPlugin` in both versions on `<plugins>/gpu.alnair.io/dra.sock`.
  Prepare reads each claim's allocation from the API server (the request carries only the
  claim's identity), writes one CDI spec per claim that injects the intercept shim with the
  limits the allocator granted (`draclaims`, `cdi`), records shares in the vGPU registry, and
  keeps a checkpoint per claim, so a repeated prepare (the kubelet retries, and prepares again
  after its own restart) answers the same devices without the API server, and unprepare of a
  claim already gone succeeds. Failures are per claim, in the response's `error`.
- `SlicePublisher` owns the node's ResourceSlice: it follows the node snapshot (inventory and
  health events, no timer) and writes the slice whenever its devices change, bumping the pool
  generation, so an unhealthy GPU is tainted within one event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

from alnair.common import dra
from alnair.common.errors import InvalidValueError
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import NODES, Conflict, KubeClient, NotFound, Obj, Unavailable
from alnair.common.retry import retrying
from alnair.common.tasks import cancel_all, spawn, within
from alnair.deviceplugin import cdi
from alnair.deviceplugin.allocation import Layout
from alnair.deviceplugin.draclaims import ClaimError, claim_devices, claim_grants
from alnair.deviceplugin.draslices import build_slice
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.protos import (
    DRA_PLUGIN_TYPE,
    DRA_SUPPORTED_VERSIONS,
    SERVICE_DRA_V1,
    SERVICE_DRA_V1BETA1,
    SERVICE_PLUGIN_REGISTRATION,
)
from alnair.deviceplugin.protos import dra_v1_pb2 as v1
from alnair.deviceplugin.protos import dra_v1beta1_pb2 as v1beta1
from alnair.deviceplugin.protos import pluginregistration_pb2 as reg
from alnair.deviceplugin.registry import VgpuRecord, VgpuRegistry
from alnair.deviceplugin.state import NodeDevices, NodeSnapshot

log = logging.getLogger(__name__)

CLAIM_LOOKUP_TIMEOUT_S = 10.0


class ClaimSource(Protocol):
    """Where prepare reads a claim from (the API server)."""

    async def get(self, namespace: str, name: str) -> Obj: ...


class KubeClaims:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def get(self, namespace: str, name: str) -> Obj:
        return await self.kube.get(dra.RESOURCECLAIMS, name, namespace)


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


# --------------------------------------------------------------------------- DRAPlugin service


class DraDriver:
    """Prepares and unprepares claims of this driver on one node."""

    def __init__(
        self,
        state: NodeDevices,
        claims: ClaimSource,
        *,
        cdi_dir: Path,
        checkpoint_dir: Path,
        layout: Layout,
        vgpus: VgpuRegistry | None = None,
        metrics: DevicePluginMetrics | None = None,
        driver: str = dra.DRIVER,
    ) -> None:
        self.state = state
        self.claims = claims
        self.cdi_dir = cdi_dir
        self.checkpoint_dir = checkpoint_dir
        self.layout = layout
        self.vgpus = vgpus
        self.metrics = metrics or DevicePluginMetrics()
        self.driver = driver
        self.api_reads = 0
        # prepares are rare and node-local; one at a time keeps checkpoints and specs in step
        self._lock = asyncio.Lock()

    def _checkpoint(self, uid: str) -> Path:
        return self.checkpoint_dir / f"{uid}.json"

    def _load(self, uid: str) -> list[PreparedDevice] | None:
        path = self._checkpoint(uid)
        if not path.exists() or not cdi.spec_path(self.cdi_dir, uid).exists():
            return None
        try:
            rows = json.loads(path.read_text())["devices"]
            return [
                PreparedDevice(r["request"], r["pool"], r["device"], tuple(r["cdi"]), r["share"])
                for r in rows
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable DRA checkpoint", extra={"claim": uid, "error": str(exc)})
            return None

    def _save(self, uid: str, ref: str, devices: list[PreparedDevice], vgpu_ids: list[str]) -> None:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        rows = [
            {
                "request": d.request,
                "pool": d.pool,
                "device": d.device,
                "cdi": list(d.cdi_ids),
                "share": d.share_id,
            }
            for d in devices
        ]
        tmp = self._checkpoint(uid).with_suffix(".tmp")
        tmp.write_text(json.dumps({"claim": ref, "devices": rows, "vgpus": vgpu_ids}))
        tmp.replace(self._checkpoint(uid))

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        """The claim's devices with their CDI names; ClaimError names what is wrong."""
        async with self._lock:
            done = self._load(uid)
            if done is not None:
                self.metrics.dra_claims.labels("prepare", "repeated").inc()
                return done
            ref = f"{namespace}/{name}"
            try:
                self.api_reads += 1
                claim = await within(self.claims.get(namespace, name), CLAIM_LOOKUP_TIMEOUT_S)
            except NotFound as exc:
                raise ClaimError("claim", ref, "not found in the API server") from exc
            actual = (claim.get("metadata") or {}).get("uid", "")
            if actual != uid:
                raise ClaimError("claim uid", uid, f"{ref} now has uid {actual!r}")
            snap = self.state.snapshot
            devices = claim_devices(claim, snap.node, self.driver)
            if not devices:
                raise ClaimError(
                    "claim", ref, f"has no device of driver {self.driver} on node {snap.node}"
                )
            gpus = {g.index: g for g in snap.gpus}
            granted = claim_grants(uid, devices, gpus, self.layout)
            pod_ns, pod_name = namespace, _consumer(claim)
            specs = []
            prepared = []
            vgpu_ids = []
            for device, grant, vgpu_id in granted:
                name_in_cdi = cdi.cdi_name(uid, device.request, device.device)
                specs.append((name_in_cdi, grant))
                prepared.append(
                    PreparedDevice(
                        device.request,
                        device.pool,
                        device.device,
                        (cdi.device_id(name_in_cdi),),
                        device.share_id,
                    )
                )
                if vgpu_id is not None and self.vgpus is not None:
                    gpu = gpus[device.gpu_index]
                    memory = grant.envs.get("ALNAIR_GPU_MEMORY_LIMIT_MIB")
                    compute = grant.envs.get("ALNAIR_GPU_COMPUTE_PCT")
                    # tied to the claim, not a pod: unprepare releases it (pod_uid stays empty
                    # so the pod reconciler leaves it alone)
                    self.vgpus.record(
                        VgpuRecord(
                            vgpu_id=vgpu_id,
                            gpu_index=gpu.index,
                            gpu_uuid=gpu.uuid,
                            memory_mib=int(memory) if memory else None,
                            compute_pct=int(compute) if compute else None,
                            namespace=pod_ns,
                            pod=pod_name,
                            container="",
                            pod_uid="",
                        )
                    )
                    vgpu_ids.append(vgpu_id)
            cdi.write_spec(self.cdi_dir, uid, cdi.claim_spec(uid, specs))
            self._save(uid, ref, prepared, vgpu_ids)
            self.metrics.dra_claims.labels("prepare", "ok").inc()
            log.info(
                "claim prepared",
                extra={"claim": ref, "uid": uid, "devices": [d.device for d in prepared]},
            )
            return prepared

    async def unprepare(self, namespace: str, name: str, uid: str) -> bool:
        """Undo a prepare; True when there was something to undo."""
        async with self._lock:
            vgpu_ids: list[str] = []
            path = self._checkpoint(uid)
            with contextlib.suppress(OSError, ValueError, KeyError):
                vgpu_ids = list(json.loads(path.read_text()).get("vgpus", []))
            had_spec = cdi.remove_spec(self.cdi_dir, uid)
            if self.vgpus is not None:
                for vgpu_id in vgpu_ids:
                    self.vgpus.forget(vgpu_id)
            had_checkpoint = path.exists()
            path.unlink(missing_ok=True)
            outcome = "ok" if had_spec or had_checkpoint else "repeated"
            self.metrics.dra_claims.labels("unprepare", outcome).inc()
            return had_spec or had_checkpoint

    # --- gRPC -----------------------------------------------------------------------------

    async def _prepare_call(self, request: Any, pb: Any, with_share: bool) -> Any:
        out = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = out.claims[claim.uid]
            try:
                devices = await self.prepare(claim.namespace, claim.name, claim.uid)
            except InvalidValueError as exc:
                self.metrics.dra_claims.labels("prepare", "error").inc()
                log.warning("claim not prepared", extra={"uid": claim.uid, "error": str(exc)})
                entry.error = str(exc)
                continue
            except Exception as exc:  # the API server away: the kubelet retries
                self.metrics.dra_claims.labels("prepare", "error").inc()
                log.warning("claim not prepared", extra={"uid": claim.uid, "error": repr(exc)})
                entry.error = f"claim {claim.namespace}/{claim.name}: {exc!r}"
                continue
            for d in devices:
                item = entry.devices.add(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                if with_share and d.share_id:
                    item.share_id = d.share_id
        return out

    async def _unprepare_call(self, request: Any, pb: Any) -> Any:
        out = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = out.claims[claim.uid]
            try:
                await self.unprepare(claim.namespace, claim.name, claim.uid)
            except OSError as exc:
                entry.error = f"claim {claim.namespace}/{claim.name}: {exc}"
        return out

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The DRAPlugin service in v1 and v1beta1, over the same driver."""
        out = []
        for service, pb, with_share in (
            (SERVICE_DRA_V1, v1, True),
            (SERVICE_DRA_V1BETA1, v1beta1, False),
        ):

            def prep(pb: Any = pb, share: bool = with_share) -> Callable[..., Any]:
                async def call(request: Any, context: Any) -> Any:
                    return await self._prepare_call(request, pb, share)

                return call

            def unprep(pb: Any = pb) -> Callable[..., Any]:
                async def call(request: Any, context: Any) -> Any:
                    return await self._unprepare_call(request, pb)

                return call

            out.append(
                grpc.method_handlers_generic_handler(
                    service,
                    {
                        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                            prep(),
                            request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                            response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                        ),
                        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                            unprep(),
                            request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                            response_serializer=(
                                pb.NodeUnprepareResourcesResponse.SerializeToString
                            ),
                        ),
                    },
                )
            )
        return out


def _consumer(claim: Obj) -> str:
    """The pod the claim is reserved for (the first), for the vGPU record's labels."""
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if ref.get("resource") == "pods":
            return str(ref.get("name", ""))
    return ""


# --------------------------------------------------------------------------- registration


class Registrar:
    """The plugin-registration service the kubelet calls on our registry socket."""

    def __init__(
        self,
        endpoint: Path,
        driver: str = dra.DRIVER,
        metrics: DevicePluginMetrics | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.driver = driver
        self.metrics = metrics or DevicePluginMetrics()
        self.registered = asyncio.Event()
        self.error = ""

    async def get_info(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(DRA_SUPPORTED_VERSIONS),
        )

    async def notify(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = ""
            self.registered.set()
            self.metrics.dra_registrations.labels("ok").inc()
            log.info("registered with the kubelet", extra={"driver": self.driver})
        else:
            self.error = request.error
            self.registered.clear()
            self.metrics.dra_registrations.labels("refused").inc()
            log.error("the kubelet refused the DRA plugin", extra={"error": request.error})
        return reg.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_PLUGIN_REGISTRATION,
            {
                "GetInfo": grpc.unary_unary_rpc_method_handler(
                    self.get_info,
                    request_deserializer=reg.InfoRequest.FromString,
                    response_serializer=reg.PluginInfo.SerializeToString,
                ),
                "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                    self.notify,
                    request_deserializer=reg.RegistrationStatus.FromString,
                    response_serializer=reg.RegistrationStatusResponse.SerializeToString,
                ),
            },
        )


def _fresh_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # left by a previous run: binding would fail


async def _serve_unix(path: Path, handlers: list[grpc.GenericRpcHandler]) -> grpc.aio.Server:
    _fresh_socket(path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(tuple(handlers))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


@dataclass
class DraServer:
    """The DRA socket and the registration socket of one driver on one node."""

    driver: DraDriver
    registrar: Registrar
    plugin_socket: Path
    registration_socket: Path

    async def run(self) -> None:
        """Serve both sockets until cancelled; the kubelet finds the registration socket."""
        plugin = await _serve_unix(self.plugin_socket, self.driver.handlers())
        registration: grpc.aio.Server | None = None
        try:
            # the DRA endpoint is up before the kubelet can learn its name
            registration = await _serve_unix(self.registration_socket, [self.registrar.handler()])
            log.info(
                "DRA plugin serving",
                extra={
                    "driver": self.driver.driver,
                    "socket": str(self.plugin_socket),
                    "registration": str(self.registration_socket),
                },
            )
            await plugin.wait_for_termination()
        finally:
            if registration is not None:
                await registration.stop(grace=0.5)
            await plugin.stop(grace=0.5)
            self.registration_socket.unlink(missing_ok=True)
            self.plugin_socket.unlink(missing_ok=True)


def dra_server(
    driver: DraDriver, plugins_dir: Path, registry_dir: Path, metrics: DevicePluginMetrics
) -> DraServer:
    plugin_socket = plugins_dir / driver.driver / "dra.sock"
    return DraServer(
        driver,
        Registrar(plugin_socket, driver.driver, metrics),
        plugin_socket,
        registry_dir / f"{driver.driver}-reg.sock",
    )


# --------------------------------------------------------------------------- ResourceSlice


class SliceWatchDied(RuntimeError):
    """The watch on this node's ResourceSlice ended: the publisher cannot see it deleted."""


class SlicePublisher:
    """Owner of the node's ResourceSlice: written on every change of its devices, and again
    whenever it is deleted. A starting kubelet deletes its node's ResourceSlices (it cannot
    know which drivers still run) and expects each driver to publish its own again; the
    stand-in kubelet never did, the real one does (docs/notes/issue-31.md)."""

    def __init__(
        self,
        kube: KubeClient,
        state: NodeDevices,
        metrics: DevicePluginMetrics | None = None,
        *,
        driver: str = dra.DRIVER,
        retry_max_s: float = 5.0,
    ) -> None:
        self.kube = kube
        self.state = state
        self.metrics = metrics or DevicePluginMetrics()
        self.driver = driver
        self.retry_max_s = retry_max_s
        self.generation = 0
        self.published = asyncio.Event()
        """Set after each write; tests clear it and wait for the next."""
        self._watch_error: BaseException | None = None
        self.name = dra.slice_name(state.node)
        self._lock = asyncio.Lock()
        self._snap: NodeSnapshot | None = None
        self._node_uid = ""

    async def _read_node_uid(self) -> str:
        try:
            node = await self.kube.get(NODES, self.state.node)
        except NotFound:
            log.warning("no Node object: the ResourceSlice has no owner", extra={})
            return ""
        return str(node["metadata"]["uid"])

    async def _write(self, body: Obj) -> Obj:
        # Someone else wrote it, or the API server is away: read again and retry.
        async for attempt in retrying(
            "ResourceSlice write",
            on=(Conflict, Unavailable),
            wait_initial_s=0.1,
            wait_max_s=self.retry_max_s,
            extra={"slice": self.name},
        ):
            with attempt:
                try:
                    try:
                        current = await self.kube.get(dra.RESOURCESLICES, self.name)
                    except NotFound:
                        return await self.kube.create(dra.RESOURCESLICES, body)
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    return await self.kube.replace(dra.RESOURCESLICES, body)
                except (Conflict, Unavailable):
                    self.metrics.dra_slice_publishes.labels("retry").inc()
                    raise
        raise AssertionError("unreachable: retrying ends in a return or an exception")

    async def _current_generation(self) -> int:
        try:
            current = await self.kube.get(dra.RESOURCESLICES, self.name)
        except NotFound:
            return 0
        return int(current["spec"]["pool"].get("generation", 0))

    async def _publish(self, snap: NodeSnapshot, why: str, body: Obj | None = None) -> list[Obj]:
        """Write `body` (built from `snap`, or built here) at the next generation."""
        async with self._lock:
            if body is None:
                body = build_slice(snap, 0, node_uid=self._node_uid, driver=self.driver)
            body["spec"]["pool"]["generation"] = self.generation + 1
            devices: list[Obj] = body["spec"]["devices"]
            await self._write(body)
            self.generation += 1
            self._snap = snap
        self.metrics.dra_slice_publishes.labels("ok").inc()
        log.info(
            "ResourceSlice published",
            extra={
                "slice": self.name,
                "generation": self.generation,
                "why": why,
                "tainted": [d["name"] for d in devices if d.get("taints")],
            },
        )
        self.published.set()
        return devices

    async def _on_slice(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        if event is WatchEvent.DELETED and self._snap is not None:
            await self._publish(self._snap, "deleted (a starting kubelet clears its node's)")

    async def run(self) -> None:
        self._node_uid = await self._read_node_uid()
        self.generation = await self._current_generation()
        informer = Informer(
            self.kube,
            dra.RESOURCESLICES,
            field_selector=f"metadata.name={self.name}",
            name="deviceplugin.slice",
        )
        informer.add_handler(self._on_slice)
        publishing = asyncio.current_task()
        assert publishing is not None

        def watch_died(exc: BaseException) -> None:
            # Without the watch a slice the kubelet deletes is never published again: this
            # publisher dies with it (and the plugin with this task, crash-only).
            self._watch_error = exc
            publishing.cancel()

        watching = spawn(informer.run(), name="deviceplugin.slice-watch", on_death=watch_died)
        try:
            last: list[Obj] | None = None
            async for snap in self.state.changes():
                if snap.version == 0:
                    continue  # no inventory yet: publishing nothing would hide the GPUs
                body = build_slice(snap, 0, node_uid=self._node_uid, driver=self.driver)
                if body["spec"]["devices"] == last:
                    continue
                last = await self._publish(snap, "devices changed", body)
        except asyncio.CancelledError:
            if self._watch_error is None:
                raise
            raise SliceWatchDied(
                f"the watch on ResourceSlice {self.name} ended: {self._watch_error!r}"
            ) from self._watch_error
        finally:
            await cancel_all([watching])
