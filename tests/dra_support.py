"""The DRA workload both schedulers are measured on, and the checks of its allocations.

One KWOK node of 8 x 80 GB GPUs (`8x H100`), its ResourceSlice as the Alnair driver publishes it
(one device per GPU, consumable `memory` and `compute`), GPU 7 tainted unhealthy, the
DeviceClasses from `deploy/kustomize/components/dra`, and pods whose ResourceClaimTemplate asks
the shared class for 10 GiB and 30 % compute. kube-controller-manager's resourceclaim controller
makes each pod's claim from the template; the scheduler under test allocates it.

The checks read every claim's `status.allocation` back from the API server: per device, the
summed `consumedCapacity` never exceeds the device's capacity, a tainted device holds nothing,
and every allocated claim is reserved for its real pod. `quality` summarises the placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from alnair.common import dra
from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory
from alnair.common.kube import PODS, Conflict, KubeClient
from alnair.common.resources import parse_quantity
from alnair.deviceplugin.draslices import build_slice
from alnair.deviceplugin.state import NodeDevices

GPUS = 8
TAINTED_GPU = 7
GPU_MIB = 81920
SHARE_MEMORY = "10Gi"
SHARE_COMPUTE = "30"
SHARES_PER_GPU = 3
"""30 % compute each: three fit a GPU (compute-bound; 3 x 10 GiB is far below 80 GiB)."""
TEMPLATE = "gpu-share"

Obj = dict[str, Any]


def h100_node(name: str, count: int = GPUS) -> NodeDevices:
    """The driver's state for a node of `count` x 80 GB H100s (two GPUs per PCIe root)."""
    state = NodeDevices(name)
    gpus = [
        GpuDevice(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="H100-SXM5-80GB",
            memory_mib=GPU_MIB,
            compute_capability="9.0",
            numa_node=i // 4,
            pcie_root=f"pci0000:{i // 2:02x}",
        )
        for i in range(count)
    ]
    state.set_inventory(GpuInventory(node=name, gpus=gpus))
    return state


def node_slice(node: str, node_uid: str) -> Obj:
    """The ResourceSlice the driver publishes for `node`, with GPU 7 unhealthy (XID 79)."""
    state = h100_node(node)
    state.apply_health(
        GpuHealthChanged(
            node=node,
            gpu_index=TAINTED_GPU,
            gpu_uuid=f"GPU-{node}-{TAINTED_GPU}",
            healthy=False,
            xid=79,
        )
    )
    return build_slice(state.snapshot, generation=1, node_uid=node_uid)


def claim_template(
    namespace: str, name: str = TEMPLATE, memory: str = SHARE_MEMORY, compute: str = SHARE_COMPUTE
) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": dra.CLASS_SHARED,
                                "capacity": {"requests": {"memory": memory, "compute": compute}},
                            },
                        }
                    ]
                }
            }
        },
    }


def claim_pod(
    name: str,
    namespace: str,
    scheduler: str,
    *,
    template: str | None = TEMPLATE,
    claim: str | None = None,
) -> Obj:
    """A pod with one claim `gpu`, made from `template` or naming the existing `claim`."""
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", **source}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/infer:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "256Mi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
        },
    }


async def wait_pods(
    kube: KubeClient, namespace: str, bound: int, unschedulable: int = 0, timeout_s: float = 90
) -> list[Obj]:
    """Wait until `bound` pods have a node and `unschedulable` more carry PodScheduled=False
    with reason Unschedulable (an observation helper for tests)."""
    async with asyncio.timeout(timeout_s):
        while True:
            pods = (await kube.list(PODS, namespace))["items"]
            placed = [p for p in pods if p["spec"].get("nodeName")]
            refused = [
                p
                for p in pods
                if not p["spec"].get("nodeName")
                and any(
                    c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                    for c in (p.get("status") or {}).get("conditions") or []
                )
            ]
            if len(placed) >= bound and len(refused) >= unschedulable:
                return list(pods)
            await asyncio.sleep(0.3)


def results_of(claim: Obj) -> list[Obj]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])


def check_allocations(claims: list[Obj], pods: list[Obj], node: str) -> dict[str, Any]:
    """Assert the allocations are valid; return per-device usage and the placement quality."""
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    memory: dict[str, Decimal] = defaultdict(Decimal)
    compute: dict[str, Decimal] = defaultdict(Decimal)
    claims_per_gpu: dict[str, int] = defaultdict(int)
    allocated = 0
    for c in claims:
        results = results_of(c)
        if not results:
            continue
        allocated += 1
        reserved = (c.get("status") or {}).get("reservedFor") or []
        assert reserved, f"claim {c['metadata']['name']} allocated but not reserved"
        for ref in reserved:
            pod = by_uid.get(ref["uid"])
            assert pod is not None and pod["metadata"]["name"] == ref["name"], ref
            assert pod["spec"].get("nodeName") in (None, node)
        for r in results:
            assert r["driver"] == dra.DRIVER and r["pool"] == node, r
            consumed = r.get("consumedCapacity") or {}
            memory[r["device"]] += parse_quantity(consumed.get("memory", f"{GPU_MIB}Mi"))
            compute[r["device"]] += parse_quantity(consumed.get("compute", "100"))
            claims_per_gpu[r["device"]] += 1
    tainted = dra.device_name(TAINTED_GPU)
    assert tainted not in claims_per_gpu, f"tainted {tainted} took {claims_per_gpu[tainted]}"
    for device in claims_per_gpu:
        assert compute[device] <= 100, (device, compute[device])
        assert memory[device] <= GPU_MIB * (1 << 20), (device, memory[device])
    return quality(claims_per_gpu, compute, allocated)


def quality(
    claims_per_gpu: dict[str, int], compute: dict[str, Decimal], allocated: int
) -> dict[str, Any]:
    """Placement quality: how many GPUs the claims spread over, and what is left whole.

    `free_whole_gpus` counts healthy GPUs no claim touches (room for whole-GPU jobs);
    `stranded_compute_pct` is compute left on used GPUs that is too little for one more share.
    """
    share = Decimal(SHARE_COMPUTE)
    stranded = sum(
        (100 - v) for v in compute.values() if 100 - v < share
    )  # partial GPUs that cannot take another share
    return {
        "claims_placed": allocated,
        "gpus_used": len(claims_per_gpu),
        "free_whole_gpus": GPUS - 1 - len(claims_per_gpu),
        "stranded_compute_pct": int(stranded),
        "claims_per_gpu": dict(sorted(claims_per_gpu.items())),
    }


KUSTOMIZE = Path(__file__).resolve().parents[1] / "deploy" / "kustomize"


KUSTOMIZE = Path(__file__).resolve().parents[1] / "deploy" / "kustomize"


def render_with_dra(tmp_path: Path) -> list[dict[str, Any]]:
    """The production overlay with the DRA component, as an operator would compose them."""
    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n- {rel}/overlays/production\ncomponents:\n- {rel}/components/dra\n"
    )
    kubectl = Path(sys.executable).parent / "kubectl"
    done = subprocess.run(
        [str(kubectl), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


async def ensure_device_classes(kube: KubeClient, docs: list[dict[str, Any]]) -> list[str]:
    names = []
    for doc in docs:
        if doc["kind"] != "DeviceClass":
            continue
        doc["metadata"].pop("labels", None)
        # another test of this session may have created it, from the same manifest
        with contextlib.suppress(Conflict):
            await kube.create(dra.DEVICECLASSES, doc)
        names.append(doc["metadata"]["name"])
    return names
