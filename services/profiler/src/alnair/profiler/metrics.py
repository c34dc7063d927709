"""The profiler's Prometheus metrics (prefix `alnair_profiler_`), in an injected registry.

Per-pod GPU gauges carry (namespace, pod, node, gpu_uuid) so that two pods sharing one GPU
are two series with their own numbers; a pod's series are removed when the pod stops
reporting, so Prometheus does not keep showing a finished pod at its last value.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry

from alnair.common.events import PodMetric
from alnair.common.metrics import Metrics

POD_GPU_LABELS = ("namespace", "pod", "node", "gpu_uuid")
POD_LABELS = ("namespace", "pod", "node")


class ProfilerMetrics:
    """Every metric the agent and the aggregator export."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics("profiler", registry)
        self.registry = m.registry
        self.bus_auth = m.counter(
            "bus_auth_decisions",
            "bus-auth: node component connections admitted or refused",
            ["outcome"],
        )
        self.pod_gpu_util = m.gauge(
            "pod_gpu_util_pct", "GPU utilization attributed to the pod", POD_GPU_LABELS
        )
        self.pod_gpu_mem = m.gauge(
            "pod_gpu_mem_used_mib", "GPU memory used by the pod", POD_GPU_LABELS
        )
        self.pod_sm_util = m.gauge(
            "pod_sm_util_pct", "SM utilization of the pod's processes", POD_GPU_LABELS
        )
        self.pod_cpu = m.gauge("pod_cpu_util_cores", "CPU cores used by the pod", POD_LABELS)
        self.pod_mem = m.gauge("pod_mem_used_mib", "memory used by the pod", POD_LABELS)
        self.gpu_util = m.gauge("gpu_util_pct", "device GPU utilization", ("node", "gpu_uuid"))
        self.gpu_mem = m.gauge("gpu_mem_used_mib", "device GPU memory used", ("node", "gpu_uuid"))
        self.gpu_healthy = m.gauge("gpu_healthy", "1 when the GPU is healthy", ("node", "gpu_uuid"))
        self.samples = m.counter("pod_metrics_published", "pod-metric events published", ("node",))
        self.received = m.counter(
            "pod_metrics_received", "pod-metric events folded by the aggregator"
        )
        self.health_changes = m.counter(
            "health_changes", "GPU health changes published", ("healthy",)
        )
        self.records = m.counter("records_written", "execution records written (once per job)")
        self.unprofiled_records = m.counter(
            "records_unprofiled",
            "records written without usage: no sample of the job reached the aggregator",
        )
        self.summaries = m.counter("pod_summaries_published", "pod summaries stored by JetStream")
        self.summaries_folded = m.counter(
            "pod_summaries_folded", "pod summaries folded by the aggregator"
        )
        self.completions = m.counter("job_completions", "job completions handled", ("outcome",))
        self._pod_series: dict[tuple[str, str], set[tuple[str, str, str, str]]] = {}

    def observe_pod(self, metric: PodMetric) -> None:
        key = (metric.namespace, metric.pod)
        gpu = metric.gpu_uuid or ""
        labels = (metric.namespace, metric.pod, metric.node, gpu)
        self._pod_series.setdefault(key, set()).add(labels)
        if metric.gpu_uuid is not None:
            self.pod_gpu_util.labels(*labels).set(metric.gpu_util_pct)
            self.pod_gpu_mem.labels(*labels).set(metric.gpu_mem_used_mib)
            self.pod_sm_util.labels(*labels).set(metric.sm_util_pct)
        self.pod_cpu.labels(*labels[:3]).set(metric.cpu_util_cores)
        self.pod_mem.labels(*labels[:3]).set(metric.mem_used_mib)

    def forget_pod(self, namespace: str, pod: str) -> None:
        for labels in self._pod_series.pop((namespace, pod), set()):
            for gauge in (self.pod_gpu_util, self.pod_gpu_mem, self.pod_sm_util):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
            for gauge in (self.pod_cpu, self.pod_mem):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels[:3])

    def pods(self) -> set[tuple[str, str]]:
        return set(self._pod_series)
