"""The scheduler keeps nothing for objects that are gone (issue 16): per-pod decisions of
deleted pending pods, gang state of deleted PodGroups and measured use of deleted nodes are
dropped with them, so its memory follows the cluster, not its history; the pod shapes that
tune the placement policy are a window, not every pod ever seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from alnair.common.kube import NODES, PODGROUPS, PODS, KubeClient
from alnair.dev.builders import make_pod, pod_group
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.e2e


@contextlib.asynccontextmanager
async def running(kube: KubeClient, **settings: Any) -> AsyncIterator[Scheduler]:
    sched = Scheduler(
        kube,
        SchedulerSettings(
            leader_elect=False,
            nats_enabled=False,
            initial_backoff_s=0.2,
            max_backoff_s=1.0,
            identity=f"bounded-{uuid.uuid4().hex[:6]}",
            **settings,
        ),
    )
    await sched.start_watching()
    loop = asyncio.create_task(sched.run())
    try:
        yield sched
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await sched.stop()


@pytest.fixture
async def scheduler(kube: KubeClient) -> AsyncIterator[Scheduler]:
    async with running(kube) as sched:
        yield sched


async def test_state_of_deleted_objects_is_dropped(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    pool = f"b{uuid.uuid4().hex[:5]}"
    nodes = await control_plane.create_gpu_nodes(
        "1x V100M32:2", kube=kube, prefix=pool, labels={"alnair.io/test-pool": pool}
    )
    names = [f"big-{i}" for i in range(12)]
    # pending for good: more GPUs than any node has; each leaves a decision behind
    for name in names:
        await kube.create(PODS, make_pod(name, namespace).gpus(8).pool(pool).obj(), namespace)
    await kube.create(PODGROUPS, pod_group("team", namespace, 3), namespace)
    await kube.create(
        PODS, make_pod("member", namespace).gpus(8).pool(pool).gang("team").obj(), namespace
    )
    uids = {
        p["metadata"]["uid"]
        for p in (await kube.list(PODS, namespace))["items"]
        if p["metadata"]["name"] in names
    }
    await wait_for(lambda: uids <= set(scheduler.last_result))
    gang = f"{namespace}/team"
    await wait_for(lambda: gang in scheduler.queue.gang_ts)
    for node in nodes:  # what the pod-metric handler records from the profiler's samples
        scheduler.cache.set_gpu_util(node, 0, 50.0)
    assert all((node, 0) in scheduler.cache.util for node in nodes)

    for name in [*names, "member"]:
        await kube.delete(PODS, name, namespace, grace_period_s=0)
    await kube.delete(PODGROUPS, "team", namespace)
    for node in nodes:
        await kube.delete(NODES, node)

    await wait_for(lambda: not (uids & set(scheduler.last_result)))
    await wait_for(lambda: gang not in scheduler.queue.gang_ts)
    assert gang not in scheduler.gangs.state and gang not in scheduler.gangs.groups
    await wait_for(lambda: not any(k[0] in nodes for k in scheduler.cache.util))
    assert not (uids & set(scheduler.queue.pods))


async def test_workload_shapes_are_a_window(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """Every new pending pod's shape tunes the fragmentation-aware policy; only the latest
    `workload_window` are kept (the soak's scheduler kept all of them: one per job, forever)."""
    pool = f"w{uuid.uuid4().hex[:5]}"
    await control_plane.create_gpu_nodes(
        "1x V100M32:2", kube=kube, prefix=pool, labels={"alnair.io/test-pool": pool}
    )
    async with running(kube, workload_window=4) as sched:
        names = [f"shape-{i}" for i in range(10)]
        for name in names:
            # pending for good (8 GPUs on 2-GPU nodes): only the ADDED event counts
            await kube.create(PODS, make_pod(name, namespace).gpus(8).pool(pool).obj(), namespace)
        # The scheduler sees every pod of the shared control plane: a pod of an earlier test's
        # namespace (a Job's, recreated while that namespace goes) is a shape too. So wait for
        # our last pod's shape, and judge the window by ours in it.
        await wait_for(
            lambda: any(r.name == names[-1] and r.namespace == namespace for r in sched._workload)
        )
        assert len(sched._workload) == 4
        ours = [r.name for r in sched._workload if r.namespace == namespace]
        assert ours and ours == names[-len(ours) :], [r.name for r in sched._workload]


async def test_a_rebuilt_profile_leaves_no_derived_data_behind(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """The fragmentation-aware policy caches per-node figures on the snapshot under its plugin
    instance's key; each rebuilt profile (the workload grew) used to add one more entry for the
    snapshot's lifetime (the cluster's node set: for good in a steady cluster)."""
    pool = f"m{uuid.uuid4().hex[:5]}"
    await control_plane.create_gpu_nodes(
        "2x V100M32:4", kube=kube, prefix=pool, labels={"alnair.io/test-pool": pool}
    )
    async with running(kube, policy="alnair") as sched:
        for i in range(4):
            sched._framework = None  # what a grown workload does: a new profile
            name = f"fit-{i}"
            await kube.create(PODS, make_pod(name, namespace).gpus(1).pool(pool).obj(), namespace)
            await wait_for(
                lambda name=name: any(  # type: ignore[misc]
                    req.name == name for req, _node, _pod in sched.cache.bound.values()
                )
            )
            assert sched.cache.snapshot().memo, "the policy derived nothing: no test"
            assert len(sched.cache.snapshot().memo) == 1
