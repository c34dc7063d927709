"""Event subscribers of the profiler: the aggregator's pod-metric consumer.

Pod metrics travel on core NATS (they are samples: the next one is a second away), so the
subscription is a queue group named by the durable: several aggregator replicas share the
stream instead of each folding every sample. Folding is idempotent per (pod, tick) only for
CPU/memory, so exactly one replica must see each sample; the queue group guarantees that.
"""

from __future__ import annotations

from alnair.common.bus import Bus, Subscription
from alnair.common.events import PodMetric
from alnair.profiler.aggregator import Aggregator


async def subscribe_pod_metrics(bus: Bus, aggregator: Aggregator, durable: str) -> Subscription:
    return await bus.subscribe(
        PodMetric, aggregator.on_pod_metric, durable=durable, max_in_flight=64
    )
