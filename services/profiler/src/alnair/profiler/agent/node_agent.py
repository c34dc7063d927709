"""The node agent: samples GPUs at 1 Hz and tells the rest of the system what it saw.

Per node it serves (one for `nvml`, many for `sim`) the agent
- publishes a PodMetric per (pod, GPU) every sample period on `alnair.metrics.pod.<node>`
  (core NATS: a lost sample is harmless and the next one follows within a second), with the
  device's utilization split between the pods sharing it (see `aggregation`);
- keeps the node's GpuInventory in the `gpu-inventory` KV bucket, rewritten only when it
  changes (new GPUs, health flips), so readers watch the key instead of polling;
- publishes GpuHealthChanged when the backend reports a fault or a recovery;
- labels the node with GPU model, memory, count and compute capability, as GPU feature
  discovery does, patching only when a label differs.

- folds every sample into the pod's running summary and publishes it as a durable
  PodSummary when the pod ends (see `summaries`): while the bus is unreachable samples are
  not sent (they would be stale when they arrived) and summaries wait, spooled on disk, until
  the connection returns.

The sample period is the one timer in the profiler, and legitimately so: utilization is a
continuous quantity that nothing announces. Everything else (which pods run where, node
changes, health, the bus coming back) arrives as watch events or backend events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from nats.js.kv import KeyValue

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.errors import TemporaryError
from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory, GpuLink, PodMetric
from alnair.common.kube import NODES, PODS, ApiError, KubeClient, NotFound
from alnair.common.records import ANN_THROUGHPUT
from alnair.common.retry import Backoff
from alnair.profiler.agent.attribution import pod_shares
from alnair.profiler.agent.cgroups import CgroupRates, PodCgroupMeter, pod_of_pid
from alnair.profiler.agent.progress import ProgressReader, ProgressSpec
from alnair.profiler.agent.summaries import Spool, SummaryBook
from alnair.profiler.gpu import GpuBackend, HealthSignal, NodeInventory, NodeSample, PodRef
from alnair.profiler.metrics import ProfilerMetrics

log = logging.getLogger(__name__)

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]")


def label_value(text: str) -> str:
    """A valid label value: allowed characters only, at most 63, alphanumeric at both ends."""
    return _LABEL_VALUE.sub("-", text)[:63].strip("-._")


def node_labels(inv: NodeInventory) -> dict[str, str]:
    """The GPU feature labels for a node (empty when it has no GPU)."""
    if not inv.gpus:
        return {}
    first = inv.gpus[0]
    return {
        res.LABEL_GPU_MODEL: label_value(first.model),
        res.LABEL_GPU_MEMORY_MIB: str(first.memory_mib),
        res.LABEL_GPU_COUNT: str(len(inv.gpus)),
        res.LABEL_GPU_COMPUTE_CAPABILITY: label_value(first.compute_capability),
    }


def _link(word: str) -> GpuLink:
    if word.startswith("NV"):
        return GpuLink.NVLINK
    try:
        return GpuLink(word)
    except ValueError:
        return GpuLink.SYS


def inventory_event(inv: NodeInventory) -> GpuInventory:
    return GpuInventory(
        node=inv.node,
        gpus=[
            GpuDevice(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                compute_capability=g.compute_capability,
                numa_node=g.numa_node,
                healthy=g.healthy,
                pcie_root=g.pcie_root,
            )
            for g in inv.gpus
        ],
        topology=[[_link(w) for w in row] for row in inv.links],
    )


@dataclass
class PodDirectory:
    """Pods known to run on the agent's node(s), by uid (fed by a pod watch)."""

    pods: dict[str, PodRef] = field(default_factory=dict)
    qos: dict[str, str] = field(default_factory=dict)
    progress: dict[str, ProgressSpec] = field(default_factory=dict)
    """Where each pod's training progress can be read (`agent.progress`)."""

    def upsert(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata", {})
        uid = str(meta.get("uid", ""))
        status = pod.get("status") or {}
        if status.get("phase") in {"Succeeded", "Failed"}:
            self.remove(pod)
            return
        self.pods[uid] = PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), uid)
        self.qos[uid] = str(status.get("qosClass", "BestEffort"))
        self.progress[uid] = ProgressSpec.of(pod)

    def track_progress(self, pod: Mapping[str, Any], *, deleted: bool) -> None:
        """Only where the pod's progress can be read (the sim backend knows its pods)."""
        uid = str(pod.get("metadata", {}).get("uid", ""))
        if deleted:
            self.progress.pop(uid, None)
        else:
            self.progress[uid] = ProgressSpec.of(pod)

    def remove(self, pod: Mapping[str, Any]) -> None:
        uid = str(pod.get("metadata", {}).get("uid", ""))
        self.pods.pop(uid, None)
        self.qos.pop(uid, None)
        self.progress.pop(uid, None)


