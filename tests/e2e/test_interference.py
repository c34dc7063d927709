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
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from alnair.common import resources as r
from alnair.common.bus import Bus
from alnair.common.kube import CLUSTERQUEUES, JOBS, LOCALQUEUES, PODS, KubeClient
from alnair.dev.builders import make_pod
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.predictor.app import start as start_predictor
from alnair.predictor.settings import PredictorSettings
from alnair.scheduler import handlers
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.live.scheduler import Scheduler
from dispatcher_support import (
    POOL,
    admitted_type,
    cluster_queue,
    dispatcher_settings,
    explain,
    gpu_job,
    local_queue,
    scheduler,
)
from scheduler_support import Running, bound_node, events_for, pool, seen_ready, table_published

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
    await table_published(nats_url)
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
    # (Nodes of other tests in the shared control plane fail its node selector.)
    assert {n: explained["filtered"][n] for n in nodes} == dict.fromkeys(nodes, SLOW), explained

    # The recommendation job ends: its GPU is no longer refused, and rn2 lands there.
    await kube.delete(PODS, "rec", namespace, grace_period_s=0)
    assert await wait_for(lambda: bound_node(kube, namespace, "rn2"), 20) == second


def fraction_job(name: str, ns: str, model: str, batch: int) -> dict[str, Any]:
    """A queued Job of one pod asking 8 GiB of a GPU, training `model`."""
    job = gpu_job(name, ns, "ml", 1, model={"model_name": model, "batch_size": str(batch),
                                            "data_size": "50000", "epoch": "1"})  # fmt: skip
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {r.GPU_MEMORY_GIB: "8"}}
    return job


async def test_the_dispatcher_plans_fractions_together_only_where_the_model_allows(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str,
) -> None:  # fmt: skip
    """Two GPUs, four 8 GiB fractions. ResNet-50 and ResNet-18 share well (each about 1.2x
    slower), a recommendation model beside either is predicted past the cap, and so is a
    second one beside it: the dispatcher plans the two ResNets on one GPU (so the first
    recommendation job still finds a GPU) and never the two recommendation jobs together (so
    the second waits). The ResNet-18 job's explanation gives its runtime shared; the binder
    puts the pods where the plan said."""
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:2", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"m-{ns}", None, {"V100M32": 8}))
    await kube.create(LOCALQUEUES, local_queue("ml", ns, f"m-{ns}"), ns)
    predictor = await start_predictor(
        PredictorSettings(nats_url=nats_url, redis_url=redis_url, http_host="127.0.0.1",
                          http_port=0, log_json=False),
        CollectorRegistry(),
    )  # fmt: skip
    await table_published(nats_url)
    bus = await Bus.connect(nats_url, name="binder-tables-test")
    try:
        async with scheduler(kube) as binder:
            watch = asyncio.create_task(handlers.watch_colocation(bus, binder))
            running = await start_dispatcher(
                dispatcher_settings(
                    control_plane, ns, nats_enabled=True, nats_url=nats_url, trials=False
                )
            )
            try:
                await wait_for(lambda: _tables_in(running, binder), 30, 0.1)
                for name, model, batch in (("rn50", "resnet50", 16), ("rn18", "resnet18", 16),
                                           ("rec", "recommendation", 512)):  # fmt: skip
                    await kube.create(JOBS, fraction_job(name, ns, model, batch), ns)
                    assert await wait_for(lambda n=name: admitted_type(kube, ns, n), 30)
                shared = await explain(running, ns, "rn18", lambda d: d["sharing"] is not None)
                planned = shared["sharing"]["V100M32"]
                assert planned["with"] == ["resnet50@16"] and 1.0 < planned["slowdown"] < 1.5
                alone = (await explain(running, ns, "rec", lambda d: True))["sharing"]
                assert alone == {"V100M32": "alone"}

                await kube.create(JOBS, fraction_job("rec2", ns, "recommendation", 512), ns)
                waiting = await wait_for(
                    lambda: explain(running, ns, "rec2", lambda d: d["status"] == "waiting"
                                    and d["reason"] is not None), 20,
                )  # fmt: skip
                assert waiting["reason"]["kind"] in ("capacity", "reservation"), waiting
                assert waiting["sharing"] == {"V100M32": "alone"}
                assert await admitted_type(kube, ns, "rec2") is None

                # The binder follows the same table: the ResNets share a GPU, rec has its own.
                gpus = {n: await wait_for(lambda n=n: _gpu_of(kube, ns, n), 30)
                        for n in ("rn50", "rn18", "rec")}  # fmt: skip
                assert gpus["rn50"] == gpus["rn18"] != gpus["rec"], gpus
            finally:
                await running.stop()
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
    finally:
        await bus.close()
        await predictor.stop()


async def _tables_in(running: Any, binder: Scheduler) -> bool:
    return running.dispatcher.colocation is not None and binder.colocation.table is not None


async def _gpu_of(kube: KubeClient, ns: str, job_name: str) -> tuple[str, str] | None:
    pods = (await kube.list(PODS, ns, label_selector=f"job-name={job_name}"))["items"]
    for pod in pods:
        node = pod["spec"].get("nodeName")
        gpu = (pod["metadata"].get("annotations") or {}).get(r.ANN_GPU_INDICES)
        if node and gpu is not None:
            return (node, gpu)
    return None
