"""Malformed and hostile pods never stop the scheduler (issue 16): absurd GPU counts, shares
outside 1-100 %, unknown GPU models and more GPU memory than any GPU holds each get a Warning
Event naming the bad field and value; pods with nonsense annotations (a duration of
"forever", NUL bytes, an epoch of -1e309) or annotations near the API's size limit are
simply placed; and a normal pod submitted after them all is still bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import EVENTS, PODS, KubeClient
from alnair.dev.builders import make_pod
from alnair.dev.localstack import ControlPlane
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.e2e


@pytest.fixture
async def scheduler(kube: KubeClient) -> AsyncIterator[Scheduler]:
    sched = Scheduler(
        kube,
        SchedulerSettings(
            leader_elect=False, nats_enabled=False, identity=f"hostile-{uuid.uuid4().hex[:6]}"
        ),
    )
    await sched.start_watching()
    loop = asyncio.create_task(sched.run())
    yield sched
    assert not loop.done(), "the scheduling loop ended"
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    await sched.stop()


def hostile_pods(namespace: str, pool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(invalid pods, odd but valid pods), by name."""

    def pod(name: str) -> Any:
        return make_pod(name, namespace).pool(pool)

    absurd = pod("absurd-gpus").gpus(1_000_000).obj()
    share = pod("share-500").fraction(500, 1024).obj()
    model = pod("unknown-model").gpus(1).obj()
    model["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "Z9000,<script>"
    nonsense = pod("nonsense-annotations").gpus(1).obj()
    nonsense["metadata"]["annotations"].update(
        {r.ANN_DURATION: "forever", "alnair.io/model-name": "\x00" * 3, "epoch": "-1e309"}
    )
    huge = pod("huge-annotations").gpus(1).obj()
    huge["metadata"]["annotations"]["alnair.io/blob"] = "x" * 200_000  # under the 256 KiB cap
    memory = pod("huge-memory").fraction(10, 10**9).obj()
    invalid = {p["metadata"]["name"]: p for p in (absurd, share, model, memory)}
    return invalid, {p["metadata"]["name"]: p for p in (nonsense, huge)}


async def warnings_for(kube: KubeClient, ns: str, name: str) -> list[str]:
    items = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={name}"))["items"]
    return [f"{e['reason']}: {e['message']}" for e in items if e["type"] == "Warning"]


async def test_hostile_pods_get_events_and_do_not_stop_scheduling(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    pool = f"h{uuid.uuid4().hex[:5]}"
    await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=pool, labels={"alnair.io/test-pool": pool}
    )
    bad, odd = hostile_pods(namespace, pool)
    for body in [*bad.values(), *odd.values()]:
        await kube.create(PODS, body, namespace)
    await kube.create(PODS, make_pod("normal", namespace).gpus(1).pool(pool).obj(), namespace)

    try:
        async with asyncio.timeout(30):
            while True:
                normal = await kube.get(PODS, "normal", namespace)
                warned = {n: await warnings_for(kube, namespace, n) for n in bad}
                if normal["spec"].get("nodeName") and all(warned.values()):
                    break
                await asyncio.sleep(0.3)
    except TimeoutError as exc:
        bound = normal["spec"].get("nodeName")
        raise AssertionError(f"normal bound: {bound}; warnings: {warned}") from exc
    for name in bad:
        pod = await kube.get(PODS, name, namespace)
        assert not pod["spec"].get("nodeName"), f"{name} was bound"
    expected = {
        "absurd-gpus": "1000000",
        "share-500": "percent of one GPU",
        "unknown-model": "Z9000",
        "huge-memory": "more than one GPU holds",
    }
    for name, text in expected.items():
        assert any(w.startswith("InvalidRequest") and text in w for w in warned[name]), warned
    for name in odd:
        assert (await kube.get(PODS, name, namespace))["spec"].get("nodeName"), name
    assert all(scheduler.informers()[i].healthy for i in range(4))


async def test_a_pod_another_scheduler_bound_holds_its_gpus_even_when_unreadable(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    """A pod bound by someone else (here: created with `nodeName`, as kube-scheduler's bind
    leaves it) asking for a GPU model no node has holds all 8 GPUs of its V100 node: an Alnair
    pod for that node waits instead of being bound onto them, and the foreign pod gets a
    Warning saying what Alnair counts it as (issue 24)."""
    pool = f"f{uuid.uuid4().hex[:5]}"
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:8", kube=kube, prefix=pool, labels={"alnair.io/test-pool": pool}
    )
    foreign = make_pod("foreign", namespace).gpus(8).scheduler("default-scheduler").obj()
    foreign["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "B200"
    foreign["spec"]["nodeName"] = node
    await kube.create(PODS, foreign, namespace)

    async def warned() -> list[str]:
        return [w for w in await warnings_for(kube, namespace, "foreign") if "Unreadable" in w]

    async with asyncio.timeout(20):
        while not (said := await warned()):
            await asyncio.sleep(0.2)
    assert "holding 8 GPU(s)" in said[0] and "B200" in said[0], said
    await kube.create(PODS, make_pod("mine", namespace).gpus(1).pool(pool).obj(), namespace)
    async with asyncio.timeout(20):
        while not await warnings_for(kube, namespace, "mine"):
            await asyncio.sleep(0.2)
    assert not (await kube.get(PODS, "mine", namespace))["spec"].get("nodeName")
    await kube.delete(PODS, "foreign", namespace)
    async with asyncio.timeout(20):
        while not (await kube.get(PODS, "mine", namespace))["spec"].get("nodeName"):
            await asyncio.sleep(0.2)
