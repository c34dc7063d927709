"""GPU shares through DRA, scheduled by the real kube-scheduler v1.36.3 and by Alnair.

The same workload (see `dra_support`): one KWOK node of 8 x 80 GB GPUs whose ResourceSlice the
Alnair driver publishes, GPU 7 tainted, pods whose claims (from a ResourceClaimTemplate) ask the
shared DeviceClass for 10 GiB and 30 % compute. First 10 pods (placement quality is read while
the node is partly full), then 14 more: 21 fit (7 healthy GPUs x 3), 3 stay unschedulable.
Every claim's allocation is read back and checked; the quality figures are printed as JSON.

kube-scheduler needs no feature gate: DRAConsumableCapacity, DRADeviceTaints and
DRAPartitionableDevices are beta and on by default in 1.36 (`kube-scheduler --help`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.kube import NODES, PODS, SERVICEACCOUNTS, KubeClient, Resource
from alnair.common.kubeconfig import KubeConfig
from alnair.dev.builders import make_pod
from alnair.dev.localstack import ControlPlane, ManagedProcess
from alnair.dev.localstack.controlplane import (
    GpuNodeSpec,
    binary,
    gpu_node_manifest,
    wait_nodes_ready,
)
from alnair.dev.waiting import wait_for
from alnair.scheduler.cluster.requests import Placement, PodRequest
from alnair.scheduler.dra.live import unavailable
from alnair.scheduler.framework.status import SKIP, Status, error
from alnair.scheduler.live.scheduler import Scheduler
from dra_support import (
    GPUS,
    KUSTOMIZE,
    SHARES_PER_GPU,
    TAINTED_GPU,
    check_allocations,
    claim_pod,
    claim_template,
    ensure_device_classes,
    node_slice,
    render_with_dra,
    wait_pods,
)
from scheduler_support import events_for, settings

pytestmark = pytest.mark.e2e

FIRST, SECOND = 10, 14
FITS = (GPUS - 1) * SHARES_PER_GPU


@pytest.fixture
async def dra_node(
    control_plane: ControlPlane, kube: KubeClient, tmp_path: Path
) -> AsyncIterator[str]:
    """A KWOK node with the driver's slice (owned by the node) and the shipped DeviceClasses."""
    await ensure_device_classes(kube, render_with_dra(tmp_path))
    prefix = f"dra{uuid.uuid4().hex[:4]}"
    [node] = await control_plane.create_gpu_nodes(f"1x H100:{GPUS}", kube=kube, prefix=prefix)
    obj = await kube.get(NODES, node)
    await kube.create(dra.RESOURCESLICES, node_slice(node, obj["metadata"]["uid"]))
    yield node
    with contextlib.suppress(Exception):
        await kube.delete(dra.RESOURCESLICES, dra.slice_name(node))
    await kube.delete(NODES, node)


@pytest.fixture
def kube_scheduler(control_plane: ControlPlane, tmp_path: Path) -> Any:
    config = tmp_path / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {control_plane.kubeconfig}\n"
        "leaderElection:\n  leaderElect: false\n"
    )
    (tmp_path / "logs").mkdir()
    proc = ManagedProcess(
        "kube-scheduler",
        [str(binary("kube-scheduler")), "--config", str(config), "--secure-port", "0", "--v", "2"],
        tmp_path / "logs",
    )
    proc.start()
    yield proc
    proc.stop()


async def run_workload(kube: KubeClient, namespace: str, node: str, scheduler: str) -> Any:
    """The two phases; returns the placement quality after each."""
    await kube.create(dra.RESOURCECLAIMTEMPLATES, claim_template(namespace))
    for i in range(FIRST):
        await kube.create(PODS, claim_pod(f"share-{i:02d}", namespace, scheduler))
    pods = await wait_pods(kube, namespace, bound=FIRST)
    claims = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
    partial = check_allocations(claims, pods, node)
    await asyncio.gather(
        *(
            kube.create(PODS, claim_pod(f"share-{i:02d}", namespace, scheduler))
            for i in range(FIRST, FIRST + SECOND)
        )
    )
    pods = await wait_pods(kube, namespace, bound=FITS, unschedulable=FIRST + SECOND - FITS)
    claims = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
    full = check_allocations(claims, pods, node)
    return partial, full, pods


