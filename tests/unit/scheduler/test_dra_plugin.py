"""DynamicResources in the framework: claims resolved from templates (waiting, woken by the
claim's event), a share's memory and compute become the snapshot's fractional request so the
policy picks the GPU, the allocator is held to that GPU, no GPU is over-committed, a tainted GPU
takes nothing, Reserve/Unreserve count in-flight usage, failures name the claim and request,
and a malformed claim is refused without stopping the next pod."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.informer import WatchEvent
from alnair.common.resources import parse_quantity
from alnair.dev.builders import make_pod
from alnair.scheduler.cluster.pods import parse_pod
from alnair.scheduler.cluster.requests import NodeSpec, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.dra.claims import (
    POD_CLAIM_NAME_ANNOTATION,
    ClaimCache,
    MalformedClaim,
    claim_pod,
    claim_refs,
    request_from_claims,
)
from alnair.scheduler.dra.live import explain_claims
from alnair.scheduler.dra.plugin import DynamicResources, with_dra
from alnair.scheduler.framework import Code, Framework
from alnair.scheduler.plugins.registry import policy
from dra_support import GPUS, TAINTED_GPU, node_slice
from dra_support import claim_pod as pod_manifest

CLASSES = {
    name: {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.alnair.io"'}}]},
    }
    for name in dra.CLASSES
}
_uids = itertools.count()


def pod_obj(name: str, *, claim: str | None = None) -> dict[str, Any]:
    pod = pod_manifest(name, "ns", "alnair", claim=claim)
    pod["metadata"]["uid"] = f"pod-{name}"
    return pod


def template_claim(
    pod: dict[str, Any], caps: dict[str, str] | None = None, cls: str = dra.CLASS_SHARED
) -> dict[str, Any]:
    """The claim kube-controller-manager makes from the pod's template (owned by the pod)."""
    exact: dict[str, Any] = {"deviceClassName": cls}
    if caps is not None:
        exact["capacity"] = {"requests": caps}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod['metadata']['name']}-gpu-x1",
            "namespace": "ns",
            "uid": f"claim-{next(_uids)}",
            "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"},
            "ownerReferences": [
                {
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}},
    }


class World:
    """One node of 8 x 80 GB with GPU 7 tainted, the classes, and a DRA-enabled profile."""

    def __init__(self, policy_name: str = "FGD") -> None:
        self.woken = 0
        self.cache = ClaimCache(on_change=self._wake)
        for cls in CLASSES.values():
            self.cache.on_class(WatchEvent.ADDED, cls, None)
        self.cache.on_slice(WatchEvent.ADDED, node_slice("n1", "node-uid"), None)
        self.plugin = DynamicResources(self.cache)
        typical = [PodRequest("t", 100, 256, 1, 300)]
        self.framework = Framework(with_dra(policy(policy_name).build(typical), self.plugin))
        self.snapshot = ClusterSnapshot.build([NodeSpec("n1", 96_000, 768 * 1024, GPUS, "H100")])
        self.rng = np.random.default_rng(1)

    def _wake(self) -> None:
        self.woken += 1

    def request(self, pod: dict[str, Any]) -> PodRequest:
        base = PodRequest(
            pod["metadata"]["name"], 100, 256, namespace="ns", uid=pod["metadata"]["uid"]
        )
        return claim_pod(pod, base, self.cache)

    def schedule(self, pod: dict[str, Any]) -> Any:
        req = self.request(pod)
        result = self.framework.schedule(req, self.snapshot, self.rng)
        if result.placement is not None:
            self.snapshot.assume(req, result.placement)
            self.write_back(req)
        return req, result

    def write_back(self, req: PodRequest) -> None:
        """What pre_bind writes, delivered back as the claim's watch event."""
        for w in self.plugin.reserved[req.key]:
            new = {**w.claim, "status": {"allocation": {"devices": {"results": list(w.results or ())}},
                                         "reservedFor": [{"resource": "pods", "name": req.name, "uid": req.uid}]}}  # fmt: skip
            self.cache.on_claim(WatchEvent.MODIFIED, new, w.claim)
        self.plugin.bound(req.key)


