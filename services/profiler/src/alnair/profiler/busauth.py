"""The profiler's third process, `bus-auth`: the bus's auth callout for the node components
it runs beside (the agent, the device plugin), which connect with their pod's ServiceAccount
token and are admitted as their node only (`alnair.common.busauth`).

It connects as the static `bus-auth` user (subscribe to the callout subject, answer it), asks
the API server who each token is (TokenReview: its account holds `system:auth-delegator`),
and signs users with the callout account's seed (`ALNAIR_PROFILER_BUS_AUTH_ISSUER_SEED`, from
the `alnair-nats-callout` Secret). Replicas share requests in a queue group. HTTP:
`/healthz`, `/readyz` (connected to the bus), `/metrics`
(`alnair_profiler_bus_auth_decisions_total{outcome}`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import nats
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from alnair.common import nkeys
from alnair.common.busauth import AUDIENCE, NODE_ACCOUNTS, NodeCallout
from alnair.common.errors import ConfigError
from alnair.common.http import bound_port, named_task, start_http, stop_http
from alnair.common.httpauth import TokenReviewer
from alnair.common.kube import KubeClient
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.common.tasks import cancel_all, spawn
from alnair.profiler.metrics import ProfilerMetrics
from alnair.profiler.settings import ProfilerSettings

log = logging.getLogger(__name__)


@dataclass
class BusAuthRunning:
    """A started bus-auth process."""

    metrics: ProfilerMetrics
    callout: NodeCallout
    nc: NatsClient
    kube: KubeClient
    server: uvicorn.Server
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    died: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def http_port(self) -> int:
        return bound_port(self.server)

    async def stop(self) -> None:
        await stop_http(self.server, named_task(self.tasks, "profiler.http"))
        await cancel_all(self.tasks)
        await self.nc.close()
        await self.kube.close()


def create_bus_auth_app(metrics: ProfilerMetrics, nc: NatsClient) -> FastAPI:
    app = FastAPI(title="alnair bus-auth", version="v1")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = bool(nc.is_connected)
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def start_bus_auth(
    settings: ProfilerSettings, registry: CollectorRegistry | None = None
) -> BusAuthRunning:
    if settings.bus_auth_issuer_seed is None:
        raise ConfigError(
            "ALNAIR_PROFILER_BUS_AUTH_ISSUER_SEED is not set: bus-auth signs users with the "
            "callout account's seed (the alnair-nats-callout Secret)"
        )
    issuer = nkeys.KeyPair.from_seed(settings.bus_auth_issuer_seed.get_secret_value())
    metrics = ProfilerMetrics(registry)
    kube = KubeClient.from_config(settings.kubeconfig)
    reviewer = TokenReviewer(kube, audiences=[AUDIENCE])
    callout = NodeCallout(
        issuer, reviewer.review, NODE_ACCOUNTS, ttl_s=settings.bus_auth_ttl_s,
        on_decision=lambda outcome: metrics.bus_auth.labels(outcome).inc(),
    )  # fmt: skip
    nc = await nats.connect(
        settings.nats_url, name="profiler-bus-auth", **settings.nats_credentials().connect_options()
    )
    died = asyncio.Event()
    tasks = [spawn(callout.serve(nc), name="profiler.bus-auth", on_death=lambda _e: died.set())]
    server, http = await start_http(
        create_bus_auth_app(metrics, nc), settings.http_host, settings.http_port,
        name="profiler.http", cert_dir=settings.http_cert_dir,
    )  # fmt: skip
    tasks.append(http)
    return BusAuthRunning(metrics, callout, nc, kube, server, tasks, died)
