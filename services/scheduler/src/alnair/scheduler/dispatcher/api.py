"""HTTP API of the dispatcher: why is my job waiting, what do the queues hold, metrics, health.

- `GET /v1/jobs/{namespace}/{name}`: status (waiting, admitted, complete, failed, invalid), the
  ClusterQueue, position in it, the reason it waits (quota, reservation, memory, fair share,
  capacity, queue, prediction), predicted start and finish, the prediction used.
- `GET /v1/{elasticjobs,pods,jobsets,deployments,statefulsets}/{namespace}/{name}`: the same
  for every other queued kind (`kinds.py`).
- `GET /v1/queues`: every ClusterQueue, active or why not, with its status.
- `GET /metrics`, `/healthz`, `/readyz` (ready while every informer is synced and none has
  been failing for longer than its stale bound; says whether this replica leads).
Errors are RFC 7807 problem responses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from alnair.common.bus import not_ready
from alnair.common.http import install_problem_handlers, problem
from alnair.common.kube import NotFound
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.scheduler.dispatcher.controller import Dispatcher
from alnair.scheduler.dispatcher.hub import Hub
from alnair.scheduler.dispatcher.kinds import KINDS
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind


def add_workload_route(
    app: FastAPI, backend: Dispatcher | Hub, kinds: Iterable[WorkloadKind], unknown: str
) -> None:
    """`GET /v1/{plural}/{namespace}/{name}` for every kind of `kinds`: the backend's
    explanation of one workload (404 naming the known plurals for another kind; 503 on a
    follower, which decides nothing). `unknown` begins the 404's message."""
    by_plural = {k.resource.plural: k.kind for k in kinds}

    @app.get("/v1/{plural}/{namespace}/{name}", response_model=None)
    async def workload(plural: str, namespace: str, name: str) -> dict[str, Any] | JSONResponse:
        kind = by_plural.get(plural)
        if kind is None:
            known = ", ".join(sorted(by_plural))
            raise NotFound(404, "NotFound", f"{unknown} {plural!r} (known: {known})", plural)
        if (why := backend.follower_problem()) is not None:
            return problem(503, "Not Leading", why)
        return backend.explain(namespace, name, kind=kind)


def build_api(dispatcher: Dispatcher) -> FastAPI:
    app = FastAPI(title="alnair-dispatcher", version="0.1.0")
    install_problem_handlers(app)

    @app.exception_handler(NotFound)
    async def not_found(_req: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "Not Found", exc.api_message)

    add_workload_route(app, dispatcher, KINDS.values(), "no queued kind")

    @app.get("/v1/queues", response_model=None)
    async def queues() -> dict[str, Any] | JSONResponse:
        if (why := dispatcher.follower_problem()) is not None:
            return problem(503, "Not Leading", why)
        return {"policy": dispatcher.policy.name, "queues": dispatcher.describe_queues()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(dispatcher.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=None)
    async def readyz() -> dict[str, str] | JSONResponse:
        # A dead or failing watch freezes the queue's view: not ready, naming the informer,
        # rather than deciding from a stale cache.
        if (why := not_ready(dispatcher.bus)) is not None:
            return problem(503, "Not Ready", why)
        informers = dispatcher.informers
        if not all(inf.healthy for inf in informers):
            return problem(
                503, "Not Ready",
                "caches not synced yet" if not dispatcher.synced else "a watch is failing",
                informers={inf.name: inf.status() for inf in informers},
            )  # fmt: skip
        return {"status": "ready", "leading": str(dispatcher.leading()).lower()}

    return app
