"""Wiring and lifespan of the device plugin process.

`start` connects NATS (health events, pod metrics, the inventory KV) and optionally the API
server (to honour the scheduler's GPU choice), starts the vGPU registry, one gRPC endpoint per
resource with its kubelet registration (mode `deviceplugin`), the DRA driver with its
ResourceSlice publisher (mode `dra`), or both, and the HTTP API, all as named tasks whose death is
logged and fatal (crash-only: the DaemonSet restarts the pod). It returns a handle whose
`stop()` undoes everything in reverse. Tests call `start` directly; `serve` runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.busauth import for_node
from alnair.common.errors import ConfigError
from alnair.common.events import GpuInventory
from alnair.common.http import bound_port, named_task, start_http, stop_http
from alnair.common.informer import Informer
from alnair.common.kube import PODS, KubeClient
from alnair.common.logs import setup_logging
from alnair.common.resources import GPU_MEMORY, GPU_MEMORY_GIB
from alnair.common.tasks import cancel_all, spawn, until_stopped
from alnair.deviceplugin.api import create_app
from alnair.deviceplugin.devices import RESOURCES
from alnair.deviceplugin.draplugin import (
    ClaimSource,
    DraDriver,
    DraServer,
    KubeClaims,
    SlicePublisher,
    dra_server,
)
from alnair.deviceplugin.handlers import (
    pod_cleanup_handler,
    subscribe_health,
    subscribe_utilization,
    watch_inventory,
)
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.plugin import PluginConfig, PluginServer, ResourcePlugin
from alnair.deviceplugin.podresources import PodResources
from alnair.deviceplugin.pods import KubePods, NoPods, PodSource
from alnair.deviceplugin.registry import VgpuRegistry
from alnair.deviceplugin.settings import DevicePluginSettings
from alnair.deviceplugin.state import NodeDevices

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A started device plugin."""

    settings: DevicePluginSettings
    state: NodeDevices
    vgpus: VgpuRegistry
    metrics: DevicePluginMetrics
    plugins: dict[str, PluginServer]
    bus: Bus | None
    kube: KubeClient | None
    server: uvicorn.Server | None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    died: asyncio.Event = field(default_factory=asyncio.Event)
    dra: DraServer | None = None
    slices: SlicePublisher | None = None
    pod_resources: PodResources | None = None

    @property
    def http_port(self) -> int:
        assert self.server is not None
        return bound_port(self.server)

    async def stop(self) -> None:
        if self.server is not None:
            await stop_http(self.server, named_task(self.tasks, "deviceplugin.http"))
        await cancel_all(self.tasks)
        await self.vgpus.stop()
        if self.pod_resources is not None:
            await self.pod_resources.close()
        if self.bus is not None:
            await self.bus.close()
        if self.kube is not None:
            await self.kube.close()


def unregistered(plugins: dict[str, PluginServer], dra: DraServer | None) -> str | None:
    """What the kubelet has not registered (or refused), for `/readyz`; None: all of it."""
    missing = [res for res, srv in plugins.items() if not srv.registered.is_set()]
    if dra is not None and not dra.registrar.registered.is_set():
        refused = dra.registrar.error
        missing.append(f"DRA driver {dra.registrar.driver}" + (f" ({refused})" if refused else ""))
    if not missing:
        return None
    return f"not registered with the kubelet: {', '.join(missing)}"


