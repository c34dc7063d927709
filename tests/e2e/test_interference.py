"""Issue 27: the live binder keeps fractions away from neighbours the predictor says they hurt.

Real parts throughout: the local control plane with KWOK nodes, nats-server with JetStream,
redis-server, the predictor service trained on Gavel's measurements (it publishes its
co-location table to the KV bucket on start), the scheduler following that table. The pairs
are Gavel's job types: a recommendation model next to ResNet-50 keeps about 1% of its speed
on a V100 (predicted 91x slower), and two ResNet-50s are predicted 3.4x slower each, both past
the default 2.5x cap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.kube import PODS, KubeClient
from alnair.dev.builders import make_pod
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.predictor.app import start as start_predictor
from alnair.predictor.settings import PredictorSettings
from alnair.scheduler import handlers
from alnair.scheduler.live.scheduler import Scheduler
from scheduler_support import Running, bound_node, events_for, pool, seen_ready

pytestmark = pytest.mark.e2e

SLOW = "co-location predicted past 2.5x slowdown"


@pytest.fixture
async def scheduler_with_table(
    kube: KubeClient, nats_url: str, redis_url: str
) -> AsyncIterator[Scheduler]:
    predictor = await start_predictor(
        PredictorSettings(
            nats_url=nats_url, redis_url=redis_url, http_host="127.0.0.1", http_port=0,
            log_json=False,
        ),
        CollectorRegistry(),
    )  # fmt: skip
    running = Running(kube)
    scheduler = await running.start()
    bus = await Bus.connect(nats_url, name="scheduler-interference-test")
    watch = asyncio.create_task(handlers.watch_colocation(bus, scheduler))
    try:
        version = predictor.retrainer.current.version if predictor.retrainer.current else -1

        async def table_in_force() -> bool:
            table = scheduler.colocation.table
            return table is not None and table.model_version == version

        await wait_for(table_in_force, 30, 0.1)
        yield scheduler
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await bus.close()
        await running.stop()
        await predictor.stop()


def half(name: str, namespace: str, model: str, batch: int) -> dict[str, object]:
    return make_pod(name, namespace).pool(namespace).fraction(50).trains(model, batch).obj()


async def test_a_fraction_predicted_to_hurt_its_neighbour_goes_elsewhere_or_waits(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    scheduler_with_table: Scheduler,
) -> None:
    scheduler = scheduler_with_table
    nodes = await pool(control_plane, kube, "2x V100M16:1", namespace)
    await seen_ready(scheduler, nodes)

    await kube.create(PODS, half("rn", namespace, "resnet50", 16), namespace)
    first = await wait_for(lambda: bound_node(kube, namespace, "rn"), 20)
    # Packing would put it on rn's half-used GPU; the model says rn would be crushed there.
    await kube.create(PODS, half("rec", namespace, "recommendation", 512), namespace)
    second = await wait_for(lambda: bound_node(kube, namespace, "rec"), 20)
    assert {first, second} == set(nodes)

    # Both GPUs now have half free, and a second ResNet-50 is refused beside either job.
    await kube.create(PODS, half("rn2", namespace, "resnet50", 16), namespace)
    events = await wait_for(lambda: events_for(kube, namespace, "rn2", "FailedScheduling"), 20)
    assert SLOW in events[0]["message"], events[0]["message"]
    assert await bound_node(kube, namespace, "rn2") is None
    explained = scheduler.explain(namespace, "rn2")
    assert explained["filtered"] == {nodes[0]: SLOW, nodes[1]: SLOW}, explained

    # The recommendation job ends: its GPU is no longer refused, and rn2 lands there.
    await kube.delete(PODS, "rec", namespace, grace_period_s=0)
    assert await wait_for(lambda: bound_node(kube, namespace, "rn2"), 20) == second
