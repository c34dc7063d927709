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
from pathlib import Path
from typing import Any

import pytest

from alnair.common import dra
from alnair.common.kube import NODES, PODS, KubeClient
from alnair.common.localstack import ControlPlane, ManagedProcess
from alnair.common.localstack.controlplane import binary
from dra_support import (
    GPUS,
    SHARES_PER_GPU,
    check_allocations,
    claim_pod,
    claim_template,
    node_slice,
    wait_pods,
)
from e2e.test_dra import ensure_device_classes, render_with_dra

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
