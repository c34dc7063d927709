"""The `sim` GPU backend: many fake (KWOK) nodes served by one agent process.

KWOK nodes have no GPUs and no kubelet, but the scheduler, the predictor and the demo need
GPU metrics that behave like real ones. This backend keeps a picture of the simulated
cluster that the agent feeds from Kubernetes watches (nodes and pods, never polled):

- GPUs come from node labels (`alnair.io/gpu-model`, `-count`, `-memory-mib`,
  `-compute-capability`), falling back to the node's `nvidia.com/gpu` capacity and a table
  of known models for whatever a label does not say;
- a Running pod sits on the GPUs its `alnair.io/gpu-indices` annotation names (the
  scheduler writes it), or on GPUs the backend picks (least loaded first);
- its load comes from `workloads` (Gavel's measured throughput and co-location slowdown,
  assumed per-family utilization and memory), or from the pod annotations
  `alnair.io/sim-gpu-util-pct` and `alnair.io/sim-gpu-mem-mib` when a test wants exact
  numbers;
- GPU health is driven by the node annotation `alnair.io/sim-unhealthy-gpus` ("1,3"), so a
  test or a demo can fail a GPU and bring it back; changes are pushed as HealthSignal.

Samples are deterministic functions of (pod, second), with a few percent of jitter so
dashboards do not look flat, which keeps tests exact where they need to be.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from alnair.common import resources as res
from alnair.common.annotations import job_model
from alnair.profiler.gpu import (
    GpuInfo,
    GpuSample,
    HealthSignal,
    NodeInventory,
    NodeSample,
    PodRef,
    ProcessUsage,
    SimPodUsage,
)
from alnair.profiler.workloads import JobType, ThroughputTable, parse_job_type

ANN_SIM_UTIL = "alnair.io/sim-gpu-util-pct"
ANN_SIM_MEM = "alnair.io/sim-gpu-mem-mib"
ANN_SIM_UNHEALTHY = "alnair.io/sim-unhealthy-gpus"

# (memory MiB, compute capability, NVLink-connected) of models a label may name without
# saying more. Memory is what nvidia-smi reports for each card.
KNOWN_MODELS: dict[str, tuple[int, str, bool]] = {
    "K80": (11441, "3.7", False),
    "P100": (16280, "6.0", True),
    "T4": (15360, "7.5", False),
    "V100M16": (16160, "7.0", True),
    "V100M32": (32510, "7.0", True),
    "V100": (16160, "7.0", True),
    "A10": (22731, "8.6", False),
    "A100": (40536, "8.0", True),
    "A100-80GB": (81920, "8.0", True),
    "H100": (81559, "9.0", True),
}


def _known(model: str) -> tuple[int, str, bool] | None:
    upper = model.upper()
    if upper in KNOWN_MODELS:
        return KNOWN_MODELS[upper]
    # Longest name first so "V100M32" wins over "V100" inside "Tesla-V100M32".
    for name in sorted(KNOWN_MODELS, key=len, reverse=True):
        if name in upper:
            return KNOWN_MODELS[name]
    return None


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID per simulated GPU, in NVML's "GPU-<uuid>" form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.alnair.sim')}"


def _int(value: object, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def _quantity(value: object) -> float:
    """A Kubernetes quantity ("500m", "2", "4Gi") as a plain number (cores or bytes)."""
    text = str(value or "0").strip()
    suffixes = {
        "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
        "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    }  # fmt: skip
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            try:
                return float(text[: -len(suffix)]) * suffixes[suffix]
            except ValueError:
                return 0.0
    try:
        return float(text)
    except ValueError:
        return 0.0


def node_inventory(node: Mapping[str, Any]) -> NodeInventory | None:
    """The simulated GPUs of a node object; None when the node has no GPUs."""
    meta = node.get("metadata", {})
    name = str(meta.get("name", ""))
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    count = _int(labels.get(res.LABEL_GPU_COUNT), _int(capacity.get(res.GPU)))
    if count <= 0:
        return None
    model = labels.get(res.LABEL_GPU_MODEL, "V100M32")
    known = _known(model)
    memory = _int(labels.get(res.LABEL_GPU_MEMORY_MIB), known[0] if known else 16384)
    cc = labels.get(res.LABEL_GPU_COMPUTE_CAPABILITY, known[1] if known else "7.0")
    nvlink = known[2] if known else False
    unhealthy = parse_index_list(annotations.get(ANN_SIM_UNHEALTHY, ""))
    half = _numa_half(count)
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=gpu_uuid(name, i),
            model=model,
            memory_mib=memory,
            compute_capability=cc,
            numa_node=0 if i < half else 1,
            healthy=i not in unhealthy,
        )
        for i in range(count)
    )
    return NodeInventory(node=name, gpus=gpus, links=sim_links(count, nvlink))


def _numa_half(count: int) -> int:
    """GPUs below this index sit on NUMA node 0; small nodes keep all GPUs on one socket."""
    return count // 2 if count >= 4 else count


def sim_links(count: int, nvlink: bool) -> tuple[tuple[str, ...], ...]:
    """A DGX-like topology: NVLink between all GPUs of NVLink models; otherwise PCIe,
    PHB within a NUMA half and SYS across halves."""
    half = _numa_half(count)
    rows = []
    for i in range(count):
        row = []
        for j in range(count):
            if i == j:
                row.append("X")
            elif nvlink:
                row.append("NV2")
            else:
                row.append("PHB" if (i < half) == (j < half) else "SYS")
        rows.append(tuple(row))
    return tuple(rows)


def parse_index_list(text: str) -> set[int]:
    return {int(p) for p in text.replace(" ", "").split(",") if p.isdigit()}


@dataclass
class SimPod:
    """What the simulator knows of one Running GPU pod."""

    ref: PodRef
    node: str
    gpus_wanted: int
    milli: int
    requested_indices: tuple[int, ...]
    job: JobType | None
    util_override: float | None
    mem_override: float | None
    cpu_request_cores: float
    mem_request_mib: float
    started_ts: float
    indices: tuple[int, ...] = field(default=())


def sim_pod(pod: Mapping[str, Any], table: ThroughputTable | None, now: float) -> SimPod | None:
    """The simulator's view of a pod object; None unless it is Running on a node."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") != "Running":
        return None
    ann: Mapping[str, str] = meta.get("annotations") or {}
    gpus = 0
    gpu_mem_req = 0.0
    cpu = 0.0
    mem = 0.0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        gpus += _int(limits.get(res.GPU, requests.get(res.GPU)))
        gpu_mem_req += sum(
            _quantity(limits.get(name, requests.get(name))) * unit
            for name, unit in res.GPU_MEMORY_UNIT_MIB.items()
        )
        cpu += _quantity(requests.get("cpu", limits.get("cpu", "0")))
        mem += _quantity(requests.get("memory", limits.get("memory", "0"))) / 2**20
    indices = tuple(sorted(parse_index_list(ann.get(res.ANN_GPU_INDICES, ""))))
    milli = _int(ann.get(res.ANN_GPU_MILLI), 1000)
    if gpus == 0 and (indices or gpu_mem_req > 0):
        # A fractional pod asks for memory/compute, not whole GPUs; it still sits on one.
        gpus = max(1, len(indices))
    job: JobType | None = None
    model = job_model(ann)
    if model.model_name:
        bs = _int(model.batch_size, 0) or None
        job = table.resolve(model.model_name, bs) if table else parse_job_type(model.model_name)
    started = status.get("startTime")
    return SimPod(
        ref=PodRef(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
        ),
        node=str(node),
        gpus_wanted=gpus,
        milli=max(1, min(1000, milli)),
        requested_indices=indices,
        job=job,
        util_override=_float_or_none(ann.get(ANN_SIM_UTIL)),
        mem_override=_float_or_none(ann.get(ANN_SIM_MEM)),
        cpu_request_cores=cpu,
        mem_request_mib=mem,
        started_ts=_parse_time(started) if started else now,
    )


