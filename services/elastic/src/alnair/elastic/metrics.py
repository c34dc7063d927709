"""The controller's Prometheus metrics (prefix `alnair_elastic_`), in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from alnair.common.metrics import Metrics


class ElasticMetrics:
    """Every metric the controller exports, with fixed label sets."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics("elastic", registry)
        self.registry = m.registry
        self.resizes = m.counter(
            "resizes_total",
            "StatefulSet replica changes by direction (grow, shrink).",
            ("direction",),
        )
        self.scale_requests = m.counter(
            "scale_requests_total",
            "Scale requests received, by outcome (applied, refused, duplicate).",
            ["outcome"],
        )
        self.reconciles = m.counter(
            "reconciles_total", "Reconcile passes by result (ok, invalid, error).", ["result"]
        )
        self.reconcile_seconds = m.histogram(
            "reconcile_duration_seconds",
            "Wall time of one reconcile pass.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.jobs = m.gauge("jobs", "ElasticJobs by phase.", ["phase"])