def per_device(cache: ClaimCache) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    compute: dict[str, Decimal] = defaultdict(Decimal)
    memory: dict[str, Decimal] = defaultdict(Decimal)
    for results in cache.usage.by_claim.values():
        for res in results:
            compute[res["device"]] += parse_quantity(res["consumedCapacity"]["compute"])
            memory[res["device"]] += parse_quantity(res["consumedCapacity"]["memory"])
    return compute, memory


@pytest.mark.parametrize("policy_name", ["FGD", "alnair", "BestFit"])
def test_shares_pack_onto_the_gpus_the_policy_picks_without_overcommit(policy_name: str) -> None:
    world = World(policy_name)
    placed, refused = 0, []
    for i in range(24):
        pod = pod_obj(f"p{i}")
        world.cache.on_claim(
            WatchEvent.ADDED, template_claim(pod, {"memory": "10Gi", "compute": "30"}), None
        )
        req, result = world.schedule(pod)
        assert req.num_gpu == 1 and req.gpu_milli == 300  # compute-bound: 30 % > 10/80 GiB
        if result.placement is None:
            refused.append(result.message())
            continue
        placed += 1
        [w] = world.cache.usage.by_claim[world.cache.claims[f"ns/p{i}-gpu-x1"]["metadata"]["uid"]]
        # the allocator was held to the GPU the policy chose
        assert w["device"] == dra.device_name(result.placement.gpu_indices[0])
    assert placed == (GPUS - 1) * 3
    compute, memory = per_device(world.cache)
    assert dra.device_name(TAINTED_GPU) not in compute
    assert all(v <= 100 for v in compute.values())
    assert all(v <= 81920 * (1 << 20) for v in memory.values())
    assert len(refused) == 3
    assert "request gpu" in refused[0] and "1 tainted" in refused[0]
    assert "without room for compute 30, memory 10240Mi" in refused[0]


def test_a_template_claim_not_created_yet_waits_and_its_event_wakes_the_pod() -> None:
    world = World()
    pod = pod_obj("late")
    req, result = world.schedule(pod)
    assert result.placement is None
    assert result.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "waiting for ResourceClaim from template gpu-share (pod claim gpu)" in result.message()
    before = world.woken
    world.cache.on_claim(
        WatchEvent.ADDED, template_claim(pod, {"memory": "20Gi", "compute": "10"}), None
    )
    assert world.woken == before + 1
    req, result = world.schedule(pod)
    assert result.placement is not None
    assert req.gpu_milli == 250  # memory-bound: 20 GiB of the 80 GiB GPU


def test_whole_gpu_claims_take_a_device_each_and_named_claims_resolve() -> None:
    world = World()
    pod = pod_obj("whole", claim="shared-whole")
    assert claim_refs(pod)[0].claim == "shared-whole"
    claim = template_claim(pod, None, cls=dra.CLASS_WHOLE)
    claim["metadata"].update(name="shared-whole", ownerReferences=[], annotations={})
    world.cache.on_claim(WatchEvent.ADDED, claim, None)
    req, result = world.schedule(pod)
    assert (req.num_gpu, req.gpu_milli) == (1, 1000)
    [r] = world.cache.usage.by_claim[claim["metadata"]["uid"]]
    assert r["device"] == dra.device_name(result.placement.gpu_indices[0])
    assert r["consumedCapacity"]["compute"] == "100"


