"""Event subscribers of the device plugin: GPU health, GPU inventory, pod utilisation.

- `GpuHealthChanged` for this node (JetStream, a durable consumer per node): folded into the
  node state, which wakes every ListAndWatch stream when a GPU's health flips.
- The node's `GpuInventory` (a watch on its KV key): the GPUs and topology devices are made of.
- `PodMetric` for this node (core NATS): a fractional pod's measured utilisation, forwarded
  to its shims, whose launch throttles need it to hold the compute share.
- Pods of this node (an informer): a deleted or finished pod's vGPUs are released.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.js.kv import KeyValue

from alnair.common.bus import Bus
from alnair.common.busauth import deviceplugin_durable
from alnair.common.delivery import Subscription
from alnair.common.events import (
    DecodeError,
    Envelope,
    GpuHealthChanged,
    GpuInventory,
    PodMetric,
    subject_token,
)
from alnair.common.informer import WatchEvent
from alnair.common.kube import Obj
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.registry import VgpuRegistry
from alnair.deviceplugin.state import NodeDevices

log = logging.getLogger(__name__)

HealthHandler = Callable[[GpuHealthChanged, Envelope[GpuHealthChanged]], Awaitable[None]]
MetricHandler = Callable[[PodMetric, Envelope[PodMetric]], Awaitable[None]]


def durable_name(node: str) -> str:
    """Its durable on the HEALTH stream: the one its node's bus identity may use (busauth)."""
    return deviceplugin_durable(node)


def health_handler(state: NodeDevices, metrics: DevicePluginMetrics) -> HealthHandler:
    async def on_health(event: GpuHealthChanged, envelope: Envelope[GpuHealthChanged]) -> None:
        status = state.apply_health(event)
        metrics.health_events.labels(status.outcome.value).inc()
        log.info(
            "GPU health observed",
            extra={
                "gpu": event.gpu_uuid,
                "healthy": event.healthy,
                "reason": event.reason,
                "outcome": status.outcome.value,
                "event_id": envelope.id,
            },
        )

    return on_health


def utilization_handler(vgpus: VgpuRegistry, metrics: DevicePluginMetrics) -> MetricHandler:
    async def on_metric(event: PodMetric, envelope: Envelope[PodMetric]) -> None:
        for rec in vgpus.for_pod(event.namespace, event.pod):
            if rec.compute_pct is None:
                continue
            if event.gpu_index is not None and event.gpu_index != rec.gpu_index:
                continue
            # SM activity is what the share limits; a sampler without it reports GPU busy time
            pct = event.sm_util_pct if event.sm_util_pct > 0 else event.gpu_util_pct
            sent = await vgpus.send_utilization(rec.vgpu_id, pct)
            metrics.utilization_forwarded.inc(sent)

    return on_metric


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def pod_cleanup_handler(vgpus: VgpuRegistry) -> Callable[[WatchEvent, Obj, Obj | None], None]:
    def on_pod(event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        phase = (pod.get("status") or {}).get("phase", "")
        if event is WatchEvent.DELETED or phase in TERMINAL_PHASES:
            uid = (pod.get("metadata") or {}).get("uid", "")
            gone = vgpus.forget_pod(uid)
            if gone:
                log.info("pod ended: vGPUs released", extra={"pod_uid": uid, "vgpus": gone})

    return on_pod


async def subscribe_health(
    bus: Bus, state: NodeDevices, metrics: DevicePluginMetrics
) -> Subscription:
    return await bus.subscribe(
        GpuHealthChanged,
        health_handler(state, metrics),
        durable=durable_name(state.node),
        subject=f"{GpuHealthChanged.SUBJECT_PREFIX}.{subject_token(state.node)}.>",
        max_in_flight=1,  # health of one GPU must be applied in order
    )


async def subscribe_utilization(
    bus: Bus, node: str, vgpus: VgpuRegistry, metrics: DevicePluginMetrics
) -> Subscription:
    return await bus.subscribe(
        PodMetric,
        utilization_handler(vgpus, metrics),
        durable=durable_name(node),
        subject=f"{PodMetric.SUBJECT_PREFIX}.{subject_token(node)}",
    )


async def watch_inventory(kv: KeyValue, state: NodeDevices) -> None:
    """Follow this node's inventory key until cancelled."""
    watcher = await kv.watch(subject_token(state.node))
    try:
        async for entry in watcher:
            if entry is None or not entry.value:
                continue  # the end-of-history marker, or a deleted key
            try:
                inventory = GpuInventory.read(entry.key, entry.value)
            except DecodeError as exc:
                log.error("GPU inventory refused", extra={"error": str(exc)})
                continue
            statuses = state.set_inventory(inventory)
            log.info(
                "GPU inventory",
                extra={
                    "gpus": len(inventory.gpus),
                    "unhealthy": [s.gpu_uuid for s in statuses if not s.healthy],
                },
            )
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
