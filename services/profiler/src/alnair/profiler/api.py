"""The profiler's HTTP API: what the agent and the aggregator know, for people and tools.

- `GET /v1/nodes`, `GET /v1/nodes/{node}/gpus`: GPU inventory (from the `gpu-inventory` KV
  bucket, so any replica answers for every node);
- `GET /v1/pods/{ns}/{name}/metrics`: the pod's latest sample per GPU (aggregator);
- `GET /v1/jobs/{ns}/{name}/profile`: a job's folded profile, its pods, its record (aggregator);
- `GET /v1/records?model=&gpu=&limit=`: execution records, newest first (aggregator);
- `GET /metrics` (Prometheus, per-pod GPU gauges), `GET /healthz`, `GET /readyz` (503 while the
  bus is disconnected or making its streams and consumers again after a reconnect, and while a
  watch of the API server has not synced or is failing, naming it).
Errors are RFC 9457 problem responses that name what was not found.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from alnair.common.bus import Bus, not_ready
from alnair.common.errors import AlnairError, InvalidValueError
from alnair.common.events import GpuInventory
from alnair.common.http import install_problem_handlers, problem
from alnair.common.httpauth import Access
from alnair.common.informer import Informer
from alnair.common.informer import not_ready as informers_not_ready
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.profiler.aggregator.aggregator import Aggregator
from alnair.profiler.metrics import ProfilerMetrics

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class NotFoundProblem(AlnairError):
    """A resource the request named does not exist (404)."""

    def __init__(self, what: str, name: str) -> None:
        super().__init__(f"{what} {name!r} not found", what=what, name=name)
        self.what = what
        self.name = name


PROFILE_READS = {"pods": ("", "pods"), "jobs": ("batch", "jobs")}
"""The reads that are one namespace's (a pod's metrics, a job's profile): with
`ALNAIR_HTTP_AUTH_READS`, for whoever may get that pod or Job."""
PROFILE_LISTS = {"/v1/records": Access("list", "batch", "jobs")}
"""The records cross namespaces: for whoever may list Jobs in all of them."""


def create_app(
    metrics: ProfilerMetrics,
    inventory: KeyValue | None = None,
    aggregator: Aggregator | None = None,
    bus: Bus | None = None,
    informers: Sequence[Informer] = (),
) -> FastAPI:
    """The API; routes needing the aggregator answer 404 problems on an agent."""
    app = FastAPI(title="alnair profiler", version="v1")
    install_problem_handlers(app)

    @app.exception_handler(NotFoundProblem)
    async def _not_found(_request: Request, exc: NotFoundProblem) -> JSONResponse:
        return problem(404, "Not Found", str(exc), what=exc.what, name=exc.name)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if (why := not_ready(bus)) is not None:
            return problem(503, "Not Ready", why)
        # A dead or failing watch leaves pods unattributed or jobs unrecorded: not ready,
        # with which watch and why.
        if (stale := informers_not_ready(informers)) is not None:
            reason, status = stale
            return problem(503, "Not Ready", reason, informers=status)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def read_inventory(node: str) -> GpuInventory:
        if inventory is None:
            raise NotFoundProblem("node inventory", node)
        if len(node) > 253 or not _NODE_NAME.fullmatch(node):
            # Not a name any node can have (nor a valid KV key): say so instead of asking NATS.
            raise InvalidValueError("node", node, "not a Kubernetes node name (RFC 1123)")
        try:
            entry = await inventory.get(node)
        except KeyNotFoundError as exc:
            raise NotFoundProblem("node", node) from exc
        if not entry.value:
            raise NotFoundProblem("node", node)
        return GpuInventory.model_validate_json(entry.value)

    @app.get("/v1/nodes")
    async def nodes() -> list[dict[str, Any]]:
        if inventory is None:
            return []
        try:
            keys = await inventory.keys()
        except NoKeysError:
            return []
        out = []
        for key in sorted(keys):
            inv = await read_inventory(key)
            out.append(
                {
                    "node": inv.node,
                    "gpus": len(inv.gpus),
                    "healthy_gpus": sum(1 for g in inv.gpus if g.healthy),
                    "models": sorted({g.model for g in inv.gpus}),
                    "ts": inv.ts.isoformat(),
                }
            )
        return out

    @app.get("/v1/nodes/{node}/gpus")
    async def node_gpus(node: str) -> dict[str, Any]:
        inv = await read_inventory(node)
        return inv.model_dump(mode="json")

    def need_aggregator(what: str, name: str) -> Aggregator:
        if aggregator is None:
            raise NotFoundProblem(what, name)
        return aggregator

    @app.get("/v1/pods/{namespace}/{name}/metrics")
    async def pod_metrics(namespace: str, name: str) -> dict[str, Any]:
        agg = need_aggregator("pod", f"{namespace}/{name}")
        latest = agg.latest.get((namespace, name))
        if not latest:
            raise NotFoundProblem("pod", f"{namespace}/{name}")
        samples = [m.model_dump(mode="json") for _, m in sorted(latest.items())]
        return {"namespace": namespace, "pod": name, "samples": samples}

    @app.get("/v1/jobs/{namespace}/{name}/profile")
    async def job_profile(namespace: str, name: str) -> dict[str, Any]:
        agg = need_aggregator("job", f"{namespace}/{name}")
        uid = await agg.owner_uid_by_name(namespace, name)
        if uid is None:
            raise NotFoundProblem("job", f"{namespace}/{name}")
        profile, pods = await agg.owner_profile(uid)
        record = await agg.records.get(namespace, name, uid)
        return {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "series": {
                series: {"count": s.count, "mean": s.mean, "max": s.max}
                for series, s in sorted(profile.stats.items())
            },
            "pods": pods,
            "record": record.model_dump(mode="json")
            | {"key": record.key, "duration_s": record.duration_s}
            if record
            else None,
        }

    @app.get("/v1/records")
    async def records(
        model: str | None = None, gpu: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        agg = need_aggregator("records", "")
        found = await agg.records.query(model=model, gpu=gpu, limit=max(1, min(limit, 10000)))
        return [
            r.model_dump(mode="json") | {"key": r.key, "duration_s": r.duration_s} for r in found
        ]

    return app