async def test_kube_scheduler_allocates_alnair_shares_within_capacity(
    kube: KubeClient, namespace: str, dra_node: str, kube_scheduler: ManagedProcess
) -> None:
    partial, full, pods = await run_workload(kube, namespace, dra_node, "default-scheduler")
    assert partial["claims_placed"] == FIRST
    assert full["claims_placed"] == FITS
    assert full["gpus_used"] == GPUS - 1
    refused = [p for p in pods if not p["spec"].get("nodeName")]
    assert len(refused) == FIRST + SECOND - FITS
    print(
        json.dumps({"scheduler": "kube-scheduler v1.36.3", "after_10": partial, "after_24": full})
    )


class AlnairRun:
    """Alnair's real `Scheduler` loop (informers, queue, framework, binding cycle) in this
    process, DRA on, FGD with a fixed seed; stopped when the test ends."""

    def __init__(self, kube: KubeClient, **kw: Any) -> None:
        base: dict[str, Any] = {"policy": "FGD", "seed": 3, "dra": "on", "utilization_weight": 0}
        self.scheduler = Scheduler(kube, settings(**{**base, **kw}))
        self.task: asyncio.Task[None] | None = None

    async def start(self, *, bind_first: Any = None) -> Scheduler:
        sched = self.scheduler
        await sched.start_watching()
        if bind_first is not None:  # a Bind plugin ahead of the real Binding (failure tests)
            sched.options = replace(sched.options, bind=(bind_first, *sched.options.bind))
        self.task = asyncio.create_task(sched.run())
        return sched

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.scheduler.stop()


@pytest.fixture
async def alnair(kube: KubeClient) -> AsyncIterator[AlnairRun]:
    run = AlnairRun(kube)
    yield run
    await run.stop()


async def failed_scheduling(kube: KubeClient, namespace: str, pod: str, *needles: str) -> str:
    """The FailedScheduling Event on `pod` whose message has every one of `needles`."""

    async def found() -> str | None:
        for e in await events_for(kube, namespace, pod, "FailedScheduling"):
            if all(n in e["message"] for n in needles):
                return str(e["message"])
        return None

    message: str = await wait_for(found, 30)
    return message


