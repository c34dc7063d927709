"""PodGroups of plain pods through a queue: the group (Alnair's gang API, `scheduling.x-k8s.io`)
states what it needs in all; its pods, each labelled for the queue and the group, are gated at
creation by the dispatcher's webhook and admitted together, with the GPU model in each node
selector, when the group fits. Alnair's scheduler then binds them as one gang and KWOK runs
them. The group is done when every member pod is, which admits the next group; a group on
borrowed quota is reclaimed whole for the lender (its pods deleted: nothing makes plain pods
again but whoever created them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import JOBS, PODGROUPS, PODS, KubeClient
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, LABEL_QUEUE, LABEL_WORKLOAD
from dispatcher_support import (
    POOL,
    admitted_type,
    events,
    explain,
    gpu_job,
    queue_used,
    queued_pool,
)

pytestmark = pytest.mark.e2e


def group(name: str, ns: str, queue: str, members: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {"minMember": members, "minResources": {r.GPU: str(gpus)}},
    }


def member(group_name: str, i: int, ns: str, queue: str, seconds: float) -> dict[str, Any]:
    """One pod of the group, as a user (or a launcher of plain pods) writes it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{group_name}-{i}",
            "namespace": ns,
            "labels": {LABEL_QUEUE: queue, r.POD_GROUP_LABEL: group_name},
            "annotations": {r.ANN_DURATION: f"{seconds}s"},
        },
        "spec": {
            "schedulerName": r.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "nodeSelector": {POOL: ns},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "train", "image": "example.invalid/train:1",
                            "resources": {"limits": {r.GPU: "1"}}}],
        },
    }  # fmt: skip


async def _members(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{r.POD_GROUP_LABEL}={name}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def _all_bound(kube: KubeClient, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    pods = await _members(kube, ns, name)
    ok = [p for p in pods if p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")]
    return ok if len(ok) == n == len(pods) else []


async def test_pod_groups_queue_admit_whole_complete_and_are_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    async with queued_pool(
        cp,
        kube,
        ns,
        tmp_path,
        cohort="gc",
        queues={"train": (2, 2), "lender": (2, 0)},
    ) as running:
        # The group and the first of its pods: gated, and the group waits for the rest
        # (nothing is ungated with one member of two).
        await kube.create(PODGROUPS, group("g1", ns, "train", 2, 2), ns)
        first = await kube.create(PODS, member("g1", 0, ns, "train", 5), ns)
        assert first["spec"]["schedulingGates"] == [{"name": "alnair.io/admission"}]
        assert first["metadata"]["labels"][LABEL_WORKLOAD] == "podgroup.g1"
        waiting = await wait_for(
            lambda: explain(running, ns, "g1", lambda d: d["reason"] is not None,
                            kind="podgroups"), 20,
        )  # fmt: skip
        assert "1 of its 2 pods exist" in waiting["reason"]["message"], waiting
        assert (await kube.get(PODS, "g1-0", ns))["spec"]["schedulingGates"]
        await kube.create(PODS, member("g1", 1, ns, "train", 5), ns)
        pods = await wait_for(lambda: _all_bound(kube, ns, "g1", 2), 30)
        for pod in pods:
            assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32", pod
            assert pod["metadata"]["annotations"][ANN_ADMITTED_TYPE] == "V100M32"
        admitted = await wait_for(lambda: events(kube, ns, "g1", "Admitted"), 10)
        assert "2 x V100M32" in admitted[0]["message"]
        assert await wait_for(lambda: queue_used(kube, f"train-{ns}"), 10) == 2

        # A second borrows the idle lender's quota; a third waits, its pods gated.
        await kube.create(PODGROUPS, group("g2", ns, "train", 2, 2), ns)
        for i in range(2):
            await kube.create(PODS, member("g2", i, ns, "train", 600), ns)
        await wait_for(lambda: _all_bound(kube, ns, "g2", 2), 30)
        await kube.create(PODGROUPS, group("g3", ns, "train", 2, 2), ns)
        for i in range(2):
            await kube.create(PODS, member("g3", i, ns, "train", 600), ns)
        waiting = await wait_for(
            lambda: explain(running, ns, "g3", lambda d: d["status"] == "waiting",
                            kind="podgroups"), 20,
        )  # fmt: skip
        assert waiting["kind"] == "PodGroup"
        if not await _done(running, ns, "g1"):
            assert all(p["spec"].get("schedulingGates") for p in await _members(kube, ns, "g3"))

        # g1's pods finish (KWOK, 5 s): the group is done, and g3 is admitted.
        await wait_for(lambda: _done(running, ns, "g1"), 60, 0.2)
        await wait_for(lambda: _all_bound(kube, ns, "g3", 2), 30)
        # Alnair's scheduler says so on the group too (it used to count no ended member).
        status = await wait_for(lambda: _phase(kube, ns, "g1", "Finished"), 20)
        assert (status["succeeded"], status["failed"], status["scheduled"]) == (2, 0, 2)

        # The lender needs its quota: a borrowing group is reclaimed whole.
        await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"
        evicted = await wait_for(lambda: _reclaimed_one(kube, ns), 30)
        reasons = await events(kube, ns, evicted, "Preempted")
        assert "evicted whole" in reasons[0]["message"]


async def _done(running: Any, ns: str, name: str) -> bool:
    found = await explain(running, ns, name, lambda d: d["status"] == "succeeded",
                          kind="podgroups")  # fmt: skip
    return found is not None


async def _reclaimed_one(kube: KubeClient, ns: str) -> str | None:
    """The borrowing group reclaimed: its pods are gone, and it was told why."""
    for name in ("g2", "g3"):
        if not await _members(kube, ns, name) and await events(kube, ns, name, "Preempted"):
            return name
    return None


async def _phase(kube: KubeClient, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    status = (await kube.get(PODGROUPS, name, ns)).get("status") or {}
    return status if status.get("phase") == phase else None
