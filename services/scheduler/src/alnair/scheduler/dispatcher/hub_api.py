"""HTTP API of the hub: where is my job and why, which worker clusters answer, metrics, health.

- `GET /v1/{plural}/{namespace}/{name}` (`jobs`, `jobsets`, `rayjobs`, `rayclusters`,
  `trainjobs`: the kinds the hub places): status (waiting, placed, lost-contact, finished as
  its kind says), the cluster and GPU model, clusters it was taken back from, why it waits,
  and every (cluster, GPU model) it could use with predicted wait, transfer, runtime and
  completion.
- `GET /v1/clusters`: every worker cluster (reachable or lost, and why: unreachable or
  unauthorized), its GPUs, what it holds, its mirrored jobs; worker Secrets refused and why.
- `GET /metrics`, `/healthz`, `/readyz` (ready once the hub's own informers synced; a worker
  that does not answer is reported, it does not make the hub unready).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from alnair.common.bus import not_ready
from alnair.common.http import install_problem_handlers, problem
from alnair.common.kube import NotFound
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.scheduler.dispatcher.api import add_workload_route
from alnair.scheduler.dispatcher.hub import Hub
from alnair.scheduler.dispatcher.kinds import DELEGABLE


def build_hub_api(hub: Hub) -> FastAPI:
    app = FastAPI(title="alnair-hub", version="0.1.0")
    install_problem_handlers(app)

    @app.exception_handler(NotFound)
    async def not_found(_req: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "Not Found", exc.api_message)

    add_workload_route(app, hub, DELEGABLE, "the hub places no kind")

    @app.get("/v1/clusters")
    async def clusters() -> dict[str, Any]:
        return hub.describe_clusters()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(hub.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=None)
    async def readyz() -> dict[str, str] | JSONResponse:
        if not hub.synced:
            return problem(503, "Not Ready", "caches not synced yet")
        if (why := not_ready(hub.bus)) is not None:
            return problem(503, "Not Ready", why)
        return {"status": "ready"}

    return app
