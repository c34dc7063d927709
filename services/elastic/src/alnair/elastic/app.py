"""Wiring and lifespan of the ElasticJob controller.

`start` opens the Kubernetes client and (unless disabled) NATS, starts the controller's
informers, subscribes to scale requests and starts the HTTP server, returning a handle whose
`stop()` undoes it all in reverse. Tests use `start` directly; `serve` runs until SIGTERM, or
until a vital task dies (crash-only: Kubernetes restarts the process, which converges from
what it finds).

With leader election (the Lease `alnair-elastic`) every replica keeps its informers warm, and
only the leader resizes: on becoming leader it reconciles every job; a follower refuses scale
requests (another replica decides); a leader that loses the Lease exits.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import Request
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.events import ScaleEvent
from alnair.common.http import bound_port, named_task, start_http, stop_http
from alnair.common.httpauth import Access, install_token_auth, reviewer_for
from alnair.common.kube import KubeClient, user_agent
from alnair.common.leader import LeaderElector, elector_for
from alnair.common.logs import setup_logging
from alnair.common.tasks import spawn, until_stopped
from alnair.elastic.api import create_app
from alnair.elastic.controller import Controller
from alnair.elastic.handlers import subscribe
from alnair.elastic.metrics import ElasticMetrics
from alnair.elastic.settings import ElasticSettings

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A started controller."""

    settings: ElasticSettings
    metrics: ElasticMetrics
    kube: KubeClient
    controller: Controller
    server: uvicorn.Server
    bus: Bus | None = None
    subscriptions: list[Subscription] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    died: asyncio.Event = field(default_factory=asyncio.Event)
    elector: LeaderElector | None = None

    @property
    def http_port(self) -> int:
        return bound_port(self.server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def stop(self) -> None:
        await stop_http(self.server, named_task(self.tasks, "elastic.http"))
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.elector is not None:
            await self.elector.release()
        for sub in self.subscriptions:
            await sub.stop()
        await self.controller.stop()
        if self.bus is not None:
            await self.bus.close()
        await self.kube.close()


async def start(
    settings: ElasticSettings,
    registry: CollectorRegistry | None = None,
    kube: KubeClient | None = None,
) -> Running:
    metrics = ElasticMetrics(registry)
    kube = kube or KubeClient.from_config(
        settings.kubeconfig, agent=user_agent("alnair-elastic", settings.identity)
    )
    died = asyncio.Event()

    def on_death(_exc: BaseException) -> None:
        died.set()

    bus = None
    publish = None
    if settings.nats_enabled:
        bus = await Bus.connect(
            settings.nats_url, name="elastic", credentials=settings.nats_credentials(),
            replicas=settings.nats_replicas,
        )  # fmt: skip
        bus.export_metrics(metrics.registry)
        connected = bus

        async def publish_event(event: ScaleEvent, event_id: str) -> None:
            await connected.publish(event, source=settings.source, event_id=event_id)

        publish = publish_event
    controller = Controller(kube, settings, metrics, publish, on_death=on_death)
    elector = elector_for(settings, kube, settings.lease_name)
    if elector is not None:
        controller.leading = elector.leading
    await controller.start()
    subscriptions = await subscribe(bus, controller, settings.durable) if bus else []
    app = create_app(controller, metrics, bus)
    # POST .../scale resizes a job: only callers the API server authenticates (TokenReview)
    # and allows to update that ElasticJob's scale (SubjectAccessReview).
    install_token_auth(app, reviewer_for(settings, kube), service="elastic", authorize=scale_access)
    server, http_task = await start_http(
        app, settings.http_host, settings.http_port, name="elastic.http", on_death=on_death,
        cert_dir=settings.http_cert_dir,
    )  # fmt: skip
    tasks = [http_task]
    if elector is not None:
        tasks.append(spawn(_lead(elector, controller, died), name="elastic.leader"))
    return Running(
        settings, metrics, kube, controller, server, bus, subscriptions, tasks, died, elector
    )


async def _lead(elector: LeaderElector, controller: Controller, died: asyncio.Event) -> None:
    """Campaign; once leading, reconcile every job (a follower did nothing); when the Lease is
    lost, end the service (crash-only: it comes back as a follower)."""
    campaign = spawn(elector.run(), name="elastic.campaign")
    leading = spawn(elector.is_leader.wait(), name="elastic.leading")
    try:
        await asyncio.wait({campaign, leading}, return_when=asyncio.FIRST_COMPLETED)
        if elector.is_leader.is_set():
            log.info("leading: reconciling every ElasticJob", extra={"identity": elector.identity})
            for key in list(controller.jobs.store):
                controller.kick(key)
        await campaign
        log.error("leadership lost; exiting so a follower takes over")
        died.set()
    finally:
        leading.cancel()
        campaign.cancel()


SCALE_PATH = re.compile(r"^/v1/elasticjobs/(?P<namespace>[^/]+)/(?P<name>[^/]+)/scale$")


def scale_access(request: Request) -> Access | None:
    """Resizing an ElasticJob is `update` on its `elasticjobs/scale`, as `kubectl scale` is for
    a Deployment; no other mutation is open."""
    m = SCALE_PATH.match(request.url.path)
    if m is None:
        return None
    return Access("update", "alnair.io", "elasticjobs", m["namespace"], m["name"], "scale")


async def serve(settings: ElasticSettings) -> int:
    """Run the controller until SIGTERM/SIGINT, or until one of its tasks dies."""
    setup_logging(settings.log_level, settings.log_json)
    running = await start(settings)
    log.info("elastic controller serving", extra={"url": running.url})
    died = await until_stopped(running.died)
    await running.stop()
    return 1 if died else 0
