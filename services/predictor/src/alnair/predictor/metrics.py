"""The predictor's Prometheus metrics (prefix `alnair_predictor_`), in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from alnair.common.metrics import Metrics


class PredictorMetrics:
    """Every metric the predictor exports, with fixed label sets."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = Metrics("predictor", registry)
        self.registry = m.registry
        self.requests = m.counter(
            "requests_total",
            "Prediction requests answered, by endpoint, transport and outcome.",
            ["endpoint", "transport", "outcome"],
        )
        self.low_confidence = m.counter(
            "low_confidence_total",
            "Predictions flagged low-confidence (job or GPU type never measured).",
            ["endpoint"],
        )
        self.retrains = m.counter(
            "retrains_total",
            "Retraining attempts by result: promoted, rejected (failed validation) or error.",
            ["result"],
        )
        self.retrain_seconds = m.histogram(
            "retrain_duration_seconds",
            "Wall time of one retrain, validation included.",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300),
        )
        self.model_version = m.gauge("model_version", "Version of the model now serving.")
        self.training_records = m.gauge(
            "training_records", "Execution records the serving model was trained on."
        )
        self.records_skipped = m.gauge(
            "records_skipped",
            "Execution records the last retrain could not learn from, by offending field.",
            ["field"],
        )
        self.absorbed = m.counter(
            "measurements_absorbed_total",
            "New (job, GPU type, count) measurements served at once, before any retrain.",
        )
        self.colocation_table_version = m.gauge(
            "colocation_table_version",
            "Model version of the co-location table last published for the binder.",
        )
        self.completions = m.counter(
            "job_completions_total", "Job-completed events received (each may trigger a retrain)."
        )
