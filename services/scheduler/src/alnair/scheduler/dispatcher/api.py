"""HTTP API of the dispatcher: why is my job waiting, what do the queues hold, metrics, health.

- `GET /v1/jobs/{namespace}/{name}`: status (waiting, admitted, complete, failed, invalid), the
  ClusterQueue, position in it, the reason it waits (quota, reservation, memory, fair share,
  capacity, queue, prediction), predicted start and finish, the prediction used.
- `GET /v1/elasticjobs/{namespace}/{name}`, `/v1/pods/...`, `/v1/jobsets/...`: the same for an
  ElasticJob, a queued Pod of its own, a JobSet.
- `GET /v1/queues`: every ClusterQueue, active or why not, with its status.
- `GET /metrics`, `/healthz`, `/readyz` (ready once every informer has synced).
Errors are RFC 7807 problem responses.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from alnair.common.http import install_problem_handlers, problem
from alnair.common.kube import NotFound
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.scheduler.dispatcher.controller import Dispatcher


def build_api(dispatcher: Dispatcher) -> FastAPI:
    app = FastAPI(title="alnair-dispatcher", version="0.1.0")
    install_problem_handlers(app)

    @app.exception_handler(NotFound)
    async def not_found(_req: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "Not Found", exc.api_message)

    @app.get("/v1/jobs/{namespace}/{name}")
    async def job(namespace: str, name: str) -> dict[str, Any]:
        return dispatcher.explain(namespace, name)

    @app.get("/v1/elasticjobs/{namespace}/{name}")
    async def elasticjob(namespace: str, name: str) -> dict[str, Any]:
        return dispatcher.explain(namespace, name, kind="ElasticJob")

    @app.get("/v1/pods/{namespace}/{name}")
    async def pod(namespace: str, name: str) -> dict[str, Any]:
        return dispatcher.explain(namespace, name, kind="Pod")

    @app.get("/v1/jobsets/{namespace}/{name}")
    async def jobset(namespace: str, name: str) -> dict[str, Any]:
        return dispatcher.explain(namespace, name, kind="JobSet")

    @app.get("/v1/queues")
    async def queues() -> dict[str, Any]:
        return {"policy": dispatcher.policy.name, "queues": dispatcher.describe_queues()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(dispatcher.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=None)
    async def readyz() -> dict[str, str] | JSONResponse:
        if not dispatcher.synced:
            return problem(503, "Not Ready", "caches not synced yet")
        return {"status": "ready"}

    return app
