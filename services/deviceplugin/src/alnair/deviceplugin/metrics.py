"""Prometheus metrics of the device plugin (`alnair_deviceplugin_*`), in an injected registry.

Besides the plugin's own counters, a collector reports every vGPU's accounting region as it
is at scrape time (limit, used, peak, refusals, launches, throttled time, live processes), so
per-container GPU memory use reaches Prometheus with no sampling loop anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from alnair.common.metrics import Metrics
from alnair.deviceplugin.registry import VgpuRegistry

SERVICE = "deviceplugin"


class DevicePluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics(SERVICE, registry)
        self.registry = m.registry
        self.prefix = m.prefix
        self.devices = m.gauge(
            "devices", "Devices advertised to the kubelet", ["resource", "health"]
        )
        self.allocations = m.counter(
            "allocations", "Containers granted devices", ["resource", "placement"]
        )
        self.allocation_errors = m.counter(
            "allocation_errors", "Allocate requests refused", ["resource", "reason"]
        )
        self.preferred = m.counter(
            "preferred_allocations", "GetPreferredAllocation answers", ["resource"]
        )
        self.registrations = m.counter(
            "registrations", "Register calls to the kubelet", ["resource", "outcome"]
        )
        self.list_sends = m.counter(
            "list_and_watch_sends", "Device lists sent on ListAndWatch streams", ["resource"]
        )
        self.health_events = m.counter(
            "health_events", "GPU health observations by outcome", ["outcome"]
        )
        self.utilization_forwarded = m.counter(
            "utilization_forwarded", "Utilisation measurements forwarded to shims"
        )
        self.dra_claims = m.counter(
            "dra_claims", "DRA claims prepared or unprepared, by outcome", ["operation", "outcome"]
        )
        self.dra_slice_publishes = m.counter(
            "dra_slice_publishes", "ResourceSlice writes, by outcome", ["outcome"]
        )
        self.dra_registrations = m.counter(
            "dra_registrations", "Kubelet plugin-registration outcomes", ["outcome"]
        )

    def watch_vgpus(self, vgpus: VgpuRegistry) -> None:
        self.registry.register(VgpuCollector(vgpus, self.prefix))


class VgpuCollector(Collector):
    """Reads every vGPU's region when scraped."""

    def __init__(self, vgpus: VgpuRegistry, prefix: str) -> None:
        self.vgpus = vgpus
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        labels = ["vgpu", "namespace", "pod", "container", "gpu"]
        p = self.prefix
        limit = GaugeMetricFamily(p + "vgpu_memory_limit_bytes", "vGPU memory limit", labels=labels)
        used = GaugeMetricFamily(p + "vgpu_memory_used_bytes", "vGPU memory in use", labels=labels)
        peak = GaugeMetricFamily(p + "vgpu_memory_peak_bytes", "vGPU memory peak", labels=labels)
        procs = GaugeMetricFamily(
            p + "vgpu_processes", "Processes registered with the vGPU registry", labels=labels
        )
        ooms = CounterMetricFamily(
            p + "vgpu_memory_refusals", "Allocations refused at the limit", labels=labels
        )
        launches = CounterMetricFamily(
            p + "vgpu_throttled_launches", "Kernel launches under a compute limit", labels=labels
        )
        throttled = CounterMetricFamily(
            p + "vgpu_throttled_seconds",
            "Time launches waited for the compute share",
            labels=labels,
        )
        for rec in self.vgpus.records():
            values = [rec.vgpu_id, rec.namespace, rec.pod, rec.container, str(rec.gpu_index)]
            procs.add_metric(values, len(self.vgpus.connections(rec.vgpu_id)))
            snap = self.vgpus.usage(rec.vgpu_id)
            if snap is None:
                continue
            dev = snap.device(0)
            limit.add_metric(values, dev.limit_bytes)
            used.add_metric(values, dev.used_bytes)
            peak.add_metric(values, dev.peak_bytes)
            ooms.add_metric(values, dev.oom_count)
            launches.add_metric(values, dev.launches)
            throttled.add_metric(values, dev.throttled_ns / 1e9)
        yield from (limit, used, peak, procs, ooms, launches, throttled)
