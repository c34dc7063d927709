"""Wiring and lifespan of the dispatcher.

Start order: Kubernetes client -> informers synced -> NATS (predictor requests, job events,
retrain notices) -> HTTP API and the webhook -> leader election -> the reconcile loop.

One replica decides at a time: every replica keeps its informers warm and serves the webhook
(holding a workload at creation needs no leader), and the one holding the Lease
(`alnair-dispatcher`, or `alnair-hub`) reconciles. A leader that cannot renew within the renew
deadline writes no more decisions and exits (crash-only); a follower takes over once the Lease
has not changed for its duration. Decisions are also writes guarded by resourceVersion, so
even two deciders could only race and lose with a 409, never admit twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from alnair.common.aggregated import SecureServer
from alnair.common.bus import Bus
from alnair.common.events import Envelope, JobEvent, JobPhase
from alnair.common.http import bound_port, start_http
from alnair.common.httpauth import guard_reads
from alnair.common.kube import KubeClient, user_agent
from alnair.common.leader import LeaderElector, elector_for
from alnair.common.logs import setup_logging
from alnair.common.tasks import on_stop_signals, spawn
from alnair.scheduler.dispatcher.api import build_api
from alnair.scheduler.dispatcher.controller import Dispatcher
from alnair.scheduler.dispatcher.hub import Hub
from alnair.scheduler.dispatcher.hub_api import build_hub_api
from alnair.scheduler.dispatcher.kinds import KINDS
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.predictions import PredictorClient
from alnair.scheduler.dispatcher.query_api import QUERY_API, add_query_routes
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.webhook import build_webhook_api
from alnair.scheduler.tables import follow_table

log = logging.getLogger(__name__)


async def subscribe_retrains(bus: Bus, dispatcher: Dispatcher | Hub, durable: str) -> Any:
    """A finished job retrains the predictor: forget cached answers and decide again."""

    async def on_job(event: JobEvent, _envelope: Envelope[JobEvent]) -> None:
        if event.phase in (JobPhase.COMPLETED, JobPhase.FAILED) and dispatcher.predictor:
            dispatcher.predictor.invalidate()
        dispatcher.wake()

    return await bus.subscribe(JobEvent, on_job, durable=durable)


class Running:
    """A started dispatcher: its parts, and how to stop them."""

    def __init__(
        self,
        dispatcher: Dispatcher | Hub,
        kube: KubeClient,
        bus: Bus | None,
        loop: asyncio.Task[Any],
        http: asyncio.Task[Any],
        server: Any,
        webhook: SecureServer | None = None,
        elector: LeaderElector | None = None,
        campaign: asyncio.Task[Any] | None = None,
        watches: asyncio.Task[Any] | None = None,
        tables: asyncio.Task[Any] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.kube = kube
        self.bus = bus
        self.loop = loop
        self.http = http
        self.server = server
        self.webhook = webhook
        self.elector = elector
        self.campaign = campaign
        self.watches = watches
        """Ends when one of the dispatcher's informers died."""
        self.tables = tables
        """Follows the predictor's co-location table (`alnair.scheduler.tables`)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{bound_port(self.server)}"

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        """What must keep running: one ending is the dispatcher failing."""
        webhook = self.webhook.tasks if self.webhook else set()
        campaign = {self.campaign} if self.campaign else set()  # it ends: leadership lost
        watches = {self.watches} if self.watches else set()  # it ends: an informer died
        tables = {self.tables} if self.tables else set()  # it ends: the KV watch failed
        return {self.loop, self.http, *webhook, *campaign, *watches, *tables}

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.webhook is not None:
            await self.webhook.stop()
        self.loop.cancel()
        if self.watches is not None:
            self.watches.cancel()
        if self.tables is not None:
            self.tables.cancel()
            await asyncio.gather(self.tables, return_exceptions=True)
        if self.campaign is not None:
            self.campaign.cancel()
        await asyncio.gather(self.loop, self.http, return_exceptions=True)
        if self.campaign is not None:
            await asyncio.gather(self.campaign, return_exceptions=True)
        if self.elector is not None:
            await self.elector.release()
        await self.dispatcher.stop()
        if self.bus is not None:
            await self.bus.close()
        await self.kube.close()


async def start_webhook(
    settings: DispatcherSettings, metrics: DispatcherMetrics, dispatcher: Dispatcher,
    kube: KubeClient,
) -> SecureServer:  # fmt: skip
    """The secure server: the admission webhook and the aggregated query API
    (`query_api.py`, unless `query_api` is off) on one HTTPS port."""
    assert settings.webhook_cert_dir is not None
    app = build_webhook_api(metrics, dispatcher.validate_queue)
    if settings.query_api:
        add_query_routes(app, dispatcher)
    return await SecureServer.start(
        app, api=QUERY_API if settings.query_api else None, kube=kube, settings=settings,
        cert_dir=settings.webhook_cert_dir, port=settings.webhook_port, name="dispatcher.webhook",
    )  # fmt: skip


async def start(settings: DispatcherSettings, kube: KubeClient | None = None) -> Running:
    kube = kube or KubeClient.from_config(
        settings.kubeconfig, agent=user_agent("alnair-dispatcher", settings.identity)
    )
    metrics = DispatcherMetrics()
    bus: Bus | None = None
    predictor: PredictorClient | None = None
    if settings.nats_enabled:
        bus = await Bus.connect(
            settings.nats_url, name="dispatcher", credentials=settings.nats_credentials(),
            replicas=settings.nats_replicas,
        )  # fmt: skip
        bus.export_metrics(metrics.registry)
        predictor = PredictorClient(bus, settings.predict_subject, settings.predict_timeout_s)
    dispatcher: Dispatcher | Hub
    if settings.mode == "hub":
        # One queue over the worker clusters (issue 15); the hub admits nothing locally.
        dispatcher = Hub(kube, settings, metrics, bus=bus, predictor=predictor)
        api = build_hub_api(dispatcher)
    else:
        dispatcher = Dispatcher(kube, settings, metrics, bus=bus, predictor=predictor)
        api = build_api(dispatcher)
    # A workload's explanation is its namespace's: read by whoever may get the workload.
    guard_reads(
        api, settings, kube, service="dispatcher",
        objects={k.resource.plural: (k.resource.group, k.resource.plural) for k in KINDS.values()},
    )  # fmt: skip
    await dispatcher.start_watching()
    tables = None
    if bus is not None:
        await subscribe_retrains(bus, dispatcher, durable="dispatcher")
        if isinstance(dispatcher, Dispatcher):
            tables = spawn(follow_table(bus, dispatcher.on_colocation), name="dispatcher.tables")
    server, http = await start_http(
        api, settings.http_host, settings.http_port, name="dispatcher.http",
        cert_dir=settings.http_cert_dir,
    )  # fmt: skip
    webhook = None
    if settings.webhook_cert_dir and isinstance(dispatcher, Dispatcher):
        webhook = await start_webhook(settings, metrics, dispatcher, kube)
    lease = settings.lease_name or ("alnair-hub" if settings.mode == "hub" else "alnair-dispatcher")
    elector = elector_for(settings, kube, lease)
    campaign = None
    if elector is not None:
        dispatcher.leading = elector.leading
        dispatcher.leader = elector.holder
        campaign = spawn(elector.run(), name="dispatcher.leader")
    loop = spawn(_lead(dispatcher, elector), name="dispatcher.loop")
    watches = spawn(dispatcher.watch_died.wait(), name="dispatcher.watches")
    return Running(
        dispatcher, kube, bus, loop, http, server, webhook, elector, campaign, watches, tables
    )


async def _lead(dispatcher: Dispatcher | Hub, elector: LeaderElector | None) -> None:
    """Reconcile once this replica leads (at once without leader election)."""
    if elector is not None:
        await elector.is_leader.wait()
        log.info("leading: reconciling", extra={"identity": elector.identity})
    await dispatcher.run()


async def serve(settings: DispatcherSettings) -> int:
    running = await start(settings)
    task = asyncio.current_task()
    assert task is not None
    on_stop_signals(task.cancel)
    try:
        await asyncio.wait(running.tasks, return_when=asyncio.FIRST_COMPLETED)
        log.error("a dispatcher part stopped; exiting")
        return 1
    except asyncio.CancelledError:
        log.info("stopped by a signal")
        return 0
    finally:
        await running.stop()


def main() -> int:
    settings = DispatcherSettings()
    setup_logging(settings.log_level, settings.log_json)
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0
