"""The local control plane is real: 50 KWOK GPU nodes, a pod bound from Python, a pod lifetime."""

from __future__ import annotations

import asyncio
import time

import pytest

from alnair.common import resources as r
from alnair.common.kube import NODES, PODS, KubeClient
from alnair.dev.localstack import ControlPlane

pytestmark = pytest.mark.e2e


async def wait_phase(kube: KubeClient, ns: str, name: str, phase: str, timeout_s: float) -> dict:
    pod = await kube.get(PODS, name, ns)
    if pod["status"].get("phase") == phase:
        return pod
    rv = pod["metadata"]["resourceVersion"]
    async with asyncio.timeout(timeout_s):
        while True:
            async for _t, obj in kube.watch(
                PODS, ns, resource_version=rv, field_selector=f"metadata.name={name}"
            ):
                rv = obj["metadata"]["resourceVersion"]
                if obj["status"].get("phase") == phase:
                    return obj


async def test_gpu_pod_bound_from_python_runs_then_succeeds(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    names = await control_plane.create_gpu_nodes("50x V100M32", kube=kube, prefix="cp")
    assert len(names) == 50
    node = await kube.get(NODES, names[0])
    assert node["status"]["allocatable"][r.GPU] == "8"
    assert node["metadata"]["labels"][r.LABEL_GPU_MODEL] == "V100M32"

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": namespace,
            "annotations": {r.ANN_DURATION: r.duration_value(3)},
        },
        "spec": {
            "schedulerName": r.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/train:1",
                    "resources": {"limits": {r.GPU: "1"}, "requests": {r.GPU: "1"}},
                }
            ],
        },
    }
    created = await kube.create(PODS, pod, namespace)
    assert "nodeName" not in created["spec"]  # nobody but us schedules `alnair` pods
    await kube.bind(namespace, "train", names[7], uid=created["metadata"]["uid"])
    running = await wait_phase(kube, namespace, "train", "Running", 30)
    assert running["spec"]["nodeName"] == names[7]
    t_running = time.monotonic()
    done = await wait_phase(kube, namespace, "train", "Succeeded", 30)
    lived = time.monotonic() - t_running
    assert 2.0 <= lived <= 10.0, lived
    state = done["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["reason"] == "Completed"
