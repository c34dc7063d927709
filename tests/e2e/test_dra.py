"""Dynamic Resource Allocation on the real API server: the driver's ResourceSlice for a node of
8 x 80 GB GPUs is accepted as published (consumable capacity, request policies, taints), and the
DeviceClasses that ship in deploy/ are accepted too."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from alnair.common import dra
from alnair.common.events import GpuHealthChanged
from alnair.common.kube import PODS, KubeClient
from alnair.deviceplugin.draslices import build_slice
from dra_support import GPU_MIB, ensure_device_classes, h100_node, render_with_dra

pytestmark = pytest.mark.e2e


async def test_resource_slice_for_eight_80gb_gpus_is_accepted(kube: KubeClient) -> None:
    node = f"dra-{uuid.uuid4().hex[:6]}"
    state = h100_node(node)
    state.apply_health(
        GpuHealthChanged(node=node, gpu_index=5, gpu_uuid=f"GPU-{node}-5", healthy=False, xid=79)
    )
    body = build_slice(state.snapshot, generation=1)
    created = await kube.create(dra.RESOURCESLICES, body)
    try:
        spec = created["spec"]
        assert spec["driver"] == dra.DRIVER and spec["nodeName"] == node
        assert spec["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
        devices = {d["name"]: d for d in spec["devices"]}
        assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
        gpu0 = devices["gpu-0"]
        assert gpu0["allowMultipleAllocations"] is True
        assert gpu0["capacity"]["memory"]["value"] == "80Gi"
        assert gpu0["capacity"]["memory"]["requestPolicy"]["default"] == "80Gi"
        assert gpu0["capacity"]["compute"]["value"] == "100"
        assert gpu0["attributes"]["computeCapability"] == {"version": "9.0.0"}
        assert gpu0["attributes"][dra.ATTR_PCIE_ROOT] == {"string": "pci0000:00"}
        assert gpu0["attributes"]["numaNode"] == {"int": 0}
        assert "taints" not in gpu0
        taints = devices["gpu-5"]["taints"]
        assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
            (dra.TAINT_UNHEALTHY, "xid-79", "NoSchedule")
        ]
    finally:
        await kube.delete(dra.RESOURCESLICES, body["metadata"]["name"])


async def test_dra_component_ships_device_classes_the_api_server_accepts(
    kube: KubeClient, tmp_path: Path
) -> None:
    docs = render_with_dra(tmp_path)
    names = await ensure_device_classes(kube, docs)
    assert sorted(names) == sorted(dra.CLASSES)
    shared = await kube.get(dra.DEVICECLASSES, dra.CLASS_SHARED)
    [config] = shared["spec"]["config"]
    assert config["opaque"]["driver"] == dra.DRIVER
    assert config["opaque"]["parameters"]["kind"] == dra.SHARING_CONFIG_KIND
    [ds] = [
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("plugin")
    ]
    [container] = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ALNAIR_DEVICEPLUGIN_MODE"] == "both"
    host_paths = {
        v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    }
    assert {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
    } <= host_paths
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    rules = roles["alnair-deviceplugin-dra"]["rules"]
    assert {
        r["resources"][0]: r["verbs"] for r in rules if r["apiGroups"] == ["resource.k8s.io"]
    } == {"resourceslices": ["get", "list", "watch", "create", "update"], "resourceclaims": ["get"]}


async def test_claims_allocated_by_the_scheduler_allocator_pack_without_overcommit(
    kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """40 claims of 10 GiB and 30 % onto a node of 8 x 80 GB (room for 24 by compute): the
    allocations are written to the API server as the scheduler writes them (status.allocation
    and reservedFor), and the sums, read back from every claim, never exceed a GPU."""
    from decimal import Decimal

    from alnair.common.resources import parse_quantity
    from alnair.scheduler.dra.allocator import Usage, allocate, node_devices, parse_requests

    await ensure_device_classes(kube, render_with_dra(tmp_path))
    classes = {c: await kube.get(dra.DEVICECLASSES, c) for c in dra.CLASSES}
    node = f"dra-{uuid.uuid4().hex[:6]}"
    state = h100_node(node)
    state.apply_health(
        GpuHealthChanged(node=node, gpu_index=7, gpu_uuid=f"GPU-{node}-7", healthy=False, xid=79)
    )
    created = await kube.create(dra.RESOURCESLICES, build_slice(state.snapshot, generation=1))
    try:
        devices = node_devices([created], node)
        usage = Usage()
        placed, refused = 0, []
        for i in range(40):
            claim = await kube.create(
                dra.RESOURCECLAIMS,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"share-{i}", "namespace": namespace},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": dra.CLASS_SHARED,
                                        "capacity": {
                                            "requests": {"memory": "10Gi", "compute": "30"}
                                        },
                                    },
                                }
                            ]
                        }
                    },
                },
            )
            got = allocate(
                claim, parse_requests(claim), devices, classes, usage, new_share_id=uuid.uuid4
            )
            if not got.results:
                refused.append(got.reason)
                continue
            usage.set_claim(claim["metadata"]["uid"], got.results)
            # reserved for a real pod: the resourceclaim controller drops reservations of
            # pods that do not exist
            pod = await kube.create(
                PODS,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p{i}", "namespace": namespace},
                    "spec": {
                        "schedulerName": "nobody",
                        "containers": [{"name": "main", "image": "example.com/infer:1"}],
                    },
                },
            )
            pod_uid = pod["metadata"]["uid"]
            claim["status"] = {
                "allocation": {
                    "devices": {"results": list(got.results)},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": pod_uid}],
            }
            await kube.replace(dra.RESOURCECLAIMS, claim, sub="status")
            placed += 1
        # 7 healthy GPUs x 3 shares (compute-bound); GPU 7 is tainted
        assert placed == 21
        assert len(refused) == 19
        assert "request gpu" in refused[0] and "1 tainted" in refused[0]
        stored = await kube.list(dra.RESOURCECLAIMS, namespace)
        memory: dict[str, Decimal] = {}
        compute: dict[str, Decimal] = {}
        for c in stored["items"]:
            for r in claim_results_of(c):
                memory[r["device"]] = memory.get(r["device"], Decimal(0)) + parse_quantity(
                    r["consumedCapacity"]["memory"]
                )
                compute[r["device"]] = compute.get(r["device"], Decimal(0)) + parse_quantity(
                    r["consumedCapacity"]["compute"]
                )
        assert sorted(compute) == [f"gpu-{i}" for i in range(7)]
        assert all(v <= 100 for v in compute.values())
        assert all(v <= GPU_MIB * (1 << 20) for v in memory.values())
    finally:
        await kube.delete(dra.RESOURCESLICES, dra.slice_name(node))


def claim_results_of(claim: dict[str, Any]) -> list[dict[str, Any]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])
