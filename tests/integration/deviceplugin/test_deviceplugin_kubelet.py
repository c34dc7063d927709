"""The device plugin against a stand-in kubelet over real unix-socket gRPC: registration,
ListAndWatch following GPU health down and back up, preferred allocations, Allocate responses
for whole and fractional GPUs, and re-registration after a kubelet restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from alnair.common import resources
from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory, GpuLink
from alnair.common.tasks import cancel_all, spawn, within
from alnair.deviceplugin.allocation import Layout
from alnair.deviceplugin.devices import COMPUTE, MEMORY, MEMORY_GIB, RESOURCES, WHOLE
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.plugin import PluginConfig, PluginServer, ResourcePlugin
from alnair.deviceplugin.pods import PodSource, StaticPods
from alnair.deviceplugin.registry import VgpuRegistry
from alnair.deviceplugin.state import NodeDevices

pytestmark = pytest.mark.integration

NV, SYS, X = GpuLink.NVLINK, GpuLink.SYS, GpuLink.SELF
GPUS = [
    GpuDevice(index=i, uuid=f"GPU-{i}", model="V100M32", memory_mib=1024, numa_node=i // 2)
    for i in range(4)
]
TOPOLOGY = [
    [X if i == j else (NV if i // 2 == j // 2 else SYS) for j in range(4)] for i in range(4)
]


@dataclass
class Node:
    state: NodeDevices
    servers: dict[str, PluginServer]
    vgpus: VgpuRegistry
    layout: Layout
    tasks: list[asyncio.Task[Any]]


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(
        shim_host_path="/opt/alnair/libalnair-intercept.so", state_dir=str(tmp_path / "state")
    )


@pytest.fixture
async def start_node(kubelet: Any, layout: Layout) -> AsyncIterator[Callable[..., Any]]:
    nodes: list[Node] = []

    async def start(pods: PodSource | None = None) -> Node:
        state = NodeDevices("n1")
        state.set_inventory(GpuInventory(node="n1", gpus=GPUS, topology=TOPOLOGY))
        vgpus = VgpuRegistry(layout)
        metrics = DevicePluginMetrics()
        config = PluginConfig(layout=layout)
        servers: dict[str, PluginServer] = {}
        tasks = []
        for resource in RESOURCES:
            plugin = ResourcePlugin(
                resource, state, config=config, pods=pods, vgpus=vgpus, metrics=metrics
            )
            srv = PluginServer(plugin, kubelet.dir, retry_max_s=0.2)
            servers[resource] = srv
            tasks.append(spawn(srv.run(), name=f"test.plugin.{resource}"))
        node = Node(state, servers, vgpus, layout, tasks)
        nodes.append(node)
        await kubelet.wait_registrations(len(RESOURCES))
        return node

    yield start
    for node in nodes:
        await cancel_all(node.tasks)


async def test_each_resource_registers_and_lists_its_devices(
    kubelet: Any, start_node: Any, connect: Any
) -> None:
    node = await start_node()
    requests = await kubelet.wait_registrations(len(RESOURCES))
    assert {r.resource_name for r in requests} == set(RESOURCES)
    assert {r.version for r in requests} == {"v1beta1"}
    assert all(r.options.get_preferred_allocation_available for r in requests)
    by_name = {r.resource_name: r.endpoint for r in requests}
    assert by_name[WHOLE] == "alnair-gpu.sock"

    client = connect(node.servers[COMPUTE].socket_path)
    assert (await client.options()).get_preferred_allocation_available
    async with client.watch() as watch:
        msg = await watch.next_raw()
    assert len(msg.devices) == 4 * 100
    assert {d.health for d in msg.devices} == {"Healthy"}
    numa = {d.ID: d.topology.nodes[0].ID for d in msg.devices}
    assert numa["sm-3-42"] == 1
    assert numa["sm-0-0"] == 0

    memory = connect(node.servers[MEMORY].socket_path)
    async with memory.watch() as watch:
        assert len(await watch.next()) == 4 * 1024
    gib = connect(node.servers[MEMORY_GIB].socket_path)
    async with gib.watch() as watch:
        assert sorted(await watch.next()) == [f"gib-{g}-0" for g in range(4)]


async def test_list_and_watch_follows_health_down_and_back_up(
    start_node: Any, connect: Any
) -> None:
    node = await start_node()
    client = connect(node.servers[WHOLE].socket_path)
    memory = connect(node.servers[MEMORY].socket_path)
    async with client.watch() as watch, memory.watch() as mem_watch:
        assert set((await watch.next()).values()) == {"Healthy"}
        await mem_watch.next()
        node.state.apply_health(
            GpuHealthChanged(node="n1", gpu_index=2, gpu_uuid="GPU-2", healthy=False, xid=79)
        )
        down = await watch.next()
        assert down["GPU-2"] == "Unhealthy"
        assert [h for g, h in down.items() if g != "GPU-2"] == ["Healthy"] * 3
        mem_down = await mem_watch.next()
        assert {h for d, h in mem_down.items() if d.startswith("mem-2-")} == {"Unhealthy"}
        node.state.apply_health(
            GpuHealthChanged(node="n1", gpu_index=2, gpu_uuid="GPU-2", healthy=True)
        )
        up = await watch.next()
        assert set(up.values()) == {"Healthy"}
        assert set((await mem_watch.next()).values()) == {"Healthy"}


async def test_preferred_allocation_over_grpc(start_node: Any, connect: Any) -> None:
    node = await start_node()
    whole = connect(node.servers[WHOLE].socket_path)
    assert sorted(await whole.preferred(["GPU-0", "GPU-2", "GPU-3"], [], 2)) == ["GPU-2", "GPU-3"]
    memory = connect(node.servers[MEMORY].socket_path)
    available = [f"mem-0-{k}" for k in range(900)] + [f"mem-1-{k}" for k in range(300)]
    chosen = await memory.preferred(available, [], 256)
    assert len(chosen) == 256
    assert {c.split("-")[1] for c in chosen} == {"1"}


async def test_allocate_whole_gpus(start_node: Any, connect: Any) -> None:
    node = await start_node()
    client = connect(node.servers[WHOLE].socket_path)
    rep = await client.allocate(["GPU-2", "GPU-3"], ["GPU-0"])
    first, second = rep.container_responses
    assert dict(first.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-2,GPU-3",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert "LD_PRELOAD" not in first.envs
    assert list(first.mounts) == []
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
    assert (await client.pre_start(["GPU-0"])) is not None


async def test_allocate_a_fraction_without_a_scheduler_decision(
    start_node: Any, connect: Any, layout: Layout
) -> None:
    node = await start_node()
    client = connect(node.servers[MEMORY].socket_path)
    rep = await client.allocate([f"mem-1-{k}" for k in range(512)])
    (c,) = rep.container_responses
    envs = dict(c.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert envs["CUDA_VISIBLE_DEVICES"] == "0"
    assert envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "512"
    assert "ALNAIR_GPU_COMPUTE_PCT" not in envs
    assert envs["LD_PRELOAD"] == layout.shim_container_path
    mounts = {m.container_path: (m.host_path, m.read_only) for m in c.mounts}
    assert mounts[layout.shim_container_path] == (layout.shim_host_path, True)
    vgpu = envs["ALNAIR_VGPU_ID"]
    host_dir = Path(layout.vgpu_host_dir(vgpu))
    assert mounts["/var/run/alnair/vgpu"] == (str(host_dir), False)
    # the record stays in the plugin's own state, out of the container's reach
    assert not (host_dir / "allocation.json").exists()
    assert (Path(layout.state_dir) / "records" / f"{vgpu}.json").exists()
    (rec,) = node.vgpus.records()
    assert (rec.vgpu_id, rec.gpu_index, rec.memory_mib) == (vgpu, 1, 512)


def fractional_pod(
    gpu: int, memory: int, compute: int, memory_resource: str = resources.GPU_MEMORY
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "infer",
            "namespace": "ml",
            "uid": "0f1e2d3c-aaaa",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {resources.ANN_GPU_INDICES: str(gpu)},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "name": "server",
                    "resources": {
                        "limits": {
                            memory_resource: str(memory),
                            resources.GPU_COMPUTE: str(compute),
                        }
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


async def test_allocate_honours_the_scheduler_and_agrees_across_resources(
    start_node: Any, connect: Any
) -> None:
    pods = StaticPods("n1", [fractional_pod(gpu=3, memory=256, compute=40)])
    node = await start_node(pods)
    memory = connect(node.servers[MEMORY].socket_path)
    compute = connect(node.servers[COMPUTE].socket_path)
    # the kubelet's units come from GPU 0, the scheduler chose GPU 3: units are fungible
    mem_rep = await memory.allocate([f"mem-0-{k}" for k in range(256)])
    cpu_rep = await compute.allocate([f"sm-0-{k}" for k in range(40)])
    mem_env = dict(mem_rep.container_responses[0].envs)
    cpu_env = dict(cpu_rep.container_responses[0].envs)
    assert mem_env["NVIDIA_VISIBLE_DEVICES"] == "GPU-3"
    assert mem_env["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "256"
    assert mem_env["ALNAIR_GPU_COMPUTE_PCT"] == "40"
    # the kubelet merges both responses into one container: they must not disagree
    assert mem_env == cpu_env
    assert list(mem_rep.container_responses[0].mounts) == list(
        cpu_rep.container_responses[0].mounts
    )
    (rec,) = node.vgpus.records()
    assert (rec.namespace, rec.pod, rec.container, rec.gpu_index) == ("ml", "infer", "server", 3)
    ann = pods.pods[0]["metadata"]["annotations"]
    assert ann["alnair.io/allocated-gpu-memory"] == "server"
    assert ann["alnair.io/allocated-gpu-compute"] == "server"


async def test_a_gib_request_gets_the_exact_mib_granted_as_its_limit(
    start_node: Any, connect: Any
) -> None:
    """`alnair.io/gpu-memory-gib` units are GiB: the shim's limit is the MiB they make."""
    pods = StaticPods("n1", [fractional_pod(2, 1, 30, resources.GPU_MEMORY_GIB)])
    node = await start_node(pods)
    memory = connect(node.servers[MEMORY_GIB].socket_path)
    compute = connect(node.servers[COMPUTE].socket_path)
    mem_rep = await memory.allocate(["gib-0-0"])
    cpu_rep = await compute.allocate([f"sm-0-{k}" for k in range(30)])
    mem_env = dict(mem_rep.container_responses[0].envs)
    assert mem_env["NVIDIA_VISIBLE_DEVICES"] == "GPU-2"
    assert mem_env["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "1024"
    assert mem_env == dict(cpu_rep.container_responses[0].envs)
    (rec,) = node.vgpus.records()
    assert (rec.memory_mib, rec.compute_pct, rec.gpu_index) == (1024, 30, 2)
    assert pods.pods[0]["metadata"]["annotations"]["alnair.io/allocated-gpu-memory-gib"] == "server"


async def test_allocate_refuses_foreign_device_ids(start_node: Any, connect: Any) -> None:
    node = await start_node()
    client = connect(node.servers[MEMORY].socket_path)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.allocate(["mem-9-1"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "9" in (err.value.details() or "")


async def test_registers_again_after_the_kubelet_restarts(
    kubelet: Any, start_node: Any, connect: Any
) -> None:
    node = await start_node()
    watches = []
    for resource in RESOURCES:
        client = connect(node.servers[resource].socket_path)
        call = client.watch()
        watch = await call.__aenter__()
        await watch.next()
        watches.append(call)
    await kubelet.stop(clear=True)  # a restarting kubelet removes every socket
    assert not node.servers[WHOLE].socket_path.exists()
    for call in watches:
        await call.__aexit__(None, None, None)
    await kubelet.start()
    requests = await kubelet.wait_registrations(2 * len(RESOURCES), timeout_s=15)
    assert {r.resource_name for r in requests[len(RESOURCES) :]} == set(RESOURCES)
    client = connect(node.servers[WHOLE].socket_path)
    async with client.watch() as watch:
        assert len(await watch.next()) == 4
    assert node.servers[WHOLE].registrations == 2


async def test_a_kubelet_restart_without_any_stream_is_noticed_from_the_directory(
    kubelet: Any, start_node: Any
) -> None:
    """No ListAndWatch stream was ever opened, so no stream end can tell the plugin: the
    directory watch does (our socket removed, a new kubelet.sock)."""
    node = await start_node()
    await within(asyncio.gather(*(srv.registered.wait() for srv in node.servers.values())), 5)
    assert [srv.registrations for srv in node.servers.values()] == [1] * len(RESOURCES)
    await kubelet.stop(clear=True)
    await kubelet.start()
    requests = await kubelet.wait_registrations(2 * len(RESOURCES), timeout_s=10)
    assert {r.resource_name for r in requests[len(RESOURCES) :]} == set(RESOURCES)
    async with asyncio.timeout(5):  # the plugin counts once the kubelet's answer is back
        while [srv.registrations for srv in node.servers.values()] != [2] * len(RESOURCES):
            await asyncio.sleep(0.01)
    assert all(srv.socket_path.exists() for srv in node.servers.values())
    # The plugins' own socket churn (each recreated its socket) does not loop re-registration.
    await asyncio.sleep(0.5)
    assert len(kubelet.requests) == 2 * len(RESOURCES)


async def test_preferred_whole_gpus_follow_the_scheduler(start_node: Any, connect: Any) -> None:
    pod = {
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "77777777-0000",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {resources.ANN_GPU_INDICES: "0,2"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {resources.GPU: "2"}}}],
        },
        "status": {"phase": "Pending"},
    }
    node = await start_node(StaticPods("n1", [pod]))
    whole = connect(node.servers[WHOLE].socket_path)
    # left alone the plugin would take an NVLink pair; the scheduler decided otherwise
    chosen = await whole.preferred(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], [], 2)
    assert sorted(chosen) == ["GPU-0", "GPU-2"]
    rep = await whole.allocate(chosen)
    assert rep.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(chosen)
