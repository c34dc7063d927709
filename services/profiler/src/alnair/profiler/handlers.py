"""Event subscribers of the profiler: the aggregator's pod-metric consumer.

Pod metrics travel on core NATS (they are samples: the next one is a second away), so the
subscription is a queue group named by the durable: several aggregator replicas share the
stream instead of each folding every sample. Folding is idempotent per (pod, tick) only for
CPU/memory, so exactly one replica must see each sample; the queue group guarantees that.

Pod summaries (one per pod run, published by the agent when the pod ends) come through a
durable JetStream consumer: a summary is what remains of a run whose samples were lost, so an
aggregator that is down when it is published must still get it.
"""

from __future__ import annotations

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.events import PodMetric, PodSummary
from alnair.profiler.aggregator.aggregator import Aggregator


async def subscribe_pod_metrics(bus: Bus, aggregator: Aggregator, durable: str) -> Subscription:
    return await bus.subscribe(
        PodMetric, aggregator.on_pod_metric, durable=durable, max_in_flight=64
    )


async def subscribe_pod_summaries(bus: Bus, aggregator: Aggregator, durable: str) -> Subscription:
    return await bus.subscribe(
        PodSummary, aggregator.on_pod_summary, durable=f"{durable}-summaries", max_in_flight=16
    )