async def start(
    settings: DevicePluginSettings,
    registry: CollectorRegistry | None = None,
    *,
    pods: PodSource | None = None,
    claims: ClaimSource | None = None,
    connect_bus: bool = True,
    http: bool = True,
) -> Running:
    """Start every part of the plugin; `pods` and `claims` override the API server (tests)."""
    if not settings.node_name:
        raise ConfigError(
            "the device plugin needs its node name (ALNAIR_DEVICEPLUGIN_NODE_NAME or NODE_NAME)"
        )
    if settings.memory_unit_mib is not None:
        raise ConfigError(
            f"ALNAIR_DEVICEPLUGIN_MEMORY_UNIT_MIB={settings.memory_unit_mib} is no longer read: "
            f"the unit is the resource's name; serve {GPU_MEMORY_GIB} (GiB, the default) or "
            f"{GPU_MEMORY} (MiB) through ALNAIR_DEVICEPLUGIN_RESOURCES",
            memory_unit_mib=settings.memory_unit_mib,
        )
    unknown = [r for r in settings.resources if r not in RESOURCES]
    if unknown:
        raise ConfigError(
            f"unknown resources {unknown}: choose from {', '.join(RESOURCES)}", resources=unknown
        )
    metrics = DevicePluginMetrics(registry)
    state = NodeDevices(settings.node_name)
    pod_resources = PodResources(settings.pod_resources_socket)
    vgpus = VgpuRegistry(settings.layout(), attribute=pod_resources.attribute)
    restored = vgpus.load_records()
    metrics.watch_vgpus(vgpus)
    await vgpus.start()
    running_died = asyncio.Event()

    def on_death(_exc: BaseException) -> None:
        running_died.set()

    tasks: list[asyncio.Task[Any]] = []
    kube: KubeClient | None = None
    if pods is None:
        if settings.use_pod_annotations:
            kube = KubeClient.from_config(settings.kubeconfig)
            pods = KubePods(kube, settings.node_name)
            informer = Informer(
                kube,
                PODS,
                field_selector=f"spec.nodeName={settings.node_name}",
                name="deviceplugin.pods",
            )
            informer.add_handler(pod_cleanup_handler(vgpus))
            tasks.append(spawn(informer.run(), name="deviceplugin.pods", on_death=on_death))
            tasks.append(
                spawn(
                    _reconcile(informer, vgpus),
                    name="deviceplugin.reconcile",
                    on_death=on_death,
                    ends=True,  # once, after the first list
                )
            )
        else:
            pods = NoPods()
    bus: Bus | None = None
    if connect_bus:
        bus = await Bus.connect(
            settings.nats_url,
            name=f"deviceplugin-{settings.node_name}",
            credentials=for_node(settings.nats_credentials(), settings.node_name),
            replicas=settings.nats_replicas,
            # With its node's identity (a token) it may find the streams, not make them.
            ensure_streams=settings.nats_token_file is None,
        )
        bus.export_metrics(metrics.registry)
        kv = await bus.kv(GpuInventory.BUCKET)
        tasks.append(
            spawn(watch_inventory(kv, state), name="deviceplugin.inventory", on_death=on_death)
        )
        await subscribe_health(bus, state, metrics)
        await subscribe_utilization(bus, settings.node_name, vgpus, metrics)

    config = PluginConfig(
        mode=settings.sharing_mode,
        layout=settings.layout(),
    )
    plugins: dict[str, PluginServer] = {}
    resources = settings.resources if settings.mode != "dra" else []
    for resource in resources:
        plugin = ResourcePlugin(
            resource, state, config=config, pods=pods, vgpus=vgpus, metrics=metrics
        )
        srv = PluginServer(
            plugin,
            Path(settings.kubelet_dir),
            kubelet_socket=settings.kubelet_socket,
            retry_max_s=settings.register_retry_max_s,
        )
        plugins[resource] = srv
        tasks.append(spawn(srv.run(), name=f"deviceplugin.plugin.{resource}", on_death=on_death))

    drasrv: DraServer | None = None
    slices: SlicePublisher | None = None
    if settings.mode != "deviceplugin":
        if kube is None:
            kube = KubeClient.from_config(settings.kubeconfig)
        drasrv = dra_server(
            DraDriver(
                state,
                claims or KubeClaims(kube),
                cdi_dir=settings.cdi_dir,
                checkpoint_dir=settings.dra_checkpoint_dir,
                layout=settings.layout(),
                vgpus=vgpus,
                metrics=metrics,
            ),
            settings.dra_plugins_dir,
            settings.dra_registry_dir,
            metrics,
        )
        slices = SlicePublisher(kube, state, metrics, retry_max_s=settings.register_retry_max_s)
        tasks.append(spawn(drasrv.run(), name="deviceplugin.dra", on_death=on_death))
        tasks.append(spawn(slices.run(), name="deviceplugin.slices", on_death=on_death))

    server: uvicorn.Server | None = None
    if http:
        app = create_app(
            state, vgpus, metrics, settings.resources, bus,
            unregistered=(
                (lambda: unregistered(plugins, drasrv)) if settings.ready_when_registered
                else lambda: None
            ),
        )  # fmt: skip
        server, http_task = await start_http(
            app, settings.http_host, settings.http_port, name="deviceplugin.http",
            on_death=on_death, cert_dir=settings.http_cert_dir,
        )  # fmt: skip
        tasks.append(http_task)
    log.info(
        "device plugin started",
        extra={
            "node": settings.node_name,
            "mode": settings.mode,
            "resources": resources,
            "restored": restored,
        },
    )
    return Running(
        settings,
        state,
        vgpus,
        metrics,
        plugins,
        bus,
        kube,
        server,
        tasks,
        running_died,
        drasrv,
        slices,
        pod_resources,
    )


async def _reconcile(informer: Informer, vgpus: VgpuRegistry) -> None:
    """Once the pod list is complete, release vGPUs of pods deleted while we were away."""
    await informer.synced.wait()
    live = {(p.get("metadata") or {}).get("uid", "") for p in informer.values()}
    gone = vgpus.reconcile(live)
    if gone:
        log.info("released vGPUs of vanished pods", extra={"vgpus": gone})


async def serve(settings: DevicePluginSettings) -> int:
    """Run until SIGTERM/SIGINT or until a part dies (then exit non-zero)."""
    setup_logging(settings.log_level, settings.log_json)
    running = await start(settings)
    died = await until_stopped(running.died)
    await running.stop()
    return 1 if died else 0
