"""Prometheus metrics of the dispatcher (prefix `alnair_dispatcher_`), in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from alnair.common.metrics import Metrics

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)


class DispatcherMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics("dispatcher", registry)
        self.registry = m.registry
        self.queue_depth = m.gauge("queue_depth", "Pending jobs per ClusterQueue", ["queue"])
        self.admitted = m.gauge(
            "admitted_jobs", "Admitted, unfinished jobs per ClusterQueue", ["queue"]
        )
        self.wait_seconds = m.histogram(
            "wait_seconds",
            "Job creation to admission, per ClusterQueue",
            ["queue"],
            buckets=WAIT_BUCKETS,
        )
        self.decisions = m.counter(
            "decisions_total",
            "Decisions applied, by policy and kind (admitted, borrowing, preempted)",
            ["policy", "decision"],
        )
        self.waiting = m.gauge("waiting_jobs", "Pending jobs by wait reason", ["reason"])
        self.reconcile_seconds = m.histogram(
            "reconcile_seconds",
            "One reconcile: snapshot, policy, writes",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.outside_gpus = m.gauge(
            "outside_gpus",
            "GPUs held by bound pods no admitted workload owns (taken off the free pool), by model",
            ["model"],
        )
        self.prediction_errors = m.counter(
            "prediction_errors_total", "Predictor answers refused or missing"
        )
        self.write_conflicts = m.counter(
            "write_conflicts_total", "Admissions skipped because the Job changed meanwhile"
        )
        self.write_refusals = m.counter(
            "write_refusals_total",
            "Decisions the API server refused on one workload (it gets a Warning Event)",
        )
        self.not_ready_evictions = m.counter(
            "pods_not_ready_evictions_total",
            "Admissions taken back because the workload's pods were not all ready in time",
        )
        self.webhook_requests = m.counter(
            "webhook_requests_total",
            "Admission reviews answered, by outcome (held, ignored, refused, valid, invalid)",
            ["outcome"],
        )


class HubMetrics:
    """The hub's own metrics beside the dispatcher's (same registry and prefix)."""

    def __init__(self, base: DispatcherMetrics) -> None:
        m = Metrics("dispatcher", base.registry)
        self.worker_up = m.gauge(
            "worker_up", "1 while a worker cluster answers, 0 when it does not", ["cluster"]
        )
        self.worker_gpus = m.gauge(
            "worker_gpus", "GPUs of a worker cluster, by state (total, free)", ["cluster", "state"]
        )
        self.worker_jobs = m.gauge(
            "worker_jobs", "Mirrored jobs on a worker cluster, by state", ["cluster", "state"]
        )
        self.worker_problems = m.gauge(
            "worker_problems",
            "Worker Secrets or clusters with a problem, by kind (invalid, unreachable, "
            "unauthorized)",
            ["kind"],
        )
        self.placements = m.counter("placements_total", "Jobs placed, per cluster", ["cluster"])
        self.redispatched = m.counter(
            "redispatched_total", "Not-started jobs taken back from a lost cluster", ["cluster"]
        )
        self.lost_contact = m.gauge(
            "lost_contact_jobs", "Running jobs on clusters that do not answer"
        )