def _float_or_none(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _jitter(key: str, second: int, spread: float) -> float:
    """A deterministic factor in [1 - spread, 1 + spread] for (key, second)."""
    digest = hashlib.blake2b(f"{key}:{second}".encode(), digest_size=4).digest()
    unit = int.from_bytes(digest, "big") / 0xFFFFFFFF
    return 1.0 + spread * (2.0 * unit - 1.0)


class SimBackend:
    """The sim GPU backend; fed by node and pod watches, sampled by the agent."""

    name = "sim"

    def __init__(
        self,
        table: ThroughputTable | None = None,
        jitter: float = 0.03,
        node_selector: str | None = None,
    ) -> None:
        self._table = table
        self._jitter = jitter
        self._nodes: dict[str, NodeInventory] = {}
        self._pods: dict[str, SimPod] = {}
        # Pods by node, so a sample costs the node's pods, not the cluster's.
        self._on_node: dict[str, dict[str, SimPod]] = {}
        self._health: asyncio.Queue[HealthSignal | None] = asyncio.Queue()
        self._closed = False
        self.node_selector = node_selector

    # -- fed by watches -------------------------------------------------------------
    def upsert_node(self, node: Mapping[str, Any]) -> NodeInventory | None:
        """Learn (or update) a node; queue health signals for GPUs whose health flipped."""
        inv = node_inventory(node)
        name = str(node.get("metadata", {}).get("name", ""))
        if inv is None:
            self._nodes.pop(name, None)
            return None
        before = self._nodes.get(name)
        self._nodes[name] = inv
        if before is not None:
            old = {g.index: g for g in before.gpus}
            for gpu in inv.gpus:
                prev = old.get(gpu.index)
                if prev is not None and prev.healthy != gpu.healthy:
                    reason = "simulated fault" if not gpu.healthy else "simulated recovery"
                    self._health.put_nowait(
                        HealthSignal(
                            name,
                            gpu.index,
                            gpu.uuid,
                            gpu.healthy,
                            reason,
                            79 if not gpu.healthy else None,
                        )
                    )
        return inv

    def remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)

    def upsert_pod(self, pod: Mapping[str, Any], now: float) -> None:
        uid = str(pod.get("metadata", {}).get("uid", ""))
        sp = sim_pod(pod, self._table, now)
        if sp is None:
            self.remove_pod(uid)
            return
        prev = self._pods.get(uid)
        if prev is not None and prev.node == sp.node and not sp.requested_indices:
            sp.indices = prev.indices  # keep the GPUs we picked earlier
        self.remove_pod(uid)
        self._pods[uid] = sp
        self._on_node.setdefault(sp.node, {})[uid] = sp
        self._place(sp)

    def remove_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        if pod is not None:
            self._on_node.get(pod.node, {}).pop(uid, None)

    def _pods_on(self, node: str) -> list[SimPod]:
        return list(self._on_node.get(node, {}).values())

    def running_pods(self, node: str | None = None) -> list[PodRef]:
        pods = self._pods.values() if node is None else self._pods_on(node)
        return [p.ref for p in pods]

    def _place(self, pod: SimPod) -> None:
        inv = self._nodes.get(pod.node)
        count = len(inv.gpus) if inv else 0
        if pod.requested_indices:
            pod.indices = (
                tuple(i for i in pod.requested_indices if i < count) or pod.requested_indices
            )
            return
        if pod.indices or pod.gpus_wanted == 0 or count == 0:
            return
        load = dict.fromkeys(range(count), 0)
        for other in self._pods_on(pod.node):
            if other.ref.uid != pod.ref.uid:
                for i in other.indices:
                    if i in load:
                        load[i] += other.milli
        ranked = sorted(load, key=lambda i: (load[i], i))
        pod.indices = tuple(sorted(ranked[: pod.gpus_wanted]))

    # -- GpuBackend -----------------------------------------------------------------
    def nodes(self) -> Sequence[str]:
        return sorted(self._nodes)

    def inventory(self, node: str) -> NodeInventory:
        return self._nodes[node]

    def sample(self, node: str, now: float) -> NodeSample:
        inv = self._nodes[node]
        second = int(now)
        on_node = self._pods_on(node)
        by_gpu: dict[int, list[SimPod]] = {}
        for pod in on_node:
            for i in pod.indices:
                by_gpu.setdefault(i, []).append(pod)
        samples = []
        for gpu in inv.gpus:
            sharing = by_gpu.get(gpu.index, [])
            procs = []
            for pod in sharing:
                others = [o.job for o in sharing if o is not pod and o.job is not None]
                util, mem = self._load(pod, others, gpu, second)
                if not gpu.healthy:
                    util = 0.0  # a GPU that fell off the bus runs nothing
                procs.append(ProcessUsage(gpu.index, mem, util, pod_uid=pod.ref.uid))
            device_util = min(100.0, sum(p.sm_util_pct or 0.0 for p in procs))
            device_mem = min(float(gpu.memory_mib), sum(p.mem_used_mib for p in procs))
            samples.append(GpuSample(gpu.index, gpu.uuid, device_util, device_mem, tuple(procs)))
        usage = {p.ref.uid: self._pod_usage(p, second) for p in on_node}
        return NodeSample(node, now, tuple(samples), {p.ref.uid: p.ref for p in on_node}, usage)

    def pod_throughputs(self, node: str) -> dict[str, float]:
        """Steps/s of each modelled pod on the node, as Gavel measured it, slowed by sharing.

        A multi-GPU pod uses Gavel's number for that GPU count when measured (else the
        1-GPU number times the count, an upper bound) and runs at the pace of its most
        slowed GPU, as data-parallel training does. A pod on an unhealthy GPU makes no
        progress.
        """
        if self._table is None:
            return {}
        inv = self._nodes.get(node)
        if inv is None:
            return {}
        healthy = {g.index: g.healthy for g in inv.gpus}
        model = inv.gpus[0].model if inv.gpus else ""
        on_node = self._pods_on(node)
        out: dict[str, float] = {}
        for pod in on_node:
            if pod.job is None or not pod.indices:
                continue
            count = len(pod.indices)
            base = self._table.throughput(pod.job, model, count)
            if base is None:
                single = self._table.throughput(pod.job, model, 1)
                if single is None:
                    continue
                base = single * count
            factor = 1.0
            for index in pod.indices:
                if not healthy.get(index, True):
                    factor = 0.0
                    break
                others = [
                    o.job
                    for o in on_node
                    if o is not pod and o.job is not None and index in o.indices
                ]
                if others:
                    factor = min(factor, self._table.slowdown(pod.job, others, model))
            out[pod.ref.uid] = base * factor * min(1.0, pod.milli / 1000.0)
        return out

    def _load(
        self, pod: SimPod, others: list[JobType], gpu: GpuInfo, second: int
    ) -> tuple[float, float]:
        if pod.util_override is not None:
            alone_util = pod.util_override
        elif pod.job is not None:
            alone_util = pod.job.alone_util_pct()
        else:
            alone_util = 80.0
        if pod.mem_override is not None:
            mem = pod.mem_override
        elif pod.job is not None:
            mem = pod.job.mem_mib()
        else:
            mem = 2000.0
        # A fraction of a GPU (vGPU) caps the pod's compute at its share.
        alone_util = min(alone_util, pod.milli / 10.0)
        if others:
            if pod.job is not None and self._table is not None:
                factor = self._table.slowdown(pod.job, others, gpu.model)
            else:
                factor = 1.0 / (1 + len(others))
            alone_util *= factor
        util = max(0.0, min(100.0, alone_util * _jitter(pod.ref.uid, second, self._jitter)))
        if pod.util_override is not None and pod.mem_override is not None:
            util = min(100.0, alone_util)  # exact numbers were asked for
        return util, min(mem, float(gpu.memory_mib))

    def _pod_usage(self, pod: SimPod, second: int) -> SimPodUsage:
        cpu = (
            max(0.1, pod.cpu_request_cores)
            * 0.7
            * _jitter(pod.ref.uid + "cpu", second, self._jitter)
        )
        mem = max(256.0, pod.mem_request_mib * 0.6)
        return SimPodUsage(
            cpu_util_cores=cpu,
            mem_used_mib=mem,
            io_read_bps=5e6 * (1 if pod.job else 0.1),
            io_write_bps=2e5,
        )

    async def health_signals(self) -> AsyncIterator[HealthSignal]:
        while True:
            signal = await self._health.get()
            if signal is None:
                return
            yield signal

    def close(self) -> None:
        self._health.put_nowait(None)
