"""The node agent's real-GPU path against a real NATS server.

The GPUs are a stand-in for pynvml (this machine has none); everything after it is real:
pids are mapped to pods through a /proc tree and pod CPU/memory/IO read from a cgroup v2
tree, both in the kubelet's real layout; metrics, inventory and health go over NATS.
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from alnair.common.bus import Bus
from alnair.common.events import GpuHealthChanged, GpuInventory, PodMetric, decode
from alnair.common.tasks import within
from alnair.profiler.agent.node_agent import Agent
from alnair.profiler.gpu import HealthSignal
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.nvml import NvmlBackend

pytestmark = pytest.mark.integration

GIB = 1024**3
PODS = {
    "train-a": ("1f0a4b2c-1111-4a4a-8b8b-0c0c0c0c0c01", "Burstable", 100),
    "train-b": ("1f0a4b2c-2222-4a4a-8b8b-0c0c0c0c0c02", "Guaranteed", 200),
    "notebook": ("1f0a4b2c-3333-4a4a-8b8b-0c0c0c0c0c03", "BestEffort", None),
}


class NVMLError(Exception):
    pass


def stand_in_nvml() -> types.ModuleType:
    m: Any = types.ModuleType("stand_in_pynvml")
    m.NVMLError = NVMLError
    m.NVMLError_Timeout = type("NVMLError_Timeout", (NVMLError,), {})
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 0
    m.nvmlEventTypeXidCriticalError = 8
    m.nvmlEventTypeDoubleBitEccError = 2
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: "GPU-8c7e2f1a-0000-4000-8000-000000000000"
    m.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-40GB"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=40 * GIB, used=12 * GIB)
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:07:00.0")
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=80, memory=30)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=100, usedGpuMemory=8 * GIB),
        types.SimpleNamespace(pid=200, usedGpuMemory=3 * GIB),
        types.SimpleNamespace(pid=300, usedGpuMemory=1 * GIB),  # a host process
    ]
    m.nvmlDeviceGetProcessUtilization = lambda h, last: [
        types.SimpleNamespace(pid=100, timeStamp=1, smUtil=75),
        types.SimpleNamespace(pid=200, timeStamp=1, smUtil=25),
    ]
    m.nvmlShutdown = lambda: None
    return m


def kubelet_trees(root: Path) -> tuple[Path, Path]:
    """A /proc and a cgroup v2 mount laid out as a containerd + systemd-driver node has them."""
    proc, cgroup = root / "proc", root / "cgroup"
    for uid, qos, pid in PODS.values():
        under = uid.replace("-", "_")
        if qos == "Guaranteed":
            rel = f"kubepods.slice/kubepods-pod{under}.slice"
        else:
            q = qos.lower()
            rel = f"kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{under}.slice"
        pod_dir = cgroup / rel
        pod_dir.mkdir(parents=True)
        (pod_dir / "cpu.stat").write_text("usage_usec 0\n")
        (pod_dir / "memory.current").write_text(str(2 * GIB))
        (pod_dir / "io.stat").write_text("8:0 rbytes=0 wbytes=0\n")
        if pid is not None:
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(f"0::/{rel}/cri-containerd-{'ab' * 32}.scope\n")
    (proc / "300").mkdir(parents=True)
    (proc / "300" / "cgroup").write_text("0::/system.slice/ollama.service\n")
    return proc, cgroup


def advance_counters(cgroup: Path, cpu_usec: int, read_bytes: int) -> None:
    for stat in cgroup.rglob("cpu.stat"):
        stat.write_text(f"usage_usec {cpu_usec}\n")
        (stat.parent / "io.stat").write_text(f"8:0 rbytes={read_bytes} wbytes=0\n")


async def test_shared_gpu_split_per_pod_and_cpu_only_pods_reported(
    nats_url: str, tmp_path: Path
) -> None:
    proc, cgroup = kubelet_trees(tmp_path)
    bus = await Bus.connect(nats_url, name="agent-under-test")
    listener = await Bus.connect(nats_url, name="listener")
    received: list[PodMetric] = []
    health: asyncio.Queue[GpuHealthChanged] = asyncio.Queue()

    all_pods_heard = asyncio.Event()

    async def on_metric(msg: Msg) -> None:
        received.append(decode(msg.data, PodMetric).data)
        if {m.pod for m in received} == set(PODS):
            all_pods_heard.set()

    async def on_health(msg: Msg) -> None:
        await health.put(decode(msg.data, GpuHealthChanged).data)

    await listener.nc.subscribe("alnair.metrics.pod.gpu-node", cb=on_metric)
    await listener.nc.subscribe("alnair.health.gpu-node.>", cb=on_health)
    backend = NvmlBackend("gpu-node", nvml=stand_in_nvml())
    clock = iter([1000.0, 1002.0])
    agent = Agent(
        backend,
        bus,
        None,
        ProfilerMetrics(),
        label_nodes=False,
        proc_root=proc,
        cgroup_root=cgroup,
        clock=lambda: next(clock),
    )
    try:
        for name, (uid, qos, _pid) in PODS.items():
            agent.directory.upsert(
                {
                    "metadata": {"name": name, "namespace": "ml", "uid": uid},
                    "status": {"phase": "Running", "qosClass": qos},
                }
            )
        await agent.sync_node("gpu-node")
        entry = await (await listener.kv(GpuInventory.BUCKET)).get("gpu-node")
        assert entry.value is not None
        inv = GpuInventory.model_validate_json(entry.value)
        assert [(g.model, g.memory_mib, g.compute_capability) for g in inv.gpus] == [
            ("A100", 40960, "8.0")  # the model key, not NVML's product name
        ]

        await agent.sample_once()  # first reading: GPU numbers, no cgroup rates yet
        advance_counters(cgroup, cpu_usec=3_000_000, read_bytes=4_000_000)
        second = await agent.sample_once()
        await within(all_pods_heard.wait(), 10)
        by_pod = {m.pod: m for m in second}
        # 80% device utilization split 75:25, not 80% each (the dcgm-exporter gap).
        assert by_pod["train-a"].gpu_util_pct == pytest.approx(60.0)
        assert by_pod["train-b"].gpu_util_pct == pytest.approx(20.0)
        assert by_pod["train-a"].gpu_mem_used_mib == 8192
        assert by_pod["train-b"].gpu_mem_used_mib == 3072
        # The host process is nobody's pod; the CPU-only pod still gets CPU, memory and IO.
        assert set(by_pod) == {"train-a", "train-b", "notebook"}
        assert by_pod["notebook"].gpu_uuid is None
        for m in second:
            assert m.cpu_util_cores == pytest.approx(1.5)
            assert m.mem_used_mib == pytest.approx(2048)
            assert m.io_read_bps == pytest.approx(2_000_000)
        assert {m.pod for m in received} == {"train-a", "train-b", "notebook"}

        await agent.on_health(HealthSignal("gpu-node", 0, inv.gpus[0].uuid, False, "XID 79", 79))
        event = await within(health.get(), 10)
        assert (event.healthy, event.xid, event.gpu_uuid) == (False, 79, inv.gpus[0].uuid)
    finally:
        backend.close()
        await bus.close()
        await listener.close()