def test_the_gpu_choice_avoids_devices_full_by_claims_the_snapshot_does_not_know() -> None:
    """A claim allocated by kube-scheduler fills gpu-0; the snapshot shows gpu-0 free, yet the
    pod lands elsewhere because the selector only sees devices that fit."""
    world = World("BestFit")
    outsider = template_claim(pod_obj("upstream"), {"memory": "80Gi", "compute": "100"})
    outsider["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": dra.DRIVER, "pool": "n1", "device": "gpu-0",
         "consumedCapacity": {"memory": "80Gi", "compute": "100"}}]}}}  # fmt: skip
    world.cache.on_claim(WatchEvent.ADDED, outsider, None)
    pod = pod_obj("mine")
    world.cache.on_claim(
        WatchEvent.ADDED, template_claim(pod, {"memory": "10Gi", "compute": "30"}), None
    )
    _req, result = world.schedule(pod)
    assert result.placement is not None and result.placement.gpu_indices != (0,)


def test_unreserve_gives_the_share_back() -> None:
    world = World()
    pod = pod_obj("undo")
    claim = template_claim(pod, {"memory": "10Gi", "compute": "100"})
    world.cache.on_claim(WatchEvent.ADDED, claim, None)
    req = world.request(pod)
    result = world.framework.schedule(req, world.snapshot, world.rng)
    assert result.placement is not None
    uid = claim["metadata"]["uid"]
    assert uid in world.cache.in_flight and uid in world.cache.usage.by_claim
    world.plugin.release(req.key)
    assert uid not in world.cache.in_flight and uid not in world.cache.usage.by_claim


