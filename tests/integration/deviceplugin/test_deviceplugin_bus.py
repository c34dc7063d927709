"""The whole device plugin process against a real nats-server: the GPU inventory from the KV
bucket becomes devices, GPU health events from the bus take devices out of ListAndWatch and
bring them back, and a fractional pod's utilisation reaches its shims through the registry."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from alnair.common import resources
from alnair.common.bus import Bus
from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory, PodMetric
from alnair.common.tasks import within
from alnair.deviceplugin.app import Running, start
from alnair.deviceplugin.devices import COMPUTE, WHOLE
from alnair.deviceplugin.pods import StaticPods
from alnair.deviceplugin.settings import DevicePluginSettings

pytestmark = pytest.mark.integration

GPUS = [
    GpuDevice(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=256, numa_node=0) for i in range(2)
]
POD = {
    "metadata": {
        "name": "infer",
        "namespace": "ml",
        "uid": "5a5a5a5a-0000",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "annotations": {resources.ANN_GPU_INDICES: "1"},
    },
    "spec": {
        "nodeName": "n1",
        "containers": [{"name": "main", "resources": {"limits": {resources.GPU_COMPUTE: "30"}}}],
    },
    "status": {"phase": "Pending"},
}


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url, name="test-profiler")
    yield b
    await b.close()


@pytest.fixture
async def plugin(nats_url: str, kubelet: Any) -> AsyncIterator[Running]:
    # short: a unix socket path holds at most 107 bytes, and each vGPU's registry socket
    # lives under the state directory
    state = tempfile.mkdtemp(prefix="alnair-dp-", dir="/tmp")
    settings = DevicePluginSettings(
        nats_url=nats_url,
        node_name="n1",
        kubelet_dir=kubelet.dir,
        state_dir=state,
        http_host="127.0.0.1",
        http_port=0,
        register_retry_max_s=0.2,
        log_json=False,
    )
    running = await start(settings, CollectorRegistry(), pods=StaticPods("n1", [POD]))
    yield running
    await running.stop()
    shutil.rmtree(state, ignore_errors=True)


async def test_inventory_and_health_events_drive_list_and_watch(
    plugin: Running, bus: Bus, kubelet: Any, connect: Any
) -> None:
    await kubelet.wait_registrations(3)
    kv = await bus.kv(GpuInventory.BUCKET)
    await kv.put("n1", GpuInventory(node="n1", gpus=GPUS).model_dump_json().encode())
    client = connect(plugin.plugins[WHOLE].socket_path)
    async with client.watch() as watch:
        devices = await watch.next()
        while len(devices) < 2:  # the stream may open before the inventory arrives
            devices = await watch.next()
        assert devices == {"GPU-0": "Healthy", "GPU-1": "Healthy"}
        await bus.publish(
            GpuHealthChanged(node="n1", gpu_index=1, gpu_uuid="GPU-1", healthy=False, xid=48),
            source="test",
        )
        assert await watch.next() == {"GPU-0": "Healthy", "GPU-1": "Unhealthy"}
        # another node's GPU going down changes nothing here
        await bus.publish(
            GpuHealthChanged(node="n2", gpu_index=0, gpu_uuid="GPU-x", healthy=False),
            source="test",
        )
        await bus.publish(
            GpuHealthChanged(node="n1", gpu_index=1, gpu_uuid="GPU-1", healthy=True),
            source="test",
        )
        assert await watch.next() == {"GPU-0": "Healthy", "GPU-1": "Healthy"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plugin.http_port}") as http:
        body = (await http.get("/v1/devices")).json()
    assert body["resources"][COMPUTE] == {"total": 200, "healthy": 200}


async def test_utilisation_reaches_the_shims_of_the_pod(
    plugin: Running, bus: Bus, kubelet: Any, connect: Any
) -> None:
    await kubelet.wait_registrations(3)
    plugin.state.set_gpus(GPUS)
    client = connect(plugin.plugins[COMPUTE].socket_path)
    rep = await client.allocate([f"sm-1-{k}" for k in range(30)])
    envs = dict(rep.container_responses[0].envs)
    assert envs["ALNAIR_GPU_COMPUTE_PCT"] == "30"
    vgpu = envs["ALNAIR_VGPU_ID"]

    # a shim's side of the registry protocol, on the socket the container gets mounted
    reader, writer = await asyncio.open_unix_connection(str(plugin.vgpus.socket_for(vgpu)))
    writer.write(f"REGISTER vgpu={vgpu} pid=7 region=/r memory=- compute=30\n".encode())
    await writer.drain()
    await within(plugin.vgpus.wait_registered(vgpu), 5)

    metric = PodMetric(
        node="n1",
        namespace="ml",
        pod="infer",
        pod_uid="5a5a5a5a-0000",
        gpu_index=1,
        sm_util_pct=42.5,
    )
    await bus.publish(metric, source="test")
    line = await within(reader.readline(), 5)
    assert line == b"UTIL 0 42.50\n"

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plugin.http_port}") as http:
        text = (await http.get("/metrics")).text
        vgpus = (await http.get("/v1/vgpus")).json()
    assert (
        f'alnair_deviceplugin_vgpu_processes{{container="main",gpu="1",namespace="ml",pod="infer",vgpu="{vgpu}"}} 1.0'
        in text
    )
    assert vgpus[0]["compute_pct"] == 30
    assert vgpus[0]["processes"] == 1
    writer.close()
    await writer.wait_closed()


async def test_ready_only_while_the_kubelet_has_registered_every_resource(
    plugin: Running, kubelet: Any
) -> None:
    """`/readyz` says which resources the kubelet does not know yet: a plugin it never
    registered offers the node's GPUs to no pod. A restarting kubelet (its folder cleared)
    makes the plugin unready until each resource has registered again."""

    async def readiness(http: httpx.AsyncClient) -> tuple[int, str]:
        resp = await http.get("/readyz")
        return resp.status_code, resp.json().get("detail", "")

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plugin.http_port}") as http:
        await kubelet.wait_registrations(3)
        async with asyncio.timeout(5):  # counted once the kubelet's answer is back
            while (await readiness(http))[0] != 200:
                await asyncio.sleep(0.05)
        await kubelet.stop(clear=True)
        async with asyncio.timeout(5):  # the plugins see their sockets go (directory watch)
            while (got := await readiness(http))[0] != 503:
                await asyncio.sleep(0.05)
        assert got[1].startswith("not registered with the kubelet: ")
        assert set(got[1].split(": ", 1)[1].split(", ")) <= set(plugin.plugins)
        await kubelet.start()
        await kubelet.wait_registrations(6, timeout_s=15)
        async with asyncio.timeout(5):
            while (await readiness(http))[0] != 200:
                await asyncio.sleep(0.05)