async def test_alnair_allocates_the_same_workload_within_capacity(
    kube: KubeClient, namespace: str, dra_node: str, alnair: AlnairRun
) -> None:
    sched = await alnair.start()
    assert sched.dra is not None
    assert {"resourceclaims", "resourceslices", "deviceclasses"} <= {
        inf.name for inf in sched.informers()
    }
    # a claim no device can satisfy (90 GiB of an 80 GiB GPU), asked while
    # every GPU is free: the Event names the request, the explain API shows it
    await kube.create(
        dra.RESOURCECLAIMTEMPLATES, claim_template(namespace, name="huge", memory="90Gi")
    )
    await kube.create(PODS, claim_pod("huge", namespace, "alnair", template="huge"))
    unsatisfiable = await failed_scheduling(
        kube, namespace, "huge", "ResourceClaim huge-gpu", "request gpu",
        "without room for compute 30, memory 92160Mi",
    )  # fmt: skip
    why = sched.explain(namespace, "huge")
    [claim] = why["claims"]
    assert claim["requests"][0]["capacity"] == {"compute": "30", "memory": str(90 << 30)}
    assert "without room for compute 30, memory 92160Mi" in why["filtered"][dra_node]

    await kube.create(dra.RESOURCECLAIMTEMPLATES, claim_template(namespace))
    names = [f"share-{i:02d}" for i in range(FIRST + SECOND)]
    for name in names[:FIRST]:
        await kube.create(PODS, claim_pod(name, namespace, "alnair"))
    pods = await wait_pods(kube, namespace, bound=FIRST)
    pods = [p for p in pods if p["spec"].get("nodeName")]
    claims = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
    partial = check_allocations(claims, pods, dra_node)
    assert partial["claims_placed"] == FIRST
    # the binder's annotations name the GPU each claim was allocated on
    by_pod = {c["metadata"]["ownerReferences"][0]["uid"]: c for c in claims}
    for p in pods:
        [result] = by_pod[p["metadata"]["uid"]]["status"]["allocation"]["devices"]["results"]
        gpus = p["metadata"]["annotations"][r.ANN_GPU_INDICES]
        assert result["device"] == dra.device_name(int(gpus)), (p["metadata"]["name"], result)

    # a claim outside what the allocator does gets an Event with its reason; the scheduler
    # goes on with the next pods
    odd = claim_template(namespace, name="odd")
    odd["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu.alnair.io"].model.startsWith("H")'}}
    ]
    await kube.create(dra.RESOURCECLAIMTEMPLATES, odd)
    await kube.create(PODS, claim_pod("odd", namespace, "alnair", template="odd"))
    malformed = await failed_scheduling(
        kube, namespace, "odd", "ResourceClaim odd-gpu", "startsWith"
    )

    for name in names[FIRST:]:
        await kube.create(PODS, claim_pod(name, namespace, "alnair"))
    refused = FIRST + SECOND - FITS
    pods = await wait_pods(kube, namespace, bound=FITS, unschedulable=refused + 2)
    claims = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
    full = check_allocations(claims, pods, dra_node)
    assert full["claims_placed"] == FITS
    assert full["gpus_used"] == GPUS - 1
    assert (dra_node, TAINTED_GPU) in sched.cache.unhealthy  # the slice's taint, as health
    left = {p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")}
    assert {"huge", "odd"} <= left and len(left) == refused + 2
    print(json.dumps({"scheduler": "alnair (Scheduler loop, FGD + DynamicResources)",
                      "after_10": partial, "after_24": full, "unsatisfiable": unsatisfiable,
                      "malformed": malformed}))  # fmt: skip


class FailFirstBind:
    """A Bind plugin ahead of the real one: the first Binding fails after PreBind wrote the
    claim (what it saw is kept), later ones pass to the real Binding."""

    NAME = "FailFirstBind"

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: list[Any] = []
        self.failed = asyncio.Event()

    async def bind(self, pod: PodRequest, state: Any, placement: Placement) -> Status:
        if self.failed.is_set() or pod.namespace != self.namespace:
            return SKIP  # (pods of earlier tests may still be pending in their namespaces)
        self.seen = (await self.kube.list(dra.RESOURCECLAIMS, self.namespace))["items"]
        self.failed.set()
        return error("the API server refused the Binding (injected)")


async def test_a_failed_bind_takes_the_claim_back_on_a_node_known_only_by_its_slice(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """The node publishes its GPUs only in a ResourceSlice (no nvidia.com/gpu): the snapshot
    sizes it from the slice. The first Binding fails after PreBind: Unreserve takes the
    allocation and the reservation off the claim; the retry binds with a valid allocation."""
    await ensure_device_classes(kube, render_with_dra(tmp_path))
    name = f"draonly{uuid.uuid4().hex[:4]}"
    node = gpu_node_manifest(name, GpuNodeSpec(1, "H100", GPUS))
    for where in ("capacity", "allocatable"):
        for key in (r.GPU, r.GPU_COMPUTE, *r.GPU_MEMORY_UNIT_MIB):
            node["status"][where].pop(key)
    for label in (r.LABEL_GPU_MODEL, r.LABEL_GPU_MEMORY_MIB, r.LABEL_GPU_COUNT):
        node["metadata"]["labels"].pop(label, None)
    created = await kube.create(NODES, node)
    run = AlnairRun(kube, initial_backoff_s=3.0, max_backoff_s=3.0)
    try:
        await wait_nodes_ready(kube, {name})
        await kube.create(dra.RESOURCESLICES, node_slice(name, created["metadata"]["uid"]))
        failing = FailFirstBind(kube, namespace)
        sched = await run.start(bind_first=failing)
        assert sched.cache.slice_gpus[name] == (GPUS, "H100-SXM5-80GB", 81920)
        await kube.create(dra.RESOURCECLAIMTEMPLATES, claim_template(namespace, compute="100"))
        pod = await kube.create(PODS, claim_pod("rollback", namespace, "alnair"))
        uid = pod["metadata"]["uid"]
        async with asyncio.timeout(30):
            await failing.failed.wait()
        [claim] = failing.seen
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": "rollback", "uid": uid}
        ]
        [share] = claim["status"]["allocation"]["devices"]["results"]
        assert share["pool"] == name

        async def taken_back() -> bool:
            [c] = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
            return not (c.get("status") or {}).get("allocation")

        await wait_for(taken_back, 3.0, interval_s=0.05)  # within the pod's 3 s backoff
        pods = await wait_pods(kube, namespace, bound=1)
        claims = (await kube.list(dra.RESOURCECLAIMS, namespace))["items"]
        after = check_allocations(claims, pods, name)
        assert after["claims_placed"] == 1
        assert pods[0]["spec"]["nodeName"] == name
    finally:
        await run.stop()
        with contextlib.suppress(Exception):
            await kube.delete(dra.RESOURCESLICES, dra.slice_name(name))
        await kube.delete(NODES, name)


CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False)
CLUSTERROLEBINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False
)


