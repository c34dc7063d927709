"""Wiring and lifespan of the profiler's processes: the node agent and the aggregator.

`start_agent` / `start_aggregator` connect what the process needs (NATS, the API server,
Redis), start its long-lived tasks through `alnair.common.tasks.spawn` (named, their death
logged and fatal) and its HTTP server, and return a handle whose `stop()` undoes all of it in
reverse. Tests use these directly; `serve` runs one until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.busauth import for_node
from alnair.common.errors import ConfigError
from alnair.common.events import GpuInventory
from alnair.common.http import bound_port, named_task, start_http, stop_http
from alnair.common.httpauth import guard_reads
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import JOBS, NODES, PODS, TRIALJOBS, KubeClient, Obj, Resource
from alnair.common.logs import setup_logging
from alnair.common.redisconn import redis_client
from alnair.common.tasks import cancel_all, spawn, until_stopped
from alnair.profiler.agent.node_agent import Agent
from alnair.profiler.agent.progress import ProgressReader
from alnair.profiler.agent.summaries import Spool
from alnair.profiler.aggregator.aggregator import Aggregator
from alnair.profiler.api import PROFILE_LISTS, PROFILE_READS, create_app
from alnair.profiler.busauth import start_bus_auth
from alnair.profiler.gpu import GpuBackend
from alnair.profiler.handlers import subscribe_pod_metrics, subscribe_pod_summaries
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.settings import ProfilerSettings, parse_resource
from alnair.profiler.sim import SimBackend
from alnair.profiler.trialjob import LABEL_TRIALJOB, TrialController
from alnair.profiler.workloads import ThroughputTable

log = logging.getLogger(__name__)

OnEvent = Callable[[str, Obj], Awaitable[None]]


def _watch(
    kube: KubeClient,
    resource: Resource,
    on_event: OnEvent,
    *,
    task: str,
    tasks: list[asyncio.Task[Any]],
    informers: list[Informer],
    died: asyncio.Event,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> Informer:
    """Follow `resource` with the common informer (list, watch, relist with reconciliation,
    back-off, health), handing `on_event` each change as ("ADDED" | "MODIFIED" | "DELETED",
    object). Objects gone while the watch was away arrive as DELETED. Its health is part of
    the process's readiness."""
    informer = Informer(
        kube,
        resource,
        label_selector=label_selector,
        field_selector=field_selector,
        name=task.rpartition(".")[2],
    )

    async def handler(event: WatchEvent, obj: Obj, _old: Obj | None) -> None:
        await on_event(event.value, obj)

    informer.add_handler(handler)
    tasks.append(spawn(informer.run(), name=task, on_death=_fatal(died)))
    informers.append(informer)
    return informer


