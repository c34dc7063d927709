"""Wiring and lifespan of the scheduler service.

Start order: Kubernetes client -> informers synced -> NATS subscriptions -> HTTP API; then the
replica campaigns for the leader Lease and runs scheduling cycles only while it leads. Every
replica keeps its caches warm, so a failover only waits for the lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from alnair.common.aggregated import SecureServer
from alnair.common.events import JobEvent
from alnair.common.http import install_problem_handlers, start_http
from alnair.common.httpauth import guard_reads
from alnair.common.kube import KubeClient, user_agent
from alnair.common.leader import LeaderElector
from alnair.common.logs import setup_logging
from alnair.common.memtrace import install as trace_memory
from alnair.common.tasks import first_of, on_stop_signals, spawn
from alnair.scheduler.api import build_api
from alnair.scheduler.console.feed import Feed
from alnair.scheduler.console.routes import add_console_routes
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.metrics import SchedulerMetrics
from alnair.scheduler.query_api import QUERY_API, add_query_routes
from alnair.scheduler.settings import SchedulerSettings

if TYPE_CHECKING:
    from alnair.common.bus import Bus

log = logging.getLogger(__name__)


async def serve(settings: SchedulerSettings) -> int:
    """Run the scheduler; returns 1 when a vital task died or leadership was lost (crash-only:
    Kubernetes restarts the process, a follower takes over), 0 when cancelled by a signal."""
    kube = KubeClient.from_config(
        settings.kubeconfig,
        max_connections=settings.max_binds_in_flight + 32,
        agent=user_agent("alnair-scheduler", settings.identity),
    )
    if settings.tracemalloc_dir:
        trace_memory(Path(settings.tracemalloc_dir), settings.tracemalloc_frames, "scheduler")
    metrics = SchedulerMetrics()
    scheduler = Scheduler(kube, settings, metrics)
    died = scheduler.died

    def on_death(_exc: BaseException) -> None:
        died.set()

    await scheduler.start_watching()
    bus: Bus | None = None
    inventory: asyncio.Task[None] | None = None
    tables: asyncio.Task[None] | None = None
    if settings.nats_enabled:
        # The NATS client (a second of imports on a busy node) only where it is used.
        from alnair.common.bus import Bus
        from alnair.scheduler import handlers

        bus = await Bus.connect(
            settings.nats_url,
            name=f"scheduler-{settings.identity}",
            credentials=settings.nats_credentials(),
            replicas=settings.nats_replicas,
        )
        bus.export_metrics(metrics.registry)
        await handlers.subscribe(bus, scheduler, settings.identity)
        inventory = spawn(
            handlers.watch_inventory(bus, scheduler), name="scheduler.inventory", on_death=on_death
        )
        tables = spawn(
            handlers.watch_colocation(bus, scheduler), name="scheduler.colocation",
            on_death=on_death,
        )  # fmt: skip
    api = build_api(scheduler, bus)
    # A pod's explanation is its namespace's: read by whoever may get the pod.
    guard_reads(api, settings, kube, service="scheduler", objects={"pods": ("", "pods")})
    server, http = await start_http(
        api,
        settings.http_host,
        settings.http_port,
        name="scheduler.http",
        on_death=on_death,
        cert_dir=settings.http_cert_dir,
    )
    secure = await start_query(settings, kube, scheduler, on_death, bus)
    elector: LeaderElector | None = None
    loop: asyncio.Task[None] | None = None
    campaign: asyncio.Task[None] | None = None
    try:
        if settings.leader_elect:
            elector = LeaderElector(
                kube,
                name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=settings.identity,
                lease_duration_s=settings.lease_duration_s,
                renew_deadline_s=settings.renew_deadline_s,
                retry_period_s=settings.retry_period_s,
            )
            scheduler.leading = elector.leading  # no Binding once the renew deadline passed
            campaign = spawn(
                elector.run(), name="scheduler.leader", on_death=on_death, ends=elector.lost.is_set
            )
            await first_of(elector.is_leader, died)
        if not died.is_set():
            metrics.leader.set(1)
            loop = spawn(scheduler.run(), name="scheduler.loop", on_death=on_death)
            await first_of(died, *([elector.lost] if elector is not None else []))
        if elector is not None and elector.lost.is_set():
            log.error("leadership lost; exiting so a follower takes over")
        else:
            log.error("a vital task died; exiting so the scheduler is restarted")
        return 1
    finally:
        server.should_exit = True
        if secure is not None:
            await secure.stop()
        for task in (loop, campaign):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await scheduler.stop()
        if elector is not None:
            await elector.release()
        for watch in (inventory, tables):
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watch
        if bus is not None:
            await bus.close()
        await kube.close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await http


async def start_query(
    settings: SchedulerSettings,
    kube: KubeClient,
    scheduler: Scheduler,
    on_death: Callable[[BaseException], None] | None = None,
    bus: Bus | None = None,
) -> SecureServer | None:
    """The aggregated query API (`query_api.py`) and the console (`console/`) on their HTTPS
    port, when a certificate is configured. Every replica serves them: each keeps the cache it
    reads warm. The console's live updates come from this replica's watches and, with `bus`,
    from job lifecycle events."""
    if not settings.query_cert_dir:
        return None
    app = FastAPI(title="alnair-scheduler-query", version="0.1.0")
    install_problem_handlers(app)
    add_query_routes(app, scheduler)
    feed = Feed()
    scheduler.pods.add_handler(feed.on_pod)
    scheduler.nodes.add_handler(feed.on_node)
    scheduler.health_listeners.append(lambda: feed.changed("gpus"))
    add_console_routes(app, QUERY_API.prefix, feed)
    secure = await SecureServer.start(
        app, api=QUERY_API, kube=kube, settings=settings, cert_dir=settings.query_cert_dir,
        port=settings.query_port, name="scheduler.query", on_death=on_death,
    )  # fmt: skip
    if bus is not None:
        # A plain subscription: the console needs no history, and a restart needs no durable.
        sub = await bus.nc.subscribe(JobEvent.subject_filter(), cb=feed.on_job_message)
        secure.closers.append(sub.unsubscribe)
    return secure


async def _serve_until_signalled(settings: SchedulerSettings) -> int:
    """`serve`, cancelled on SIGTERM as on SIGINT, so its cleanup runs: binds in flight end,
    and the Lease is given up for a follower to take over at once rather than after it
    expires (a rolling update of the Deployment sends SIGTERM)."""
    task = asyncio.current_task()
    assert task is not None
    on_stop_signals(task.cancel)
    try:
        return await serve(settings)
    except asyncio.CancelledError:
        log.info("stopped by a signal")
        return 0


def main() -> int:
    settings = SchedulerSettings()
    setup_logging(settings.log_level, settings.log_json)
    try:
        return asyncio.run(_serve_until_signalled(settings))
    except KeyboardInterrupt:
        return 0