def test_a_malformed_claim_is_refused_and_the_next_pod_still_schedules() -> None:
    world = World()
    bad = pod_obj("bad")
    broken = template_claim(bad, {"memory": "10Gi"})
    del broken["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    world.cache.on_claim(WatchEvent.ADDED, broken, None)
    with pytest.raises(MalformedClaim, match="unreadable"):
        world.request(bad)
    odd = pod_obj("odd")
    odd["spec"]["resourceClaims"] = [{"name": "gpu"}]
    with pytest.raises(MalformedClaim, match="exactly one of"):
        claim_refs(odd)
    # the binder schedules nothing for a pod it cannot parse; the plugin refuses the claim too
    assert "pod-bad" in world.cache.pods
    req = PodRequest("bad", 100, 256, namespace="ns", uid="pod-bad")
    result = world.framework.schedule(req, world.snapshot, world.rng)
    assert result.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "is malformed" in result.message()
    good = pod_obj("good")
    world.cache.on_claim(WatchEvent.ADDED, template_claim(good, {"compute": "50"}), None)
    _req, result = world.schedule(good)
    assert result.placement is not None


def test_a_claim_no_device_can_satisfy_names_the_request() -> None:
    world = World()
    pod = pod_obj("huge")
    world.cache.on_claim(WatchEvent.ADDED, template_claim(pod, {"memory": "90Gi"}), None)
    _req, result = world.schedule(pod)
    assert result.placement is None
    message = result.message()
    assert "ResourceClaim huge-gpu-x1 request gpu" in message
    assert "without room for memory 92160Mi" in message


def test_unhealthy_taints_reach_the_gpu_health_view_and_clear() -> None:
    seen: list[tuple[str, int, bool]] = []
    cache = ClaimCache(on_health=lambda node, gpu, healthy: seen.append((node, gpu, healthy)))
    tainted = node_slice("n1", "uid")
    cache.on_slice(WatchEvent.ADDED, tainted, None)
    assert seen == [("n1", TAINTED_GPU, False)]
    healed = copy.deepcopy(tainted)
    for d in healed["spec"]["devices"]:
        d.pop("taints", None)
    cache.on_slice(WatchEvent.MODIFIED, healed, tainted)
    assert seen[-1] == ("n1", TAINTED_GPU, True)


@pytest.mark.parametrize(("memory", "compute"), [("10Gi", "30"), ("40Gi", "10"), ("1Mi", "1")])
def test_a_request_built_from_a_claim_matches_the_gpu_memory_resource(
    memory: str, compute: str
) -> None:
    """The simulator's view of a claim is the request `alnair.io/gpu-memory` and
    `alnair.io/gpu-compute` make for the same GPU."""
    table = {"H100": 81920}
    claim = template_claim(pod_obj("sim"), {"memory": memory, "compute": compute})
    from_claim = request_from_claims("sim", [claim], 81920)
    memory_mib = int(parse_quantity(memory) / (1 << 20))
    pod = make_pod("sim", "ns").fraction(int(compute), memory_mib).obj()
    pod["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "H100"
    from_resources = parse_pod(pod, table)
    assert (from_claim.num_gpu, from_claim.gpu_milli) == (
        from_resources.num_gpu,
        from_resources.gpu_milli,
    )


def test_explain_shows_the_claim_request_and_its_allocation() -> None:
    world = World()
    pod = pod_obj("why")
    world.cache.on_claim(
        WatchEvent.ADDED, template_claim(pod, {"memory": "10Gi", "compute": "30"}), None
    )
    req = world.request(pod)
    [item] = explain_claims(world.cache, req.key)
    assert item["claim"] == "why-gpu-x1"
    assert item["requests"] == [
        {"name": "gpu", "device_class": dra.CLASS_SHARED, "count": 1,
         "capacity": {"compute": "30", "memory": str(10 * (1 << 30))}}
    ]  # fmt: skip
    world.schedule(pod)  # bound: explain shows where the claim was allocated
    [item] = explain_claims(world.cache, req.key)
    [allocated] = item["allocation"]
    assert allocated["consumedCapacity"] == {"compute": "30", "memory": "10240Mi"}
    world.cache.forget_pod(req.key)  # the pod is gone: nothing kept for it
    assert explain_claims(world.cache, req.key) == []
    assert req.key not in world.cache.pods


def test_a_node_publishing_gpus_only_in_its_slice_gets_gpu_columns_from_it() -> None:
    seen: list[str] = []
    cache = ClaimCache(on_node_gpus=seen.append)
    cache.on_slice(WatchEvent.ADDED, node_slice("dra-only", "uid"), None)
    gpus = cache.node_gpus("dra-only")
    assert gpus is not None
    assert (gpus.count, gpus.model, gpus.memory_mib) == (GPUS, "H100-SXM5-80GB", 81920)
    assert seen == ["dra-only"]
    assert cache.node_gpus("other") is None
    slice_ = node_slice("dra-only", "uid")
    cache.on_slice(WatchEvent.DELETED, slice_, None)
    assert cache.node_gpus("dra-only") is None and seen == ["dra-only", "dra-only"]


def test_the_live_cache_sizes_a_slice_only_node_from_its_slice() -> None:
    from alnair.scheduler.live.cache import SchedulerCache

    cache = SchedulerCache()
    node = {"metadata": {"name": "dra-only", "labels": {}},
            "status": {"allocatable": {"cpu": "96", "memory": "768Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    cache.upsert_node(node)
    assert int(cache.snapshot().gpu_count[0]) == 0
    assert cache.set_slice_gpus("dra-only", (GPUS, "H100-SXM5-80GB", 81920))
    snap = cache.snapshot()
    assert int(snap.gpu_count[0]) == GPUS
    assert snap.models[int(snap.model_id[0])] == "H100-SXM5-80GB"
    assert cache.gpu_memory_table()["H100-SXM5-80GB"] == 81920
    assert not cache.set_slice_gpus("dra-only", (GPUS, "H100-SXM5-80GB", 81920))
    assert cache.set_slice_gpus("dra-only", None)
    assert int(cache.snapshot().gpu_count[0]) == 0


def test_dra_options_register_the_plugin_in_the_built_profile() -> None:
    from alnair.scheduler.dra.plugin import DraGpus, dra_options
    from alnair.scheduler.plugins.registry import ProfileOptions, build_profile

    world = World()
    profile = build_profile("FGD", [PodRequest("t", 100, 256, 1, 300)],
                            dra_options(ProfileOptions(), world.plugin))  # fmt: skip
    assert profile.pre_filter[-1] is world.plugin and profile.filter[-1] is world.plugin
    assert world.plugin in profile.reserve and world.plugin in profile.pre_bind
    assert isinstance(profile.gpu_selector, DraGpus)
    # a pod without claims: PreFilter SKIP, so Filter never runs the allocator for it
    plain = make_pod("plain", "ns").fraction(30, memory_mib=10240).obj()
    plain["metadata"]["uid"] = "pod-plain"
    req = parse_pod(plain)
    result = Framework(profile).schedule(req, world.snapshot, world.rng)
    assert result.placement is not None and result.state is not None
    assert "DynamicResources" in result.state.skip_filter
    assert world.plugin.reserved == {}


async def test_pre_bind_without_an_api_server_refuses_and_unreserve_forgets() -> None:
    world = World()
    pod = pod_obj("nowhere")
    world.cache.on_claim(
        WatchEvent.ADDED, template_claim(pod, {"memory": "10Gi", "compute": "30"}), None
    )
    req = world.request(pod)
    result = world.framework.schedule(req, world.snapshot, world.rng)
    assert result.placement is not None and result.state is not None
    status = await world.framework.pre_bind(req, world.snapshot, result)
    assert not status.ok and "no API server" in status.reason
    world.framework.unreserve(req, world.snapshot, result)
    assert world.cache.in_flight == {} and world.plugin.reserved == {}
    assert world.plugin.undoing == set()


class _ClaimsApi:
    """The two calls PreBind and a take-back make on ResourceClaims, kept in a dict."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    async def replace(self, resource: Any, body: dict[str, Any], *, sub: str) -> dict[str, Any]:
        self.claims[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    async def get(self, resource: Any, name: str, namespace: str) -> dict[str, Any]:
        return copy.deepcopy(self.claims[name])


async def test_a_device_another_allocator_took_meanwhile_is_given_back_at_pre_bind() -> None:
    """kube-scheduler allocates the same GPU to its own claim while Alnair writes its own:
    PreBind looks again after writing, fails naming the other claim, and Unreserve takes
    Alnair's allocation back off the API server."""
    world = World("BestFit")
    api = _ClaimsApi()
    world.plugin.kube = api  # type: ignore[assignment]
    pod = pod_obj("raced")
    claim = template_claim(pod, {"memory": "60Gi", "compute": "100"})
    world.cache.on_claim(WatchEvent.ADDED, claim, None)
    req = world.request(pod)
    result = world.framework.schedule(req, world.snapshot, world.rng)
    assert result.placement is not None
    device = dra.device_name(result.placement.gpu_indices[0])
    outsider = template_claim(pod_obj("upstream"), {"memory": "60Gi", "compute": "100"})
    outsider["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": dra.DRIVER, "pool": "n1", "device": device,
         "consumedCapacity": {"memory": "60Gi", "compute": "100"}}]}}}  # fmt: skip
    world.cache.on_claim(WatchEvent.ADDED, outsider, None)
    status = await world.framework.pre_bind(req, world.snapshot, result)
    assert not status.ok
    assert outsider["metadata"]["name"] in status.reason and device in status.reason
    world.framework.unreserve(req, world.snapshot, result)
    await world.plugin.drain()
    taken_back = api.claims[claim["metadata"]["name"]]
    assert "allocation" not in taken_back["status"]
    # without the other claim, the same allocation passes
    calm = World("BestFit")
    calm.plugin.kube = _ClaimsApi()  # type: ignore[assignment]
    pod2 = pod_obj("calm")
    calm.cache.on_claim(
        WatchEvent.ADDED, template_claim(pod2, {"memory": "60Gi", "compute": "100"}), None
    )
    req2 = calm.request(pod2)
    result2 = calm.framework.schedule(req2, calm.snapshot, calm.rng)
    assert (await calm.framework.pre_bind(req2, calm.snapshot, result2)).ok