@dataclass
class Running:
    """A started profiler process (agent or aggregator)."""

    role: str
    metrics: ProfilerMetrics
    bus: Bus
    kube: KubeClient
    server: uvicorn.Server
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    agent: Agent | None = None
    aggregator: Aggregator | None = None
    redis: aioredis.Redis | None = None
    backend: GpuBackend | None = None
    died: asyncio.Event = field(default_factory=asyncio.Event)
    informers: list[Informer] = field(default_factory=list)

    @property
    def http_port(self) -> int:
        return bound_port(self.server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def stop(self) -> None:
        await stop_http(self.server, named_task(self.tasks, "profiler.http"))
        await cancel_all(self.tasks)
        if self.aggregator is not None:
            await self.aggregator.close()
        if self.agent is not None:
            await self.agent.progress.close()
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()
        await self.bus.close()
        await self.kube.close()
        if self.redis is not None:
            await self.redis.aclose()


async def _start_http(
    app: FastAPI, host: str, port: int, tasks: list[asyncio.Task[Any]], cert_dir: str | None
) -> uvicorn.Server:
    server, task = await start_http(app, host, port, name="profiler.http", cert_dir=cert_dir)
    tasks.append(task)
    return server


def _fatal(running_died: asyncio.Event) -> Any:
    def on_death(_exc: BaseException) -> None:
        running_died.set()

    return on_death


async def start_agent(
    settings: ProfilerSettings, registry: CollectorRegistry | None = None
) -> Running:
    metrics = ProfilerMetrics(registry)
    tasks: list[asyncio.Task[Any]] = []
    informers: list[Informer] = []
    died = asyncio.Event()
    # The backend first: a node without a driver should fail at once, with NVML's reason.
    backend: GpuBackend
    if settings.backend == "sim":
        if settings.gavel_path is not None and not settings.gavel_path.is_file():
            raise ConfigError(
                f"ALNAIR_PROFILER_GAVEL_PATH={settings.gavel_path} is not a file",
                path=str(settings.gavel_path),
            )
        sim = SimBackend(ThroughputTable.load(settings.gavel_path))
        backend = sim
    else:
        if not settings.node_name:
            raise ConfigError(
                "the nvml agent needs its node name (ALNAIR_PROFILER_NODE_NAME or NODE_NAME)"
            )
        from alnair.profiler.nvml import NvmlBackend

        backend = NvmlBackend(settings.node_name, recover_after_s=settings.nvml_recover_after_s)
    bus = await Bus.connect(
        settings.nats_url,
        name=f"profiler-agent-{settings.node_name or 'sim'}",
        credentials=for_node(settings.nats_credentials(), settings.node_name or "sim"),
        replicas=settings.nats_replicas,
        # With its node's identity (a token) it may find the streams, not make them.
        ensure_streams=settings.nats_token_file is None,
    )
    bus.export_metrics(metrics.registry)
    kube = KubeClient.from_config(settings.kubeconfig)
    agent = Agent(
        backend,
        bus,
        kube,
        metrics,
        source=f"{settings.source}-agent",
        label_nodes=settings.label_nodes,
        proc_root=settings.proc_root,
        cgroup_root=settings.cgroup_root,
        kubelet_cgroup_root=settings.kubelet_cgroup_root,
        spool=Spool(settings.state_dir),
        max_pending_summaries=settings.max_pending_summaries,
        progress=ProgressReader(
            settings.progress_log_root, frozenset(settings.progress_log_namespaces)
        ),
    )
    # Summaries a killed agent held: pods still running continue them, the others end at the
    # first sample; pending ones go out as soon as the summary task runs.
    agent.spool.load(agent.summaries)
    if isinstance(backend, SimBackend):
        await _feed_sim(backend, agent, kube, settings, tasks, informers, died)
    else:
        node = settings.node_name or ""
        await agent.sync_node(node)

        async def on_pod(kind: str, obj: dict[str, Any]) -> None:
            agent.summaries.pod_changed(obj, deleted=kind == "DELETED")
            if kind == "DELETED":
                agent.directory.remove(obj)
            else:
                agent.directory.upsert(obj)

        pods = _watch(
            kube,
            PODS,
            on_pod,
            task="profiler.agent.watch-pods",
            tasks=tasks,
            informers=informers,
            died=died,
            field_selector=f"spec.nodeName={node}",
        )
        await pods.synced.wait()
    tasks.append(
        spawn(
            agent.run_sampler(settings.sample_interval_s),
            name="profiler.agent.sampler",
            on_death=_fatal(died),
        )
    )
    tasks.append(spawn(agent.run_health(), name="profiler.agent.health", on_death=_fatal(died)))
    tasks.append(
        spawn(agent.run_summaries(), name="profiler.agent.summaries", on_death=_fatal(died))
    )
    if agent.summaries.pending:
        agent._summaries_wake.set()
    inventory = await bus.kv(GpuInventory.BUCKET)
    server = await _start_http(
        create_app(metrics, inventory, bus=bus, informers=informers),
        settings.http_host,
        settings.http_port,
        tasks,
        settings.http_cert_dir,
    )
    return Running(
        "agent",
        metrics,
        bus,
        kube,
        server,
        tasks,
        agent=agent,
        backend=backend,
        died=died,
        informers=informers,
    )


async def _feed_sim(
    sim: SimBackend,
    agent: Agent,
    kube: KubeClient,
    settings: ProfilerSettings,
    tasks: list[asyncio.Task[Any]],
    informers: list[Informer],
    died: asyncio.Event,
) -> None:
    """Drive the sim backend from node and pod watches (nodes first, so pods find GPUs)."""

    async def on_node(kind: str, obj: dict[str, Any]) -> None:
        name = str(obj.get("metadata", {}).get("name", ""))
        if kind == "DELETED":
            sim.remove_node(name)
            agent.forget_node(name)
            return
        if sim.upsert_node(obj) is not None:
            await agent.sync_node(name, obj.get("metadata", {}).get("labels") or {})

    async def on_pod(kind: str, obj: dict[str, Any]) -> None:
        agent.summaries.pod_changed(obj, deleted=kind == "DELETED")
        agent.directory.track_progress(obj, deleted=kind == "DELETED")
        if kind == "DELETED":
            sim.remove_pod(str(obj.get("metadata", {}).get("uid", "")))
        else:
            sim.upsert_pod(obj, time.time())

    nodes = _watch(
        kube,
        NODES,
        on_node,
        task="profiler.sim.watch-nodes",
        tasks=tasks,
        informers=informers,
        died=died,
        label_selector=settings.sim_node_selector,
    )
    await nodes.synced.wait()
    pods = _watch(
        kube,
        PODS,
        on_pod,
        task="profiler.sim.watch-pods",
        tasks=tasks,
        informers=informers,
        died=died,
    )
    await pods.synced.wait()


async def start_aggregator(
    settings: ProfilerSettings, registry: CollectorRegistry | None = None
) -> Running:
    metrics = ProfilerMetrics(registry)
    bus = await Bus.connect(
        settings.nats_url, name="profiler-aggregator", credentials=settings.nats_credentials(),
        replicas=settings.nats_replicas,
    )  # fmt: skip
    bus.export_metrics(metrics.registry)
    kube = KubeClient.from_config(settings.kubeconfig)
    redis = redis_client(settings)
    tasks: list[asyncio.Task[Any]] = []
    informers: list[Informer] = []
    died = asyncio.Event()
    aggregator = Aggregator(
        bus,
        kube,
        redis,
        metrics,
        cluster=settings.cluster,
        source=f"{settings.source}-aggregator",
        live_annotation_interval_s=settings.live_annotation_interval_s,
        idle_ttl_s=settings.redis_idle_ttl_s,
        finished_ttl_s=settings.redis_finished_ttl_s,
        late_samples_s=settings.late_samples_s,
    )
    await subscribe_pod_metrics(bus, aggregator, settings.durable)
    await subscribe_pod_summaries(bus, aggregator, settings.durable)
    for spec in settings.owner_kinds:
        resource = parse_resource(spec)

        async def on_owner(kind: str, obj: dict[str, Any], resource: Any = resource) -> None:
            await aggregator.on_owner_event(kind, obj, resource)

        _watch(
            kube,
            resource,
            on_owner,
            task=f"profiler.aggregator.watch-{resource.plural}",
            tasks=tasks,
            informers=informers,
            died=died,
        )
    if settings.trialjobs:
        await _start_trials(kube, aggregator, tasks, informers, died)
    inventory = await bus.kv(GpuInventory.BUCKET)
    api = create_app(metrics, inventory, aggregator, bus, informers=informers)
    # A pod's metrics and a job's profile are their namespace's; the records cross namespaces.
    guard_reads(
        api, settings, kube, service="profiler-aggregator",
        objects=PROFILE_READS, lists=PROFILE_LISTS,
    )  # fmt: skip
    server = await _start_http(
        api,
        settings.http_host,
        settings.http_port,
        tasks,
        settings.http_cert_dir,
    )
    return Running(
        "aggregator",
        metrics,
        bus,
        kube,
        server,
        tasks,
        aggregator=aggregator,
        redis=redis,
        died=died,
        informers=informers,
    )


async def _start_trials(
    kube: KubeClient,
    aggregator: Aggregator,
    tasks: list[asyncio.Task[Any]],
    informers: list[Informer],
    died: asyncio.Event,
) -> None:
    """The TrialJob controller: TrialJob changes, trial Jobs ending, and their records landing."""
    trials = TrialController(kube, aggregator.records, aggregator.is_profiled)
    # The aggregator calls us once a record is written: that is when a trial's numbers exist.
    aggregator.on_finalized.append(trials.on_finalized)
    _watch(
        kube,
        TRIALJOBS,
        trials.on_trialjob,
        task="profiler.trialjobs.watch",
        tasks=tasks,
        informers=informers,
        died=died,
    )
    # A trial Job that ends without ever being profiled gets no record; the watch still sees
    # it end.
    _watch(
        kube,
        JOBS,
        trials.on_job,
        task="profiler.trialjobs.watch-jobs",
        tasks=tasks,
        informers=informers,
        died=died,
        label_selector=LABEL_TRIALJOB,
    )


async def serve(settings: ProfilerSettings) -> None:
    """Run the configured role until SIGTERM/SIGINT or until a vital task dies."""
    setup_logging(settings.log_level, settings.log_json)
    if settings.role == "bus-auth":
        auth = await start_bus_auth(settings)
        log.info("profiler started", extra={"role": settings.role, "port": auth.http_port})
        died = await until_stopped(auth.died)
        await auth.stop()
        if died:
            raise SystemExit(1)
        return
    start = start_agent if settings.role == "agent" else start_aggregator
    running = await start(settings)
    log.info("profiler started", extra={"role": settings.role, "port": running.http_port})
    died = await until_stopped(running.died)
    await running.stop()
    if died:
        raise SystemExit(1)  # crash-only: let Kubernetes restart us rather than run half-broken
