"""Prometheus metrics of the scheduler (prefix `alnair_scheduler_`), in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from alnair.common.metrics import Metrics

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics("scheduler", registry)
        self.registry = m.registry
        self.attempts = m.counter(
            "schedule_attempts_total", "Scheduling cycles by result", ["result"]
        )
        self.algorithm_seconds = m.histogram(
            "algorithm_duration_seconds", "Time in the plugin framework per cycle",
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.e2e_seconds = m.histogram(
            "pod_scheduling_seconds", "Pod creation to successful binding",
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.binds = m.counter("binds_total", "Binding requests by result", ["result"])
        self.binds_in_flight = m.gauge("binds_in_flight", "Binding requests in flight")
        self.queue_depth = m.gauge("queue_depth", "Pending pods by queue", ["queue"])
        self.preemptions = m.counter("preemption_victims_total", "Pods evicted by preemption")
        self.preemption_failures = m.counter(
            "preemption_failures_total", "Preemptions undone because a victim's delete failed"
        )
        self.gang_timeouts = m.counter("gang_timeouts_total", "Gangs released after timeout")
        self.events_dropped = m.counter("events_dropped_total", "Events not written (overload)")
        self.reserved_nodes = m.gauge("reserved_nodes", "Nodes reserved for starving pods")
        self.leader = m.gauge("is_leader", "1 when this replica is the active scheduler")
