"""What the rest of the cluster holds counts (issue 24), on the local control plane: real
kube-apiserver (with its ResourceQuota admission), Job controller and KWOK, the dispatcher under
its shipped ServiceAccount, Alnair's scheduler binding the admitted Jobs' pods.

- A pod another scheduler bound (created with `nodeName`, as kube-scheduler's bind leaves it)
  holding all 8 GPUs of the pool's node, with a model no node has: a queued 1-GPU Job waits for
  capacity although its queue's quota is free, and the dispatcher reports 8 GPUs held outside.
- Once that pod is gone the Job is admitted; its own pod, bound, is not counted a second time:
  a 7-GPU Job is admitted beside it, which would not fit if it were.
- A namespace's ResourceQuota with room for fewer GPUs than the queue: the Job it would refuse
  waits with the quota named, and is admitted when the room comes back.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from alnair.common import resources as r
from alnair.common.kube import EVENTS, JOBS, PODS, RESOURCEQUOTAS, KubeClient
from alnair.dev.builders import make_pod, shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from dispatcher_support import (
    POOL,
    admitted_type,
    cohort_queues,
    dispatcher_settings,
    explain,
    gpu_job,
    scheduler,
)

pytestmark = pytest.mark.e2e


async def _outside_gpus(url: str, model: str) -> float | None:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith(f'alnair_dispatcher_outside_gpus{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


async def _bound(kube: KubeClient, ns: str, job: str) -> list[dict[str, Any]] | None:
    pods = (await kube.list(PODS, ns, label_selector=f"job-name={job}"))["items"]
    bound = [p for p in pods if p["spec"].get("nodeName")]
    return bound or None


async def test_gpus_held_outside_the_queues_are_not_planned_with(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    cp = control_plane
    as_dispatcher = await shipped_account(cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    (node,) = await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "out", {"ml": (8, 0)})
    foreign = make_pod("foreign", ns).gpus(8).scheduler("default-scheduler").obj()
    foreign["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "B200"
    foreign["spec"]["nodeName"] = node
    await kube.create(PODS, foreign, ns)
    async with KubeClient(as_dispatcher) as client, scheduler(kube):
        running = await start_dispatcher(dispatcher_settings(cp, ns), kube=client)
        try:
            await kube.create(JOBS, gpu_job("one", ns, "ml", 1), ns)
            waiting = await wait_for(
                lambda: explain(running, ns, "one", lambda d: d["reason"] is not None), 20
            )
            assert waiting["status"] == "waiting", waiting
            assert waiting["reason"]["kind"] == "capacity", waiting
            assert await _outside_gpus(running.url, "V100M32") == 8.0
            assert await admitted_type(kube, ns, "one") is None

            # The pod leaves: its deletion alone (an event, no timer) admits the Job.
            await kube.delete(PODS, "foreign", ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "one"), 20) == "V100M32"
            (pod,) = await wait_for(lambda: _bound(kube, ns, "one"), 30)
            assert pod["spec"]["nodeName"] == node
            # Its pod, bound, is the queue's: not held outside as well.
            await kube.create(JOBS, gpu_job("seven", ns, "ml", 7), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "seven"), 20) == "V100M32"
            assert await _outside_gpus(running.url, "V100M32") == 0.0
        finally:
            await running.stop()


async def test_a_workload_its_namespaces_resource_quota_would_refuse_waits_saying_so(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """The queue has room, the namespace's ResourceQuota does not: the second Job waits with
    the quota, resource and amounts named (explanation, Event, condition), and is admitted
    when the first one's pods finish and the quota's status gives the room back."""
    ns = namespace
    cp = control_plane
    as_dispatcher = await shipped_account(cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "rq", {"ml": (8, 0)})
    await kube.create(
        RESOURCEQUOTAS,
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
         "spec": {"hard": {f"requests.{r.GPU}": "3"}}},
        ns,
    )  # fmt: skip
    async with KubeClient(as_dispatcher) as client, scheduler(kube):
        running = await start_dispatcher(dispatcher_settings(cp, ns), kube=client)
        try:
            await kube.create(JOBS, gpu_job("first", ns, "ml", 2, duration_s=4), ns)
            await kube.create(JOBS, gpu_job("second", ns, "ml", 2), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "first"), 20) == "V100M32"
            waiting = await wait_for(lambda: explain(running, ns, "second", _for_quota), 20)
            said = waiting["reason"]["message"]
            assert f"ResourceQuota {ns}/gpus: requests.{r.GPU} 2 asked, 1 left of 3" == said
            assert await admitted_type(kube, ns, "second") is None
            events = (await kube.list(EVENTS, ns, field_selector="involvedObject.name=second"))[
                "items"
            ]
            assert any("ResourceQuota" in e["message"] for e in events), events
            # (the condition is written after the Event)
            assert await wait_for(lambda: _condition_reason(kube, ns, "second"), 10) == (
                "ResourceQuota"
            )
            # The first Job's pods finish: the quota's status frees the room, and that event
            # admits the second.
            assert await wait_for(lambda: admitted_type(kube, ns, "second"), 40) == "V100M32"
        finally:
            await running.stop()


async def _condition_reason(kube: KubeClient, ns: str, name: str) -> str | None:
    conds = ((await kube.get(JOBS, name, ns)).get("status") or {}).get("conditions") or []
    reasons = [c["reason"] for c in conds if c["type"] == "alnair.io/Admitted"]
    return reasons[0] if reasons and reasons[0] == "ResourceQuota" else None


def _for_quota(doc: dict[str, Any]) -> bool:
    return bool(doc["reason"]) and doc["reason"]["kind"] == "resource_quota"
