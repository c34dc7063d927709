"""What the DRA driver publishes: the node's GPUs as one ResourceSlice (`resource.k8s.io/v1`).

One device per GPU (`gpu-<index>`), in a pool named after the node. Attributes say what the
GPU is (uuid, model, index, compute capability as a version, NUMA node, PCIe root under the
standard `resource.kubernetes.io/pcieRoot` name) so DeviceClass and claim selectors can pick
by them. Capacity `memory` and `compute` is consumable (KEP-5075): the device allows multiple
allocations, and each capacity's request policy has the whole GPU as its default, so a claim
that names no capacity takes all of it, and one that names some takes that much rounded up to
the policy's step (1 MiB, 1 %).

An unhealthy GPU keeps its device, with a `gpu.alnair.io/unhealthy` NoSchedule taint (KEP-5055):
allocators give it no new claims, while claims already on it stay (the health event says the
GPU failed, not that its pods must be evicted). Pure functions of the node snapshot.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from alnair.common import dra
from alnair.common.events import GpuDevice
from alnair.common.kube import Obj
from alnair.deviceplugin.state import NodeSnapshot


def _attributes(gpu: GpuDevice) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        dra.ATTR_UUID: {"string": gpu.uuid},
        dra.ATTR_MODEL: {"string": gpu.model},
        dra.ATTR_INDEX: {"int": gpu.index},
    }
    version = dra.semver(gpu.compute_capability)
    if version is not None:
        attrs[dra.ATTR_COMPUTE_CAPABILITY] = {"version": version}
    if gpu.numa_node is not None:
        attrs[dra.ATTR_NUMA] = {"int": gpu.numa_node}
    if gpu.pcie_root:
        attrs[dra.ATTR_PCIE_ROOT] = {"string": gpu.pcie_root}
    return attrs


def _capacity(gpu: GpuDevice) -> dict[str, dict[str, Any]]:
    memory = dra.memory_quantity(gpu.memory_mib)
    compute = str(dra.COMPUTE_FULL)
    return {
        dra.CAPACITY_MEMORY: {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        dra.CAPACITY_COMPUTE: {
            "value": compute,
            "requestPolicy": {"default": compute, "validRange": {"min": "1", "step": "1"}},
        },
    }


def _taint_value(xid: int | None) -> str:
    # a taint value is a label value: the XID when known, else a fixed word
    return f"xid-{xid}" if xid is not None else "true"


def build_device(gpu: GpuDevice, snap: NodeSnapshot) -> Obj:
    device: Obj = {
        "name": dra.device_name(gpu.index),
        "attributes": _attributes(gpu),
        "capacity": _capacity(gpu),
        "allowMultipleAllocations": True,
    }
    if not snap.health.healthy(gpu.uuid):
        state = snap.health.get(gpu.uuid)
        added: datetime | None = state.observed if state else None
        taint: Obj = {
            "key": dra.TAINT_UNHEALTHY,
            "value": _taint_value(state.xid if state else None),
            "effect": "NoSchedule",
        }
        if added is not None:
            taint["timeAdded"] = added.strftime("%Y-%m-%dT%H:%M:%SZ")
        device["taints"] = [taint]
    return device


def build_slice(
    snap: NodeSnapshot, generation: int, *, node_uid: str = "", driver: str = dra.DRIVER
) -> Obj:
    """The node's ResourceSlice at pool `generation` (bumped by the publisher on every change).

    With `node_uid`, the Node owns the slice, so deleting the node deletes its slice.
    """
    meta: Obj = {"name": dra.slice_name(snap.node)}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": snap.node, "uid": node_uid}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": snap.node,
            "pool": {
                "name": dra.pool_name(snap.node),
                "generation": generation,
                "resourceSliceCount": 1,
            },
            "devices": [build_device(g, snap) for g in snap.gpus],
        },
    }