def pod_metrics(
    sample: NodeSample,
    pods: Mapping[str, PodRef],
    pod_of: Mapping[int, str],
    usage: Mapping[str, CgroupRates] | None = None,
) -> list[PodMetric]:
    """The PodMetric events for one node sample.

    One event per (pod, GPU) the pod has processes on; CPU/memory/IO are the pod's and repeat
    on each of its GPU events (the aggregator counts them once per pod and tick). Pods the
    sample knows (sim) that use no GPU get one event without a GPU. Pods whose uid we cannot
    name (a pod created an instant ago, before the watch told us) are skipped this round.
    """
    directory = {**pods, **sample.pods}
    ts = _dt(sample.ts)
    out: list[PodMetric] = []
    seen: set[str] = set()

    def pod_usage(uid: str) -> dict[str, float]:
        sim = sample.pod_usage.get(uid)
        if sim is not None:
            return {
                "cpu_util_cores": sim.cpu_util_cores,
                "mem_used_mib": sim.mem_used_mib,
                "io_read_bps": sim.io_read_bps,
                "io_write_bps": sim.io_write_bps,
            }
        real = (usage or {}).get(uid)
        if real is not None:
            return {
                "cpu_util_cores": real.cpu_util_cores,
                "mem_used_mib": real.mem_used_mib,
                "io_read_bps": real.io_read_bps,
                "io_write_bps": real.io_write_bps,
            }
        return {}

    for gpu in sample.gpus:
        for share in pod_shares(gpu, pod_of):
            ref = directory.get(share.pod_uid)
            if ref is None:
                continue
            seen.add(share.pod_uid)
            out.append(
                PodMetric(
                    node=sample.node,
                    namespace=ref.namespace,
                    pod=ref.name,
                    pod_uid=ref.uid,
                    gpu_uuid=share.gpu_uuid,
                    gpu_index=share.gpu_index,
                    gpu_util_pct=min(100.0, share.gpu_util_pct),
                    gpu_mem_used_mib=share.mem_used_mib,
                    sm_util_pct=min(100.0, share.sm_util_pct),
                    ts=ts,
                    **pod_usage(share.pod_uid),
                )
            )
    # Pods without a GPU process: CPU, memory and IO only (sim pods, or real pods whose
    # cgroup we located from their QoS class).
    idle = dict(sample.pods)
    idle.update({uid: pods[uid] for uid in (usage or {}) if uid in pods and uid not in sample.pods})
    for uid, ref in idle.items():
        if uid not in seen:
            out.append(
                PodMetric(
                    node=sample.node,
                    namespace=ref.namespace,
                    pod=ref.name,
                    pod_uid=uid,
                    ts=ts,
                    **pod_usage(uid),
                )
            )
    return out


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@runtime_checkable
class ReportsThroughput(Protocol):
    """A backend that knows its pods' training throughput (the sim does; NVML does not)."""

    def pod_throughputs(self, node: str) -> dict[str, float]: ...


