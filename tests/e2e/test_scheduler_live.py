"""The live scheduler on the local control plane: placement, gangs, preemption, explanations."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    LEASES,
    NODES,
    PODDISRUPTIONBUDGETS,
    PODGROUPS,
    PODS,
    Conflict,
    KubeClient,
    NotFound,
)
from alnair.common.tasks import within
from alnair.dev.builders import make_pod, pod_group, priority_classes
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.live.scheduler import Scheduler
from scheduler_support import (
    Running,
    assert_no_overcommit,
    bound_node,
    events_for,
    pods_in,
    pool,
    seen_ready,
)

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def scheduler(kube: KubeClient) -> AsyncIterator[Scheduler]:
    running = Running(kube)
    sched = await running.start()
    yield sched
    await running.stop()


async def test_whole_and_fractional_pods_fit_and_never_overcommit(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    await pool(control_plane, kube, "4x T4:4", namespace)
    specs = [("w", 1)] * 4 + [("w2", 2)] * 2 + [("f", 30)] * 6 + [("f50", 50)] * 4
    for i, (kind, n) in enumerate(specs):
        b = make_pod(f"{kind}-{i}", namespace).pool(namespace)
        b = b.gpus(n) if kind.startswith("w") else b.fraction(n, memory_mib=2000)
        await kube.create(PODS, b.obj(), namespace)

    async def settled() -> list[dict[str, Any]] | None:
        pods = await pods_in(kube, namespace)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return pods if len(bound) == len(specs) else None

    pods = await wait_for(settled, 30)
    assert_no_overcommit(pods, 4)
    fractional = [p for p in pods if p["metadata"]["name"].startswith("f")]
    assert all(p["metadata"]["annotations"][r.ANN_GPU_MILLI] in {"300", "500"} for p in fractional)
    # 8 whole GPUs and 3.8 GPUs of shares in 16 GPUs; packing keeps the shares on few GPUs.
    shared_gpus = {
        (p["spec"]["nodeName"], p["metadata"]["annotations"][r.ANN_GPU_INDICES]) for p in fractional
    }
    assert len(shared_gpus) <= 5


async def test_unschedulable_pod_gets_an_event_naming_the_reasons(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    nodes = await pool(control_plane, kube, "2x V100M32:8", namespace)
    # A node outside the test's pool, so the message names the selector whatever ran before.
    await pool(control_plane, kube, "1x T4:4", f"{namespace}-elsewhere")
    await kube.create(PODS, make_pod("huge", namespace).pool(namespace).gpus(12).obj(), namespace)
    bad = make_pod("both", namespace).pool(namespace).gpus(1).fraction(20).obj()
    await kube.create(PODS, bad, namespace)

    ev = (await wait_for(lambda: events_for(kube, namespace, "huge", "FailedScheduling"), 20))[0]
    assert ev["type"] == "Warning"
    assert "nodes are available" in ev["message"]
    assert "Insufficient whole GPUs" in ev["message"]
    assert "node selector mismatch" in ev["message"]
    pod = await kube.get(PODS, "huge", namespace)
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"

    ev = (await wait_for(lambda: events_for(kube, namespace, "both", "InvalidRequest"), 20))[0]
    assert r.GPU in ev["message"] and "not both" in ev["message"]

    # A GPU going unhealthy is named as such.
    for gpu in range(8):
        scheduler.on_gpu_health(nodes[0], gpu, healthy=False)
    await kube.create(PODS, make_pod("one", namespace).pool(namespace).gpus(8).obj(), namespace)
    bound = await wait_for(lambda: bound_node(kube, namespace, "one"), 20)
    assert bound == nodes[1]
    await kube.create(PODS, make_pod("two", namespace).pool(namespace).gpus(8).obj(), namespace)
    ev = (await wait_for(lambda: events_for(kube, namespace, "two", "FailedScheduling"), 20))[0]
    assert "1 GPU unhealthy" in ev["message"], ev["message"]
    explained = scheduler.explain(namespace, "two")
    assert explained["filtered"][nodes[0]] == "GPU unhealthy"
    for gpu in range(8):
        scheduler.on_gpu_health(nodes[0], gpu, healthy=True)
    assert await wait_for(lambda: bound_node(kube, namespace, "two"), 20) == nodes[0]

    # Required node affinity: pods pinned to nodes[1] go there and only there; the one that no
    # longer fits is told which nodes its affinity excluded.
    await kube.delete(PODS, "one", namespace)
    pinned = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [nodes[1]]}]}
    for name in ("pin-a", "pin-b", "pin-c"):
        pod = make_pod(name, namespace).pool(namespace).gpus(3).obj()
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pinned]}
            }
        }
        await kube.create(PODS, pod, namespace)
    for name in ("pin-a", "pin-b"):
        assert await wait_for(lambda n=name: bound_node(kube, namespace, n), 20) == nodes[1]
    ev = (await wait_for(lambda: events_for(kube, namespace, "pin-c", "FailedScheduling"), 20))[0]
    assert "node affinity mismatch" in ev["message"], ev["message"]
    assert await bound_node(kube, namespace, "pin-c") is None


async def test_gang_waits_until_it_fits_entirely_then_binds(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    await pool(control_plane, kube, "4x V100M32:8", namespace)
    # Half the pool is busy for a few seconds: the 4 x 8-GPU gang must not start partially.
    for i in range(2):
        blocker = make_pod(f"blocker-{i}", namespace).pool(namespace).gpus(8).runs_for(4).obj()
        await kube.create(PODS, blocker, namespace)
    await wait_for(lambda: bound_node(kube, namespace, "blocker-1"), 20)
    await kube.create(PODGROUPS, pod_group("train", namespace, 4, 60), namespace)
    for i in range(4):
        member = make_pod(f"train-{i}", namespace).pool(namespace).gpus(8).gang("train").obj()
        await kube.create(PODS, member, namespace)
    # Every member was tried and refused (its FailedScheduling Event is the proof), and none
    # of them is bound.

    async def all_refused() -> bool:
        return all(
            [await events_for(kube, namespace, f"train-{i}", "FailedScheduling") for i in range(4)]
        )

    assert await wait_for(all_refused, 20)
    pods = {p["metadata"]["name"]: p for p in await pods_in(kube, namespace)}
    assert not any(pods[f"train-{i}"]["spec"].get("nodeName") for i in range(4))
    assert not scheduler.cache.assumed  # nothing reserved while the gang cannot fit whole

    async def all_bound() -> list[str] | None:
        nodes = [await bound_node(kube, namespace, f"train-{i}") for i in range(4)]
        return nodes if all(nodes) else None  # type: ignore[return-value]

    nodes = await wait_for(all_bound, 30)
    assert len(set(nodes)) == 4
    pg = await wait_for(lambda: _pg_phase(kube, namespace, "train", {"Scheduled", "Running"}), 20)
    assert pg["status"]["scheduled"] == 4


async def _pg_phase(
    kube: KubeClient, ns: str, name: str, phases: set[str]
) -> dict[str, Any] | None:
    pg = await kube.get(PODGROUPS, name, ns)
    return pg if (pg.get("status") or {}).get("phase") in phases else None


async def test_two_gangs_competing_for_the_same_gpus_never_deadlock(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    await pool(control_plane, kube, "2x V100M32:8", namespace)
    for g in ("a", "b"):
        await kube.create(PODGROUPS, pod_group(g, namespace, 2, 30), namespace)
    # Interleaved creation: a naive scheduler would give each gang one node and wait forever.
    for i in range(2):
        for g in ("a", "b"):
            pod = make_pod(f"{g}-{i}", namespace).pool(namespace).gpus(8).gang(g).runs_for(3)
            await kube.create(PODS, pod.obj(), namespace)

    async def all_succeeded() -> bool:
        pods = await pods_in(kube, namespace)
        return len(pods) == 4 and all(p["status"].get("phase") == "Succeeded" for p in pods)

    assert await wait_for(all_succeeded, 40)


async def test_timed_out_gang_releases_every_reservation(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    await pool(control_plane, kube, "3x V100M32:8", namespace)
    # A long backoff keeps the released members from reserving again during the checks.
    running = Running(kube, initial_backoff_s=8.0, max_backoff_s=8.0)
    scheduler = await running.start()
    await kube.create(PODGROUPS, pod_group("short", namespace, 3, 2), namespace)
    for i in range(2):  # the third member never comes
        pod = make_pod(f"short-{i}", namespace).pool(namespace).gpus(8).gang("short").obj()
        await kube.create(PODS, pod, namespace)

    async def reserved() -> bool:
        return len(scheduler.gangs.st(f"{namespace}/short").waiting) == 2

    await wait_for(reserved, 10, 0.05)
    assert len(scheduler.cache.assumed) == 2
    pods = await pods_in(kube, namespace)
    assert not any(p["spec"].get("nodeName") for p in pods)
    ev = (await wait_for(lambda: events_for(kube, namespace, "short-0", "GangTimeout"), 10))[0]
    assert "timed out" in ev["message"] and "released" in ev["message"]
    assert not scheduler.cache.assumed
    # Every GPU of the pool is free again: three 8-GPU pods bind.
    for i in range(3):
        await kube.create(
            PODS, make_pod(f"free-{i}", namespace).pool(namespace).gpus(8).obj(), namespace
        )
    for i in range(3):
        assert await wait_for(lambda i=i: bound_node(kube, namespace, f"free-{i}"), 10)
    pg = await kube.get(PODGROUPS, "short", namespace)
    assert pg["status"]["scheduled"] == 0
    assert "timed out" in pg["status"]["message"]
    await running.stop()


async def test_high_priority_pod_preempts_lower_priority_pods(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    await pool(control_plane, kube, "1x T4:4", namespace)
    low_class, high_class = await priority_classes(kube, namespace)
    # low-0 and low-1 are guarded by a PodDisruptionBudget that allows no disruption.
    guard = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    await kube.create(PODDISRUPTIONBUDGETS, guard, namespace)
    for i in range(4):
        low = (
            make_pod(f"low-{i}", namespace).pool(namespace).gpus(1).priority_class(low_class)
        ).obj()
        low["metadata"]["labels"]["app"] = "guarded" if i < 2 else "batch"
        await kube.create(PODS, low, namespace)
    for i in range(4):
        await wait_for(lambda i=i: bound_node(kube, namespace, f"low-{i}"), 20)

    async def counted() -> bool:
        status = (await kube.get(PODDISRUPTIONBUDGETS, "guard", namespace)).get("status") or {}
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 0

    await wait_for(counted, 30)
    # A pending low-priority pod, older than the preemptor, must not take the room being freed.
    waiting = make_pod("waiting", namespace).pool(namespace).gpus(1)
    await kube.create(PODS, waiting.priority_class(low_class).obj(), namespace)
    await wait_for(lambda: _true(any(e.key == f"{namespace}/waiting" for e in _parked(scheduler))))
    high = make_pod("high", namespace).pool(namespace).gpus(2).priority_class(high_class)
    await kube.create(PODS, high.obj(), namespace)
    assert await wait_for(lambda: bound_node(kube, namespace, "high"), 30)
    assert await bound_node(kube, namespace, "waiting") is None
    await wait_for(lambda: _true(len(scheduler.cache.reservations) == 0), 10)
    pods = await pods_in(kube, namespace)
    low_left = sorted(
        p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("low-")
    )
    assert "waiting" in {p["metadata"]["name"] for p in pods}
    # The fewest victims (two 1-GPU pods), and not the ones the budget protects.
    assert low_left == ["low-0", "low-1"]
    assert_no_overcommit(pods, 4)


async def test_restarting_the_scheduler_mid_run_loses_and_double_binds_nothing(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    await pool(control_plane, kube, "4x V100M32:8", namespace)
    first = Running(kube)
    sched = await first.start()
    total = 30
    for i in range(total):
        await kube.create(
            PODS, make_pod(f"p-{i}", namespace).pool(namespace).gpus(1).obj(), namespace
        )
        if i == 12:
            await first.stop()  # mid-run: binds may be in flight
            second = Running(kube)
            sched = await second.start()

    async def all_bound() -> list[dict[str, Any]] | None:
        pods = await pods_in(kube, namespace)
        return pods if all(p["spec"].get("nodeName") for p in pods) and len(pods) == total else None

    pods = await wait_for(all_bound, 30)
    assert_no_overcommit(pods, 8)
    # Every assumed pod is confirmed once the scheduler's own watch sees the binding (which can
    # trail the list above by a moment).
    await wait_for(lambda: _true(len(sched.cache.assumed) == 0), 10)
    await second.stop()


async def test_explain_and_queue_api_and_metrics(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    import httpx

    from alnair.scheduler.api import build_api

    await pool(control_plane, kube, "1x T4:4", namespace)
    await kube.create(PODS, make_pod("big", namespace).pool(namespace).gpus(6).obj(), namespace)
    await kube.create(PODS, make_pod("ok", namespace).pool(namespace).gpus(1).obj(), namespace)
    await wait_for(lambda: bound_node(kube, namespace, "ok"), 20)
    transport = httpx.ASGITransport(app=build_api(scheduler))
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as http:

        async def explained() -> dict[str, Any] | None:
            resp = await http.get(f"/v1/pods/{namespace}/big/explain")
            doc: dict[str, Any] = resp.json()
            return doc if resp.status_code == 200 and "filtered" in doc else None

        doc = await wait_for(explained, 10)
        assert doc["request"]["num_gpu"] == 6
        assert "nodes are available" in doc["message"]
        assert "Insufficient whole GPUs" in doc["filtered"].values()
        missing = await http.get(f"/v1/pods/{namespace}/nope/explain")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        queue = (await http.get("/v1/queue")).json()
        assert any(
            p["pod"] == f"{namespace}/big" and p["state"] == "unschedulable" for p in queue["pods"]
        )
        metrics = (await http.get("/metrics")).text
        assert 'alnair_scheduler_schedule_attempts_total{result="scheduled"}' in metrics
        assert "alnair_scheduler_pod_scheduling_seconds_bucket" in metrics


async def test_leader_election_lets_one_replica_lead(kube: KubeClient, namespace: str) -> None:
    from alnair.common.kube import LEASES
    from alnair.common.leader import LeaderElector

    def elector(identity: str) -> LeaderElector:
        return LeaderElector(
            kube, name="alnair-test", namespace=namespace, identity=identity,
            lease_duration_s=2.0, renew_deadline_s=1.5, retry_period_s=0.3,
        )  # fmt: skip

    a, b = elector("a"), elector("b")
    ta = asyncio.create_task(a.run())
    await within(a.is_leader.wait(), 5)
    tb = asyncio.create_task(b.run())
    # a renews; b looks, sees a holding the Lease, and keeps waiting through three renewals.
    renewals: set[str] = set()

    async def renewed_thrice() -> bool:
        assert not b.is_leader.is_set()
        lease = await kube.get(LEASES, "alnair-test", namespace)
        renewals.add(lease["spec"]["renewTime"])
        return len(renewals) > 3 and b.holder() == "a"

    await wait_for(renewed_thrice, 10, 0.1)
    assert not b.is_leader.is_set()
    ta.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ta
    await a.release()
    await within(b.is_leader.wait(), 5)
    tb.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await tb


async def test_the_shipped_rbac_is_enough_for_the_scheduler_and_no_more(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    from alnair.common.kube import NAMESPACES, NODES, ApiError
    from alnair.common.kubeconfig import KubeConfig
    from alnair.dev.localstack.controlplane import load_manifests

    with contextlib.suppress(Conflict):
        await kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "alnair-system"}},
        )
    for doc in load_manifests(REPO / "deploy/kustomize/base/scheduler/rbac.yaml"):
        await kube.apply(doc)
    token = await kube.service_account_token("alnair-system", "alnair-scheduler")
    assert control_plane.pki is not None
    config = KubeConfig(
        server=control_plane.server, ca_file=str(control_plane.pki.ca_cert), token=token
    )
    await pool(control_plane, kube, "1x T4:4", namespace)
    async with KubeClient(config) as limited:
        running = Running(limited, leader_elect=True, lease_namespace="alnair-system")
        sched = running.scheduler
        await sched.start_watching()
        from alnair.common.leader import LeaderElector

        elector = LeaderElector(
            limited, name="alnair-scheduler-rbac", namespace="alnair-system", identity="rbac-test"
        )
        leading = await elector.try_acquire_or_renew()
        assert leading
        running.task = asyncio.create_task(sched.run())
        await kube.create(PODGROUPS, pod_group("g", namespace, 1, 30), namespace)
        await kube.create(
            PODS, make_pod("ok", namespace).pool(namespace).gpus(1).gang("g").obj(), namespace
        )
        await kube.create(PODS, make_pod("no", namespace).pool(namespace).gpus(9).obj(), namespace)
        assert await wait_for(lambda: bound_node(kube, namespace, "ok"), 20)

        async def reported() -> bool:
            pod = await kube.get(PODS, "no", namespace)
            events = await events_for(kube, namespace, "no")
            conds = pod["status"].get("conditions") or []
            return any(e["reason"] == "FailedScheduling" for e in events) and any(
                c["type"] == "PodScheduled" for c in conds
            )

        assert await wait_for(reported, 20)
        assert await wait_for(lambda: _pg_phase(kube, namespace, "g", {"Scheduled", "Running"}), 20)
        with pytest.raises(ApiError) as denied:
            await limited.delete(NODES, "anything")
        assert denied.value.status == 403
        await running.stop()


async def test_nats_events_drive_the_scheduler(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    scheduler: Scheduler,
    nats_url: str,
) -> None:
    from alnair.common.bus import Bus
    from alnair.common.events import GpuHealthChanged, JobEvent, JobPhase, PodMetric
    from alnair.scheduler import handlers

    nodes = await pool(control_plane, kube, "1x T4:2", namespace)
    bus = await Bus.connect(nats_url, name="test")
    await handlers.subscribe(bus, scheduler, "test-replica")
    await bus.publish(
        GpuHealthChanged(node=nodes[0], gpu_index=1, gpu_uuid="GPU-x", healthy=False, xid=79),
        source="test",
    )
    await wait_for(lambda: _true((nodes[0], 1) in scheduler.cache.unhealthy), 10, 0.05)
    # A pod on GPU 0 (bound as another scheduler would leave it): its samples are its GPU's
    # measured use, and its end makes the GPU idle again.
    busy = make_pod("busy", namespace).gpus(1).obj()
    busy["spec"]["nodeName"] = nodes[0]
    busy["metadata"]["annotations"][r.ANN_GPU_INDICES] = "0"
    uid = (await kube.create(PODS, busy, namespace))["metadata"]["uid"]
    await wait_for(lambda: _true(uid in scheduler.cache.bound), 10, 0.05)
    await bus.publish(
        PodMetric(
            node=nodes[0], namespace=namespace, pod="busy", pod_uid=uid, gpu_index=0,
            gpu_util_pct=87.5,
        ),
        source="test",
    )  # fmt: skip
    await wait_for(lambda: _true(scheduler.cache.util.get((nodes[0], 0)) == 87.5), 10, 0.05)
    await kube.delete(PODS, "busy", namespace, grace_period_s=0)
    await wait_for(lambda: _true((nodes[0], 0) not in scheduler.cache.util), 10, 0.05)

    await kube.create(PODS, make_pod("two", namespace).pool(namespace).gpus(2).obj(), namespace)
    await wait_for(lambda: _true(any(e.key == f"{namespace}/two" for e in _parked(scheduler))), 10)
    # The GPU coming back is an event: the parked pod is retried and binds, nobody polls.
    await bus.publish(
        GpuHealthChanged(node=nodes[0], gpu_index=1, gpu_uuid="GPU-x", healthy=True), source="test"
    )
    assert await wait_for(lambda: bound_node(kube, namespace, "two"), 10)
    before = scheduler.queue.move_seq
    await bus.publish(
        JobEvent(phase=JobPhase.COMPLETED, namespace=namespace, kind="Job", name="j", uid="u"),
        source="test",
    )
    await wait_for(lambda: _true(scheduler.queue.move_seq > before), 10, 0.05)
    await bus.close()


async def _true(value: bool) -> bool:
    return value


def _parked(scheduler: Scheduler) -> list[Any]:
    return [
        scheduler.queue.pods[u] for u in scheduler.queue.unschedulable if u in scheduler.queue.pods
    ]


async def test_a_starving_pod_reserves_a_node_and_lands(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """A 4-GPU pod behind a stream of 1-GPU pods: without the guard each freed GPU goes to the
    next small pod and the large one waits forever; with it, the node is reserved and drains."""
    await pool(control_plane, kube, "1x T4:4", namespace)
    created = 0

    async def feed() -> None:
        nonlocal created
        while True:
            small = make_pod(f"s-{created}", namespace).pool(namespace).gpus(1).runs_for(3)
            await kube.create(PODS, small.obj(), namespace)
            created += 1
            await asyncio.sleep(0.4)

    unguarded = Running(kube, starvation_after_s=0)
    await unguarded.start()
    feeder = asyncio.create_task(feed())
    try:
        await wait_for(lambda: bound_node(kube, namespace, "s-3"), 20)
        big = make_pod("big", namespace).pool(namespace).gpus(4).runs_for(2)
        await kube.create(PODS, big.obj(), namespace)
        after_big = created

        # Starved: six small pods made after the big one are bound (each in a GPU freed
        # meanwhile) while the big one, first in line, never is.
        async def six_overtook() -> bool:
            names = [f"s-{k}" for k in range(after_big, after_big + 6)]
            return all([await bound_node(kube, namespace, n) for n in names])

        assert await wait_for(six_overtook, 30)
        assert await bound_node(kube, namespace, "big") is None
        await unguarded.stop()

        guarded = Running(kube, starvation_after_s=2)
        sched = await guarded.start()
        assert await wait_for(lambda: bound_node(kube, namespace, "big"), 20)
        reserved = await events_for(kube, namespace, "big", "NodeReserved")
        assert reserved and "reserved for this pod" in reserved[0]["message"]
        # Placed, it holds no reservation any more (small pods starving meanwhile may).
        big_key = f"{namespace}/big"
        await wait_for(
            lambda: _true(big_key not in sched.cache.reservations.describe().values()), 10
        )
        feeder.cancel()
        pods = await pods_in(kube, namespace)
        assert_no_overcommit(pods, 4)
        await guarded.stop()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await unguarded.stop()


async def test_multi_gpu_pods_get_the_best_connected_gpus(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    scheduler: Scheduler,
    nats_url: str,
) -> None:
    """The profiler's inventory (NVLink pairs 0-3 and 1-2) reaches the scheduler through the KV
    bucket; 2-GPU pods then get NVLink pairs, not the lowest free indices."""
    from alnair.common.bus import Bus
    from alnair.common.events import GpuDevice, GpuInventory, GpuLink, subject_token
    from alnair.scheduler import handlers

    (node_name,) = await pool(control_plane, kube, "1x V100M32:4", namespace)
    nv, sys_, me = GpuLink.NVLINK, GpuLink.SYS, GpuLink.SELF
    topology = [
        [me, sys_, sys_, nv],
        [sys_, me, nv, sys_],
        [sys_, nv, me, sys_],
        [nv, sys_, sys_, me],
    ]
    inventory = GpuInventory(
        node=node_name,
        gpus=[
            GpuDevice(index=i, uuid=f"GPU-{i}", model="V100M32", memory_mib=32768) for i in range(4)
        ],
        topology=topology,
    )
    bus = await Bus.connect(nats_url, name="test-inventory")
    kv = await bus.kv(GpuInventory.BUCKET)
    await kv.put(subject_token(node_name), inventory.model_dump_json().encode())
    watcher = asyncio.create_task(handlers.watch_inventory(bus, scheduler))
    try:
        await wait_for(lambda: _true(node_name in scheduler.cache.topology), 10, 0.05)
        for name in ("a", "b"):
            pod = make_pod(name, namespace).pool(namespace).gpus(2).obj()
            await kube.create(PODS, pod, namespace)
            assert await wait_for(lambda n=name: bound_node(kube, namespace, n), 20)
        pairs = {
            p["metadata"]["name"]: p["metadata"]["annotations"][r.ANN_GPU_INDICES]
            for p in await pods_in(kube, namespace)
        }
        assert sorted(pairs.values()) == ["0,3", "1,2"], pairs
        # The agent going away (its key deleted) forgets the topology.
        await kv.delete(subject_token(node_name))
        await wait_for(lambda: _true(node_name not in scheduler.cache.topology), 10, 0.05)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await bus.close()


async def test_pod_anti_affinity_spreads_replicas_one_per_node(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    nodes = await pool(control_plane, kube, "3x T4:4", namespace)
    await seen_ready(scheduler, nodes)
    term = {
        "labelSelector": {"matchLabels": {"app": "web"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    for i in range(4):
        pod = make_pod(f"web-{i}", namespace).pool(namespace).gpus(1).obj()
        pod["metadata"]["labels"]["app"] = "web"
        pod["spec"]["affinity"] = {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }
        await kube.create(PODS, pod, namespace)

    async def three_bound() -> list[str] | None:
        placed = [p["spec"].get("nodeName") for p in await pods_in(kube, namespace)]
        found = [n for n in placed if n]
        return found if len(found) == 3 else None

    placed = await wait_for(three_bound, 20)
    assert sorted(placed) == sorted(nodes)  # one per node, though each node has 4 GPUs
    pending = next(
        p["metadata"]["name"]
        for p in await pods_in(kube, namespace)
        if not p["spec"].get("nodeName")
    )
    ev = (await wait_for(lambda: events_for(kube, namespace, pending, "FailedScheduling"), 20))[0]
    assert "3 pod anti-affinity" in ev["message"], ev["message"]


async def test_topology_spread_constraints_balance_zones_and_explain_refusals(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    """Two nodes in zone a, one in zone b, 4 GPUs each: a packing policy would fill one node,
    a hard spread over zones puts two replicas in each zone; a key no node carries is refused
    with the reason on the pod."""
    zone_of: dict[str, str] = {}
    for zone, count in (("a", 2), ("b", 1)):
        names = await control_plane.create_gpu_nodes(
            f"{count}x T4:4",
            kube=kube,
            prefix=f"{namespace}-{zone}",
            labels={"alnair.io/test-pool": namespace, "topology.kubernetes.io/zone": zone},
        )
        zone_of.update(dict.fromkeys(names, zone))
    await seen_ready(scheduler, list(zone_of))

    def spread_pod(name: str, key: str) -> dict[str, Any]:
        pod = make_pod(name, namespace).pool(namespace).gpus(1).obj()
        pod["metadata"]["labels"]["app"] = "web"
        pod["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
        return pod

    for i in range(4):
        await kube.create(PODS, spread_pod(f"web-{i}", "topology.kubernetes.io/zone"), namespace)
        assert await wait_for(lambda n=f"web-{i}": bound_node(kube, namespace, n), 20)
    zones = sorted(
        zone_of[p["spec"]["nodeName"]]
        for p in await pods_in(kube, namespace)
        if p["metadata"]["name"].startswith("web-")
    )
    assert zones == ["a", "a", "b", "b"]

    await kube.create(PODS, spread_pod("nowhere", "example.com/rack"), namespace)
    ev = (await wait_for(lambda: events_for(kube, namespace, "nowhere", "FailedScheduling"), 20))[0]
    assert "3 missing topology spread label" in ev["message"], ev["message"]


async def test_a_pod_waiting_for_its_affinity_target_binds_when_the_target_lands(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    """Required pod affinity to a pod not yet placed parks the pod as unschedulable; the
    target's placement (a watch event, no timer) wakes it and it lands next to the target."""
    nodes = await pool(control_plane, kube, "3x T4:4", namespace)
    await seen_ready(scheduler, nodes)
    api = make_pod("api", namespace).pool(namespace).gpus(1).obj()
    api["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "db"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    await kube.create(PODS, api, namespace)
    ev = (await wait_for(lambda: events_for(kube, namespace, "api", "FailedScheduling"), 20))[0]
    assert "3 pod affinity not satisfied" in ev["message"], ev["message"]
    await wait_for(lambda: _true(bool(_parked(scheduler))), 10, 0.05)

    db = make_pod("db", namespace).pool(namespace).gpus(1).obj()
    db["metadata"]["labels"]["app"] = "db"
    await kube.create(PODS, db, namespace)
    db_node = await wait_for(lambda: bound_node(kube, namespace, "db"), 20)
    # Far sooner than any backoff or flush would retry it.
    api_node = await wait_for(lambda: bound_node(kube, namespace, "api"), 5, 0.05)
    assert api_node == db_node and db_node in nodes


async def test_a_gated_pod_waits_for_its_gates_to_be_removed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    """`schedulingGates` (how Kueue and others hold pods back): the pod is not placed while any
    gate is there, and is placed as soon as the last one is removed."""
    await pool(control_plane, kube, "1x T4:4", namespace)
    refused = scheduler.metrics.binds.labels(result="conflict")
    refused_before = refused._value.get()
    gated = make_pod("gated", namespace).pool(namespace).gpus(1).obj()
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    await kube.create(PODS, gated, namespace)
    free = make_pod("free", namespace).pool(namespace).gpus(1).obj()
    await kube.create(PODS, free, namespace)
    assert await wait_for(lambda: bound_node(kube, namespace, "free"), 20)
    pod = await kube.get(PODS, "gated", namespace)
    assert not pod["spec"].get("nodeName")
    reasons = {c.get("reason") for c in (pod.get("status") or {}).get("conditions") or []}
    assert "SchedulingGated" in reasons  # set by the API server, left alone by us
    listed = [e for e in scheduler.queue.snapshot() if e["pod"] == f"{namespace}/gated"]
    assert [(e["state"], e["message"]) for e in listed] == [
        ("gated", "waiting for gates: example.com/quota")
    ]
    assert scheduler.queue.depth()["gated"] >= 1
    assert await events_for(kube, namespace, "gated", "FailedScheduling", "InvalidRequest") == []
    # Never tried: the API server refuses to bind a gated pod, which would show here.
    assert refused._value.get() == refused_before

    await kube.patch(PODS, "gated", {"spec": {"schedulingGates": None}}, namespace)
    assert await wait_for(lambda: bound_node(kube, namespace, "gated"), 20)

    # The API server may show the binding before the scheduler's own watch has taken the
    # pod out of its queue: it leaves the queue once that event is in.
    async def left_queue() -> bool:
        return not any(e["pod"] == f"{namespace}/gated" for e in scheduler.queue.snapshot())

    assert await wait_for(left_queue, 10)


async def test_resources_no_node_reports_are_named_and_the_pod_count_holds(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    """A pod asking for a resource no node of its pool has is told so (the kubelet would
    otherwise refuse it at admission); a node's `pods` allocatable caps what lands there."""
    (node_name,) = await pool(control_plane, kube, "1x T4:4", namespace)
    await seen_ready(scheduler, [node_name])
    rdma = make_pod("rdma", namespace).pool(namespace).gpus(1).obj()
    rdma["spec"]["containers"][0]["resources"]["limits"]["example.com/rdma"] = "1"
    await kube.create(PODS, rdma, namespace)
    ev = (await wait_for(lambda: events_for(kube, namespace, "rdma", "FailedScheduling"), 20))[0]
    assert "1 Insufficient example.com/rdma" in ev["message"], ev["message"]

    # The node admits two pods in all; the third CPU-only pod is refused for the count.
    await kube.patch(
        NODES,
        node_name,
        {"status": {"allocatable": {"pods": "2"}}},
        patch_type="merge",
        sub="status",
    )
    await wait_for(
        lambda: _true(
            int(
                scheduler.cache.snapshot().pods_cap[
                    scheduler.cache.snapshot().node_index(node_name)
                ]
            )
            == 2
        ),
        10,
        0.05,
    )
    for name in ("a", "b", "c"):
        await kube.create(PODS, make_pod(name, namespace).pool(namespace).obj(), namespace)
    for name in ("a", "b"):
        assert await wait_for(lambda n=name: bound_node(kube, namespace, n), 20) == node_name
    ev = (await wait_for(lambda: events_for(kube, namespace, "c", "FailedScheduling"), 20))[0]
    assert "1 Too many pods" in ev["message"], ev["message"]


async def test_sigterm_stops_the_scheduler_cleanly_and_gives_the_lease_up(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """A rolling update sends SIGTERM: the process exits 0 and hands its Lease back at once,
    so a follower need not wait for it to expire (15 s by default)."""
    identity = f"sigterm-{namespace}"
    settings_env = {
        "ALNAIR_KUBECONFIG": str(control_plane.kubeconfig),
        "ALNAIR_SCHEDULER_KUBECONFIG": str(control_plane.kubeconfig),
        "ALNAIR_SCHEDULER_HTTP_PORT": "0",
        "ALNAIR_SCHEDULER_NATS_ENABLED": "false",
        "ALNAIR_SCHEDULER_SCHEDULER_NAME": f"alnair-{namespace}",
        "ALNAIR_SCHEDULER_IDENTITY": identity,
        "ALNAIR_SCHEDULER_LEASE_NAMESPACE": namespace,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "alnair.scheduler",
        env={**os.environ, **settings_env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:

        async def holder() -> str | None:
            try:
                lease = await kube.get(LEASES, "alnair-scheduler", namespace)
            except NotFound:
                return None
            return str((lease.get("spec") or {}).get("holderIdentity") or "") or None

        assert await wait_for(holder, 30) == identity
        proc.send_signal(signal.SIGTERM)
        assert await within(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lease = await kube.get(LEASES, "alnair-scheduler", namespace)
    spec = lease["spec"]
    renewed = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    expires = renewed.timestamp() + float(spec["leaseDurationSeconds"])
    assert expires < time.time()  # already expired: a follower may take it now
