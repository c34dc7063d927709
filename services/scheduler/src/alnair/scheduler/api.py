"""HTTP API: why is my pod pending, what is queued, metrics, health.

- `GET /v1/pods/{namespace}/{name}/explain`: the request as the scheduler reads it, per-node
  filter reasons, the best node scores per plugin, and the sentence shown on the pod.
- `GET /v1/queue`: pending pods in scheduling order with their state and last message.
- `GET /metrics`, `/healthz`, `/readyz` (ready while every informer has synced and its watch
  works; else 503 naming the informer and its last error).
Errors are RFC 7807 problem responses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from alnair.common.http import install_problem_handlers, problem
from alnair.common.informer import not_ready as informers_not_ready
from alnair.common.kube import NotFound
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.scheduler.live.scheduler import Scheduler

if TYPE_CHECKING:  # the NATS client is imported only by a scheduler that connects to NATS
    from alnair.common.bus import Bus


def build_api(scheduler: Scheduler, bus: Bus | None = None) -> FastAPI:
    app = FastAPI(title="alnair-scheduler", version="0.1.0")
    install_problem_handlers(app)

    @app.exception_handler(NotFound)
    async def not_found(_req: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "Not Found", exc.api_message)

    @app.get("/v1/pods/{namespace}/{name}/explain")
    async def explain(namespace: str, name: str) -> dict[str, Any]:
        return scheduler.explain(namespace, name)

    @app.get("/v1/queue")
    async def queue() -> dict[str, Any]:
        return {
            "depth": scheduler.queue.depth(),
            "cache": scheduler.cache.stats(),
            "pods": scheduler.queue.snapshot(),
            "reserved_nodes": scheduler.cache.reservations.describe(),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        for name, value in scheduler.queue.depth().items():
            scheduler.metrics.queue_depth.labels(queue=name).set(value)
        return Response(render(scheduler.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=None)
    async def readyz() -> dict[str, str] | JSONResponse:
        # A dead or failing watch freezes the scheduler's view of the cluster: not ready,
        # with which informer and why, instead of serving decisions from a stale cache.
        if bus is not None and (why := bus.why_not_ready()) is not None:
            return problem(503, "Not Ready", why)
        if (stale := informers_not_ready(scheduler.informers())) is not None:
            reason, informers = stale
            return problem(503, "Not Ready", reason, informers=informers)
        return {"status": "ready", "leading": str(scheduler.scheduling.is_set()).lower()}

    return app
