"""Preemption off the scheduling cycle, on the local control plane: the nominatedNodeName patch
and the victims' deletes are background writes, the victims' room is promised meanwhile, and a
delete the API server refuses ends the nomination with an Event and sends the pod round again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from alnair.common.kube import (
    ADMISSION_POLICIES,
    ADMISSION_POLICY_BINDINGS,
    PODS,
    ApiError,
    Conflict,
    KubeClient,
)
from alnair.dev.builders import make_pod, priority_classes
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
)

pytestmark = pytest.mark.e2e

VAPS = ADMISSION_POLICIES
VAP_BINDINGS = ADMISSION_POLICY_BINDINGS
UNDELETABLE = "alnair.io/test-undeletable"


@pytest.fixture
async def scheduler(kube: KubeClient) -> AsyncIterator[Scheduler]:
    running = Running(kube)
    yield await running.start()
    await running.stop()


async def test_two_preemptors_arriving_together_evict_two_different_victims(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    nodes = await pool(control_plane, kube, "2x T4:4", namespace)
    low, high = await priority_classes(kube, namespace)
    for i in range(2):
        pod = make_pod(f"low-{i}", namespace).pool(namespace).gpus(4).priority_class(low)
        await kube.create(PODS, pod.obj(), namespace)
    for i in range(2):
        assert await wait_for(lambda i=i: bound_node(kube, namespace, f"low-{i}"), 20)
    # Both arrive in one go: each victim's four GPUs hold exactly one of them.
    await asyncio.gather(
        *(
            kube.create(
                PODS,
                make_pod(f"high-{i}", namespace).pool(namespace).gpus(4).priority_class(high).obj(),
                namespace,
            )
            for i in range(2)
        )
    )
    placed = [
        await wait_for(lambda i=i: bound_node(kube, namespace, f"high-{i}"), 30) for i in range(2)
    ]
    assert sorted(placed) == sorted(nodes)
    pods = await pods_in(kube, namespace)
    assert not [p for p in pods if p["metadata"]["name"].startswith("low-")]
    assert_no_overcommit(pods, 4)
    # One Preempted event per victim, each naming a different preemptor.
    by: dict[str, str] = {}
    for i in range(2):
        events = await events_for(kube, namespace, f"low-{i}", "Preempted")
        assert len({e["message"] for e in events}) == 1, events
        by[f"low-{i}"] = events[0]["message"]
    assert len(set(by.values())) == 2, by
    assert len(scheduler.cache.nominations) == 0
    assert not scheduler.cache.nominations.leaving


async def _refuse_deletes(kube: KubeClient, ns: str) -> str:
    """A ValidatingAdmissionPolicy that refuses to delete this namespace's pods labelled
    UNDELETABLE; returns its name (the binding has the same)."""
    name = f"{ns}-undeletable"
    await kube.create(
        VAPS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["DELETE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(oldObject.metadata.labels) || "
                        f"!('{UNDELETABLE}' in oldObject.metadata.labels)",
                        "message": "this pod may not be deleted (test)",
                    }
                ],
            },
        },
    )
    await kube.create(
        VAP_BINDINGS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        },
    )
    # The policy takes effect once the API server has loaded it: probe with a pod of our own.
    probe = make_pod("probe", ns).scheduler("nobody").obj()
    probe["metadata"]["labels"][UNDELETABLE] = "yes"

    async def refused() -> bool:
        with contextlib.suppress(Conflict):
            await kube.create(PODS, probe, ns)
        try:
            await kube.delete(PODS, "probe", ns, grace_period_s=0)
        except ApiError as exc:
            return "may not be deleted" in str(exc)
        return False

    await wait_for(refused, 30, 0.5)
    return name


async def test_a_refused_victim_delete_clears_the_nomination_and_requeues_the_preemptor(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, scheduler: Scheduler
) -> None:
    await pool(control_plane, kube, "1x T4:4", namespace)
    low, high = await priority_classes(kube, namespace)
    policy = await _refuse_deletes(kube, namespace)
    try:
        victim = make_pod("low", namespace).pool(namespace).gpus(4).priority_class(low).obj()
        victim["metadata"]["labels"][UNDELETABLE] = "yes"
        await kube.create(PODS, victim, namespace)
        assert await wait_for(lambda: bound_node(kube, namespace, "low"), 20)
        preemptor = make_pod("high", namespace).pool(namespace).gpus(4).priority_class(high)
        await kube.create(PODS, preemptor.obj(), namespace)

        async def failed_twice() -> bool:
            name = "alnair_scheduler_preemption_failures_total"
            return (scheduler.metrics.registry.get_sample_value(name) or 0) >= 2

        # Refused, then sent round again (backoff) and refused again: never left parked.
        await wait_for(failed_twice, 30)
        events = await events_for(kube, namespace, "high", "PreemptionFailed")
        assert events and "could not delete low" in events[0]["message"], events
        assert "nomination cleared" in events[0]["message"]
        assert events[0]["type"] == "Warning"
        assert await bound_node(kube, namespace, "high") is None
        assert await bound_node(kube, namespace, "low")
    finally:
        await kube.delete(VAP_BINDINGS, policy)
        await kube.delete(VAPS, policy)
    # The next try's delete goes through and the preemptor lands.
    assert await wait_for(lambda: bound_node(kube, namespace, "high"), 60)
    assert len(scheduler.cache.nominations) == 0
