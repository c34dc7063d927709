"""Wiring and lifespan of the predictor service.

`start` connects Redis and NATS, brings up the serving model (the stored current version, or a
first one trained from Gavel and the records), subscribes to job events and request-reply
subjects, starts the retrainer's owner task and the HTTP server, and returns a handle whose
`stop()` undoes it all in reverse. Tests use `start` directly; `serve` runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.http import bound_port, named_task, start_http, stop_http
from alnair.common.logs import setup_logging
from alnair.common.redisconn import redis_client
from alnair.common.tasks import cancel_all, spawn, until_stopped
from alnair.predictor.api import create_app
from alnair.predictor.datasets import load_gavel
from alnair.predictor.handlers import subscribe
from alnair.predictor.metrics import PredictorMetrics
from alnair.predictor.retraining import Retrainer
from alnair.predictor.settings import PredictorSettings
from alnair.predictor.store import ModelStore
from alnair.predictor.tables import publish_tables

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A started predictor."""

    settings: PredictorSettings
    metrics: PredictorMetrics
    bus: Bus
    redis: aioredis.Redis
    retrainer: Retrainer
    server: uvicorn.Server
    subscriptions: list[Subscription] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    died: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def http_port(self) -> int:
        return bound_port(self.server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def stop(self) -> None:
        await stop_http(self.server, named_task(self.tasks, "predictor.http"))
        for sub in self.subscriptions:
            await sub.stop()
        await cancel_all(self.tasks)
        await self.bus.close()
        await self.redis.aclose()


async def start(settings: PredictorSettings, registry: CollectorRegistry | None = None) -> Running:
    metrics = PredictorMetrics(registry)
    gavel = load_gavel(settings.gavel_path)
    redis = redis_client(settings)
    store = ModelStore(redis, model_key(settings), keep=settings.models_kept)
    retrainer = Retrainer(
        redis,
        store,
        gavel,
        metrics,
        kind=settings.model_kind,
        level=settings.interval_level,
        debounce_s=settings.retrain_debounce_s,
        max_wait_s=settings.retrain_max_wait_s,
        tolerance=settings.validation_tolerance,
    )
    await retrainer.bootstrap()
    bus = await Bus.connect(
        settings.nats_url, name="predictor", credentials=settings.nats_credentials(),
        replicas=settings.nats_replicas,
    )  # fmt: skip
    bus.export_metrics(metrics.registry)
    died = asyncio.Event()

    def on_death(_exc: BaseException) -> None:
        died.set()

    tasks = [
        spawn(retrainer.run(), name="predictor.retrainer", on_death=on_death),
        spawn(publish_tables(bus, retrainer, metrics), name="predictor.tables", on_death=on_death),
    ]
    subscriptions = await subscribe(
        bus, retrainer, metrics, settings.durable, settings.predict_subject
    )
    app = create_app(retrainer, store, metrics, bus)
    server, http_task = await start_http(
        app, settings.http_host, settings.http_port, name="predictor.http", on_death=on_death,
        cert_dir=settings.http_cert_dir,
    )  # fmt: skip
    tasks.append(http_task)
    return Running(settings, metrics, bus, redis, retrainer, server, subscriptions, tasks, died)


def model_key(settings: PredictorSettings) -> bytes:
    """The key that signs stored models: the configured Secret, else a random one (dev)."""
    if settings.model_key is not None:
        return settings.model_key.get_secret_value().encode()
    log.warning(
        "no ALNAIR_PREDICTOR_MODEL_KEY: stored models are signed with a per-process key,"
        " so a restart retrains instead of loading them"
    )
    return secrets.token_bytes(32)


async def serve(settings: PredictorSettings) -> int:
    """Run the predictor until SIGTERM/SIGINT, or until one of its tasks dies."""
    setup_logging(settings.log_level, settings.log_json)
    running = await start(settings)
    log.info("predictor serving", extra={"url": running.url})
    died = await until_stopped(running.died)
    await running.stop()
    return 1 if died else 0
