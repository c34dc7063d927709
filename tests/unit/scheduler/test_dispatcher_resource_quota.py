"""A namespace's ResourceQuota asked before admission (`dispatcher/resource_quota.py`): what a
workload's pods charge, in the quota's vocabulary, and the room left."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from alnair.common import resources as r
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE, parse_workload
from alnair.scheduler.dispatcher.resource_quota import (
    NamespaceQuotas,
    pod_amounts,
    workload_amounts,
)


def job(name: str, pods: int, cpu: str, gpus: int, ns: str = "team") -> Any:
    container = {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                            "limits": {r.GPU: str(gpus)}}}  # fmt: skip
    return parse_workload({
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: "lq"}},
        "spec": {"suspend": True, "parallelism": pods,
                 "template": {"spec": {"containers": [container]}}},
    }, 60.0)  # fmt: skip


def quota(name: str, hard: dict[str, str], used: dict[str, str] | None = None,
          **spec: Any) -> Any:  # fmt: skip
    return {"metadata": {"name": name, "namespace": "team"}, "spec": {"hard": hard, **spec},
            "status": {"hard": hard, "used": used or {}}}  # fmt: skip


def quotas(*objs: Any) -> NamespaceQuotas:
    q = NamespaceQuotas(None)  # type: ignore[arg-type]
    for obj in objs:
        q.informer.store[f"team/{obj['metadata']['name']}"] = obj
    return q


def test_a_pod_charges_its_containers_and_its_largest_init_container() -> None:
    template = {"spec": {
        "containers": [{"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}},
                       {"resources": {"limits": {"memory": "1Gi"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
    }}  # fmt: skip
    got = pod_amounts(template, "spec.template")
    assert got["requests.cpu"] == 4  # the init container asks more than both containers
    assert got["limits.cpu"] == 2
    assert got["requests.memory"] == got["limits.memory"] == 2**30  # limits default requests


def test_a_workload_charges_every_pod_at_once() -> None:
    amounts = workload_amounts(job("j", 3, "500m", 2))
    assert amounts["pods"] == 3
    assert amounts["requests.cpu"] == Decimal("1.5")
    assert amounts[f"requests.{r.GPU}"] == 6 and amounts[f"limits.{r.GPU}"] == 6


def test_the_quota_refuses_what_does_not_fit_naming_it() -> None:
    wl = job("j", 2, "1", 2)
    roomy = quotas(quota("gpus", {f"requests.{r.GPU}": "8"}, {f"requests.{r.GPU}": "4"}))
    assert roomy.shortfall(wl) is None
    tight = quotas(quota("gpus", {f"requests.{r.GPU}": "8"}, {f"requests.{r.GPU}": "6"}))
    said = tight.shortfall(wl)
    assert said == f"ResourceQuota team/gpus: requests.{r.GPU} 4 asked, 2 left of 8", said
    pods = quotas(quota("pods", {"pods": "2", "cpu": "10"}, {"pods": "1"}))
    assert pods.shortfall(wl) == "ResourceQuota team/pods: pods 2 asked, 1 left of 2"
    memory = quotas(quota("mem", {"requests.memory": "1Gi"}))
    assert "requests.memory 2048Mi asked, 1024Mi left" in (memory.shortfall(wl) or "")


def test_admitted_workloads_count_before_their_pods_show_in_the_status() -> None:
    q = quotas(quota("gpus", {f"requests.{r.GPU}": "8"}, {f"requests.{r.GPU}": "0"}))
    first = job("a", 1, "1", 6)
    q.charge(first)
    assert q.shortfall(job("b", 1, "1", 4)) is not None  # 6 admitted + 4 > 8
    assert q.shortfall(job("b", 1, "1", 2)) is None
    q.charge(job("c", 1, "1", 1))  # admitted in the same reconcile, after the sum was made
    assert q.shortfall(job("b", 1, "1", 2)) is not None  # 7 + 2 > 8
    q.begin()  # the next reconcile charges afresh
    assert q.shortfall(job("b", 1, "1", 8)) is None


def test_other_namespaces_and_scoped_quotas_are_not_asked() -> None:
    other = quota("gpus", {f"requests.{r.GPU}": "0"})
    other["metadata"]["namespace"] = "elsewhere"
    scoped = quota("best-effort", {"pods": "0"}, scopes=["BestEffort"])
    assert quotas(other, scoped).shortfall(job("j", 1, "1", 1)) is None


def test_requests_that_cannot_be_read_are_named() -> None:
    wl = job("j", 1, "1", 1)
    wl.pod_sets[0].template["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    said = quotas(quota("cpu", {"cpu": "4"})).shortfall(wl) or ""
    assert "spec.template.spec.containers[0].resources.requests.cpu" in said and "lots" in said
