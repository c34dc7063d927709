"""The device plugin with a real API server (the local control plane): Allocate finds the pod
being admitted from the scheduler's annotations, honours its GPU, marks the container as
allocated on the pod, and the pod's deletion, seen by the plugin's pod watch, releases the
vGPU's state on the node."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from alnair.common import resources
from alnair.common.events import GpuDevice
from alnair.common.kube import PODS, KubeClient
from alnair.deviceplugin.app import start
from alnair.deviceplugin.devices import MEMORY_GIB
from alnair.deviceplugin.settings import DevicePluginSettings

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

GPUS = [
    GpuDevice(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=1024, numa_node=0) for i in range(2)
]


async def test_allocate_uses_the_api_server_and_releases_on_deletion(
    control_plane: Any,
    kube: KubeClient,
    namespace: str,
    kubelet: Any,
    connect: Any,
    tmp_path: Path,
) -> None:
    # a node no kubelet runs: the pod stays Pending, as it is while its kubelet admits it
    node = f"dp-{uuid.uuid4().hex[:6]}"
    settings = DevicePluginSettings(
        node_name=node,
        kubeconfig=str(control_plane.kubeconfig),
        kubelet_dir=kubelet.dir,
        state_dir=str(tmp_path / "state"),
        register_retry_max_s=0.2,
        log_json=False,
    )
    running = await start(settings, CollectorRegistry(), connect_bus=False, http=False)
    try:
        running.state.set_gpus(GPUS)
        await kubelet.wait_registrations(3)
        await kube.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "infer",
                    "namespace": namespace,
                    "annotations": {resources.ANN_GPU_INDICES: "1"},
                },
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.com/infer:1",
                            # the default memory resource: GiB units
                            "resources": {"limits": {resources.GPU_MEMORY_GIB: "1"}},
                        }
                    ],
                },
            },
            namespace=namespace,
        )
        client = connect(running.plugins[MEMORY_GIB].socket_path)
        rep = await client.allocate(["gib-0-0"])
        envs = dict(rep.container_responses[0].envs)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"  # the scheduler's GPU, not the units'
        assert envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "1024"  # the exact MiB granted
        pod = await kube.get(PODS, "infer", namespace)
        assert pod["metadata"]["annotations"]["alnair.io/allocated-gpu-memory-gib"] == "main"
        (rec,) = running.vgpus.records()
        assert (rec.pod, rec.pod_uid) == ("infer", pod["metadata"]["uid"])
        host_dir = Path(running.vgpus.layout.vgpu_host_dir(rec.vgpu_id))
        assert await asyncio.to_thread(host_dir.exists)

        await kube.delete(PODS, "infer", namespace, grace_period_s=0)
        for _ in range(200):  # the watch event arrives within milliseconds; allow 10 s
            if not running.vgpus.records():
                break
            await asyncio.sleep(0.05)
        assert not await asyncio.to_thread(host_dir.exists)
        assert running.vgpus.records() == []
    finally:
        await running.stop()
