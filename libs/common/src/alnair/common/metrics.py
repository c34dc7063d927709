"""Prometheus helpers: one registry per service, a common name prefix, fixed label sets.

Services build their metrics in their own `metrics.py` against an injected `CollectorRegistry`
(tests get a fresh one, so counts never leak between tests) through `Metrics`, which prefixes
every name with `alnair_<service>_`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "render"]


class Metrics:
    """Factory for one service's metrics in one registry."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.prefix = f"alnair_{service}_"
        self.registry = registry if registry is not None else CollectorRegistry()

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(self.prefix + name, doc, labelnames=labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self.prefix + name, doc, labelnames=labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        return Histogram(
            self.prefix + name, doc, labelnames=labels, registry=self.registry, buckets=buckets
        )


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry` (serve it with CONTENT_TYPE_LATEST)."""
    return generate_latest(registry)