async def test_without_rbac_for_dra_the_scheduler_turns_it_off_and_goes_on(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """The scheduler's own ClusterRole (deploy/) without its resource.k8s.io rules: with
    dra=auto it schedules without DRA, every informer healthy."""
    rbac = yaml.safe_load_all((KUSTOMIZE / "base" / "scheduler" / "rbac.yaml").read_text())
    [role] = [d for d in rbac if d["kind"] == "ClusterRole"]
    rules = [x for x in role["rules"] if "resource.k8s.io" not in x["apiGroups"]]
    assert len(rules) < len(role["rules"])
    who = f"nodra-{namespace}"
    await kube.create(SERVICEACCOUNTS, {"metadata": {"name": who}}, namespace)
    await kube.create(CLUSTERROLES, {"metadata": {"name": who}, "rules": rules})
    await kube.create(CLUSTERROLEBINDINGS, {
        "metadata": {"name": who},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": who},
        "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": namespace}],
    })  # fmt: skip
    assert control_plane.pki is not None
    token = await kube.service_account_token(namespace, who, expiration_s=600)
    config = KubeConfig(
        server=control_plane.server, ca_file=str(control_plane.pki.ca_cert), token=token
    )
    try:
        await control_plane.create_gpu_nodes(
            "1x T4:2", kube=kube, prefix=namespace, labels={"alnair.io/test-pool": namespace}
        )
        async with KubeClient(config) as limited:
            assert "listing deviceclasses refused" in await unavailable(limited)
            run = AlnairRun(limited, dra="auto")
            try:
                sched = await run.start()
                assert sched.dra is None
                await kube.create(PODS, make_pod("plain", namespace).pool(namespace).gpus(1).obj())
                pods = await wait_pods(kube, namespace, bound=1)
                assert pods[0]["metadata"]["annotations"][r.ANN_GPU_INDICES] in {"0", "1"}
                assert all(inf.healthy for inf in sched.informers())
            finally:
                await run.stop()
    finally:
        await kube.delete(CLUSTERROLEBINDINGS, who)
        await kube.delete(CLUSTERROLES, who)