class Agent:
    """Samples a backend and publishes what it sees; one per process."""

    def __init__(
        self,
        backend: GpuBackend,
        bus: Bus,
        kube: KubeClient | None,
        metrics: ProfilerMetrics,
        *,
        source: str = "alnair/profiler-agent",
        label_nodes: bool = True,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        kubelet_cgroup_root: str = "",
        clock: Callable[[], float] = time.time,
        spool: Spool | None = None,
        max_pending_summaries: int = 10000,
        progress: ProgressReader | None = None,
    ) -> None:
        self.backend = backend
        self.bus = bus
        self.kube = kube
        self.metrics = metrics
        self.source = source
        self.label_nodes = label_nodes
        self.proc_root = proc_root
        self.clock = clock
        self.directory = PodDirectory()
        self.progress = progress or ProgressReader()
        self.meter = PodCgroupMeter(cgroup_root, kubelet_cgroup_root)
        self._kv: KeyValue | None = None
        self._published: dict[str, GpuInventory] = {}
        self._node_labels: dict[str, dict[str, str]] = {}
        self.last_sample: dict[str, list[PodMetric]] = {}
        self._reported_throughput: dict[str, dict[str, float]] = {}  # node -> pod uid -> steps/s
        self.summaries = SummaryBook(max_pending_summaries)
        self.spool = spool or Spool(None)
        self._summaries_wake = asyncio.Event()
        self._gpu_models: dict[str, str] = {}
        bus.on_reconnect(self._bus_back)

    # -- inventory and labels ---------------------------------------------------------
    async def sync_node(self, node: str, current_labels: Mapping[str, str] | None = None) -> None:
        """Publish the node's inventory and fix its labels, if either changed."""
        inv = self.backend.inventory(node)
        if inv.gpus:
            self._gpu_models[node] = inv.gpus[0].model
        event = inventory_event(inv)
        before = self._published.get(node)
        if before is None or before.model_dump(exclude={"ts"}) != event.model_dump(exclude={"ts"}):
            if self._kv is None:
                self._kv = await self.bus.kv(GpuInventory.BUCKET)
            await self._kv.put(event.kv_key(), event.model_dump_json().encode())
            self._published[node] = event
            for gpu in inv.gpus:
                self.metrics.gpu_healthy.labels(node, gpu.uuid).set(1 if gpu.healthy else 0)
            log.info("inventory published", extra={"node": node, "gpus": len(inv.gpus)})
        if self.label_nodes and self.kube is not None:
            await self._label(node, node_labels(inv), current_labels)

    async def _label(
        self, node: str, wanted: dict[str, str], current: Mapping[str, str] | None
    ) -> None:
        assert self.kube is not None
        if current is None:
            current = self._node_labels.get(node)
        if current is None:
            try:
                obj = await self.kube.get(NODES, node)
            except NotFound:
                return
            current = obj.get("metadata", {}).get("labels") or {}
        missing = {k: v for k, v in wanted.items() if current.get(k) != v}
        self._node_labels[node] = {**current, **wanted}
        if missing:
            await self.kube.patch(NODES, node, {"metadata": {"labels": missing}})
            log.info("node labelled", extra={"node": node, "labels": missing})

    def forget_node(self, node: str) -> None:
        self._published.pop(node, None)
        self._node_labels.pop(node, None)
        self._gpu_models.pop(node, None)

    # -- sampling ---------------------------------------------------------------------
    def _pid_map(self, sample: NodeSample) -> tuple[dict[int, str], dict[str, str]]:
        """pid -> pod uid for the processes in the sample, and pod uid -> pod cgroup path."""
        pids: dict[int, str] = {}
        cgroup_paths: dict[str, str] = {}
        for gpu in sample.gpus:
            for proc in gpu.processes:
                if proc.pid is None or proc.pod_uid is not None or proc.pid in pids:
                    continue
                found = pod_of_pid(proc.pid, self.proc_root)
                if found is not None:
                    pids[proc.pid] = found.pod_uid
                    if found.cgroup_version == 2:
                        cgroup_paths[found.pod_uid] = found.pod_cgroup_path
        return pids, cgroup_paths

    async def _with_progress(self, metrics: list[PodMetric]) -> list[PodMetric]:
        """The samples with each pod's training progress, read once per pod."""
        specs = {
            m.pod_uid: spec
            for m in metrics
            if (spec := self.directory.progress.get(m.pod_uid)) is not None
        }
        if not specs:
            return metrics
        found = await self.progress.read_all(specs)
        return [m.with_progress(found.get(m.pod_uid)) for m in metrics]

    async def sample_once(self) -> list[PodMetric]:
        """Sample every node, publish the pod metrics, update gauges; returns what was sent."""
        now = self.clock()
        sent: list[PodMetric] = []
        live: set[tuple[str, str]] = set()
        measured: set[str] = set()
        alive: set[str] = set(self.directory.pods)
        # Samples while the bus is away would arrive stale (or not at all): the summaries keep
        # what they say, and go out durably once the connection returns.
        connected = self.bus.connected
        for node in list(self.backend.nodes()):
            try:
                sample = self.backend.sample(node, now)
            except KeyError:
                continue  # the node went away between nodes() and sample()
            pid_map, cgroup_paths = self._pid_map(sample)
            if not sample.pods:
                # A real node: find the cgroups of pods that run no GPU process too.
                for uid in self.directory.pods:
                    if uid not in cgroup_paths:
                        found = self.meter.locate(uid, self.directory.qos.get(uid, "BestEffort"))
                        if found is not None:
                            cgroup_paths[uid] = found
            usage: dict[str, CgroupRates] = {}
            measured.update(cgroup_paths)
            for uid, path in cgroup_paths.items():
                rates = self.meter.measure(uid, path, now)
                if rates is not None:
                    usage[uid] = rates
            metrics = pod_metrics(sample, self.directory.pods, pid_map, usage)
            metrics = await self._with_progress(metrics)
            alive.update(sample.pods)
            self.summaries.observe(metrics, self._gpu_models)
            for gpu in sample.gpus:
                self.metrics.gpu_util.labels(node, gpu.uuid).set(gpu.util_pct)
                self.metrics.gpu_mem.labels(node, gpu.uuid).set(gpu.mem_used_mib)
            for metric in metrics:
                if connected:
                    await self.bus.publish(metric, source=self.source)
                self.metrics.observe_pod(metric)
                live.add((metric.namespace, metric.pod))
            self.metrics.samples.labels(node).inc(len(metrics))
            self.last_sample[node] = metrics
            if isinstance(self.backend, ReportsThroughput):
                await self._report_throughput(node, sample)
            sent += metrics
        for key in self.metrics.pods() - live:
            self.metrics.forget_pod(*key)
        # Keep readings of every pod measured this round (a first reading yields no rate yet).
        self.meter.forget_except(measured)
        ended = self.summaries.end_all_but(alive)
        if ended or not connected:
            self.spool.save(self.summaries, with_running=not connected)
        if ended:
            self._summaries_wake.set()
        return sent

    # -- pod summaries ----------------------------------------------------------------
    async def _bus_back(self) -> None:
        self._summaries_wake.set()

    async def publish_summaries(self, publish_timeout_s: float = 5.0) -> bool:
        """Publish every pending summary, oldest first; False if the bus refused one (the
        rest wait). The spool is rewritten once per pass, not per summary: a kill in between
        repeats a few, which the event id makes harmless."""
        book = self.summaries
        ok = True
        try:
            while book.pending:
                uid, summary = next(iter(book.pending.items()))
                try:
                    await self.bus.publish(
                        summary,
                        source=self.source,
                        event_id=summary.event_id(),
                        publish_timeout_s=publish_timeout_s,
                    )
                except TemporaryError as exc:
                    log.info(
                        "pod summaries wait for the bus",
                        extra={"pending": len(book.pending), "error": str(exc)},
                    )
                    ok = False
                    break
                book.published(uid)
                self.metrics.summaries.inc()
        finally:
            self.spool.save(book, with_running=not self.bus.connected)
        return ok

    async def run_summaries(self, retry_max_s: float = 30.0) -> None:
        """Publish pod summaries when pods end and when the bus comes back.

        Woken by the sampler (a pod ended) and by the bus (reconnected). A publish that fails
        while the connection is up (JetStream still recovering after a server restart) is
        retried with backoff, since no further event may come to wake us."""
        backoff = Backoff(1.0, retry_max_s)
        while True:
            await self._summaries_wake.wait()
            self._summaries_wake.clear()
            if await self.publish_summaries():
                backoff.reset()
                continue
            if self.bus.connected:
                await asyncio.sleep(backoff.next())
                self._summaries_wake.set()

    async def _report_throughput(self, node: str, sample: NodeSample) -> None:
        """Write a simulated pod's throughput on it when it changes (start, a neighbour comes
        or goes), as a real workload's training callback would: a patch per change, not per
        second."""
        if self.kube is None:
            return
        assert isinstance(self.backend, ReportsThroughput)
        reported = self._reported_throughput.setdefault(node, {})
        for uid, value in self.backend.pod_throughputs(node).items():
            before = reported.get(uid)
            if before is not None and abs(before - value) <= 0.01 * max(before, 1e-9):
                continue
            ref = sample.pods.get(uid) or self.directory.pods.get(uid)
            if ref is None:
                continue
            patch = {"metadata": {"annotations": {ANN_THROUGHPUT: f"{value:.6g}"}}}
            try:
                await self.kube.patch(PODS, ref.name, patch, ref.namespace)
            except NotFound:
                continue
            except (ApiError, TemporaryError) as exc:
                # Throughput is a nicety for records; metrics must keep flowing without it.
                log.warning("throughput not written", extra={"pod": ref.name, "error": str(exc)})
                continue
            reported[uid] = value
        for uid in [u for u in reported if u not in sample.pods]:
            del reported[uid]

    async def run_sampler(self, interval_s: float = 1.0) -> None:
        """Sample on a fixed cadence (not drifting with the time a sample takes)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.sample_once()
            except Exception:
                # A bad sample (NATS reconnecting, a GPU query failing) must not stop the agent.
                log.exception("sample failed")
            next_at += interval_s
            delay = next_at - loop.time()
            if delay < 0:
                next_at = loop.time()  # we fell behind: skip, do not burst
                delay = 0
            await asyncio.sleep(delay)

    # -- health -----------------------------------------------------------------------
    async def on_health(self, signal: HealthSignal) -> None:
        event = GpuHealthChanged(
            node=signal.node,
            gpu_index=signal.gpu_index,
            gpu_uuid=signal.gpu_uuid,
            healthy=signal.healthy,
            reason=signal.reason,
            xid=signal.xid,
        )
        await self.bus.publish(event, source=self.source)
        self.metrics.health_changes.labels(str(signal.healthy).lower()).inc()
        self.metrics.gpu_healthy.labels(signal.node, signal.gpu_uuid).set(
            1 if signal.healthy else 0
        )
        log.warning(
            "GPU health changed",
            extra={
                "node": signal.node,
                "gpu": signal.gpu_index,
                "healthy": signal.healthy,
                "reason": signal.reason,
            },
        )
        with contextlib.suppress(KeyError):  # the node left while its GPU was failing
            await self.sync_node(signal.node)

    async def run_health(self) -> None:
        async for signal in self.backend.health_signals():
            await self.on_health(signal)
