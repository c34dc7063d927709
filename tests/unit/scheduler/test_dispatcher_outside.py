"""Which bound pods hold GPUs outside the queues (`dispatcher/outside.py`): ownership walked
up through the objects a workload kind makes, each owner read once; an owner that cannot be
read leaves its pods counted; fractions on one node share GPUs."""

from __future__ import annotations

from typing import Any

from alnair.common import resources as r
from alnair.common.informer import WatchEvent
from alnair.common.kube import ApiError, NotFound, Resource
from alnair.scheduler.dispatcher.outside import Held, Inside, OutsidePods, held_by
from alnair.scheduler.dispatcher.parsing import LABEL_WORKLOAD


def owner(kind: str, name: str, uid: str, api: str = "batch/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod(name: str, node: str, *, gpus: str | None = None, share: int | None = None,
        owner_ref: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        ) -> dict[str, Any]:  # fmt: skip
    requests: dict[str, str] = {"cpu": "1"}
    if gpus is not None:
        requests[r.GPU] = gpus
    if share is not None:
        requests[r.GPU_COMPUTE] = str(share)
        requests[r.GPU_MEMORY] = "1024"
    return {
        "metadata": {
            "name": name, "namespace": "ns", "uid": f"uid-{name}",
            "labels": labels or {}, "ownerReferences": [owner_ref] if owner_ref else [],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
    }  # fmt: skip


class Kube:
    """Answers GETs from `objects` (by plural/name), refusing the plurals in `forbidden`."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], forbidden: set[str]):
        self.objects = objects
        self.forbidden = forbidden
        self.gets: list[tuple[str, str]] = []

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Any:
        self.gets.append((resource.plural, name))
        if resource.plural in self.forbidden:
            raise ApiError(403, "Forbidden", "no", resource.plural)
        try:
            return self.objects[(resource.plural, name)]
        except KeyError:
            raise NotFound(404, "NotFound", name, resource.plural) from None


def outside(kube: Kube, pods: list[dict[str, Any]]) -> OutsidePods:
    woken: list[int] = []
    seen = OutsidePods(kube, lambda: woken.append(1))  # type: ignore[arg-type]
    for p in pods:
        seen.informer.store[f"ns/{p['metadata']['name']}"] = p
        seen._on_pod(WatchEvent.ADDED, p, None)
    assert len(woken) == sum(1 for p in pods if held_by(p) is not None)
    return seen


def test_what_a_bound_pod_holds() -> None:
    assert held_by(pod("a", "n1", gpus="2")) == Held("n1", 2, 0)
    assert held_by(pod("b", "n1")) is None  # no GPU
    unbound = pod("c", "n1", gpus="1")
    unbound["spec"]["nodeName"] = ""
    assert held_by(unbound) is None
    # A model nobody knows still holds its GPUs.
    odd = pod("d", "n1", gpus="8")
    odd["metadata"]["annotations"] = {r.GPU_MODEL_REQUEST: "B200"}
    assert held_by(odd) == Held("n1", 8, 0)
    share = held_by(pod("e", "n1", share=30))
    assert share is not None and share.whole == 0 and 0 < share.milli < r.MILLI_PER_GPU


async def test_ownership_is_walked_once_through_the_kinds_objects() -> None:
    trainjob = owner("TrainJob", "tj", "uid-tj", "trainer.kubeflow.org/v1alpha1")
    objects = {
        ("jobs", "tj-node-0"): {"metadata": {"uid": "uid-job", "ownerReferences": [
            owner("JobSet", "tj", "uid-js", "jobset.x-k8s.io/v1alpha2")]}},
        ("jobsets", "tj"): {"metadata": {"uid": "uid-js", "ownerReferences": [trainjob]}},
    }  # fmt: skip
    kube = Kube(objects, forbidden=set())
    in_job = owner("Job", "tj-node-0", "uid-job")
    seen = outside(kube, [
        pod("w0", "n1", gpus="2", owner_ref=in_job),
        pod("w1", "n1", gpus="2", owner_ref=in_job),
        pod("deploy", "n2", gpus="1", owner_ref=owner("ReplicaSet", "rs", "uid-rs", "apps/v1")),
        pod("bare", "n2", gpus="1"),
        pod("lws-0", "n2", gpus="1", labels={LABEL_WORKLOAD: "leaderworkerset.lw"}),
    ])  # fmt: skip
    models = {"n1": "V100", "n2": "T4"}
    inside = Inside(frozenset({"uid-tj"}), frozenset({("ns", "leaderworkerset.lw")}))
    assert await seen.held(inside, models) == {"T4": 2}
    assert sorted(kube.gets) == [("jobs", "tj-node-0"), ("jobsets", "tj")]  # read once
    assert await seen.held(inside, models) == {"T4": 2}
    assert len(kube.gets) == 2  # remembered by uid
    # The TrainJob no longer queued: its pods hold their GPUs outside.
    assert await seen.held(Inside(frozenset(), frozenset()), models) == {"V100": 4, "T4": 3}
    # A node outside the pool is not counted.
    assert await seen.held(inside, {"n1": "V100"}) == {}


async def test_an_owner_that_cannot_be_read_leaves_its_pods_counted() -> None:
    kube = Kube({}, forbidden={"jobs"})
    seen = outside(kube, [pod("p", "n1", gpus="4", owner_ref=owner("Job", "j", "uid-j"))])
    assert await seen.held(Inside(frozenset({"uid-queued"}), frozenset()), {"n1": "A100"}) == {
        "A100": 4
    }


async def test_a_recreated_owner_is_not_the_pods_owner() -> None:
    objects = {("jobs", "j"): {"metadata": {"uid": "uid-new", "ownerReferences": [
        owner("JobSet", "js", "uid-js", "jobset.x-k8s.io/v1alpha2")]}}}  # fmt: skip
    seen = outside(
        Kube(objects, set()), [pod("p", "n1", gpus="1", owner_ref=owner("Job", "j", "uid-old"))]
    )
    assert await seen.held(Inside(frozenset({"uid-js"}), frozenset()), {"n1": "T4"}) == {"T4": 1}


async def test_fractions_on_one_node_share_gpus() -> None:
    seen = outside(Kube({}, set()), [
        pod("a", "n1", share=40), pod("b", "n1", share=40), pod("c", "n1", share=40),
        pod("d", "n2", share=10),
    ])  # fmt: skip
    held = await seen.held(Inside(frozenset(), frozenset()), {"n1": "T4", "n2": "T4"})
    assert held == {"T4": 3}  # n1: 120 % → 2 GPUs; n2: 1


async def test_a_pod_leaving_or_finishing_stops_counting_and_wakes() -> None:
    woken: list[int] = []
    seen = OutsidePods(Kube({}, set()), lambda: woken.append(1))  # type: ignore[arg-type]
    p = pod("a", "n1", gpus="1")
    seen.informer.store["ns/a"] = p
    seen._on_pod(WatchEvent.ADDED, p, None)
    seen._on_pod(WatchEvent.MODIFIED, p, p)  # nothing changed: no wake
    assert woken == [1]
    del seen.informer.store["ns/a"]
    seen._on_pod(WatchEvent.DELETED, p, p)
    assert woken == [1, 1] and seen.gpu_pods == {}
    assert await seen.held(Inside(frozenset(), frozenset()), {"n1": "T4"}) == {}
