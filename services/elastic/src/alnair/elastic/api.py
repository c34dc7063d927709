"""HTTP API of the ElasticJob controller.

- `GET /v1/elasticjobs`: every job this controller runs: target, current size, phase, hosts.
- `GET /v1/elasticjobs/{namespace}/{name}`: one job, with its recent resizes and why.
- `GET /v1/elasticjobs/{namespace}/{name}/hosts`: `host:slots` of every ready worker, one a
  line (what Horovod's discovery script prints).
- `POST /v1/elasticjobs/{namespace}/{name}/scale`: a scale request (`{"replicas": N}`), the
  HTTP twin of a `requested` ScaleEvent; the answer says the size applied or why refused.
- `GET /healthz`, `GET /readyz` (ready while every watch is synced and none is failing, and
  this replica leads, so the Service sends scale requests to the one that decides),
  `GET /metrics`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from alnair.common.bus import Bus, not_ready
from alnair.common.http import install_problem_handlers
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.elastic.controller import Controller
from alnair.elastic.metrics import ElasticMetrics
from alnair.elastic.scaling import ScaleRequest


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(ge=0, description="worker count asked for")
    reason: str = Field(default="", max_length=256)


class ScaleReply(BaseModel):
    replicas: int | None
    previous_replicas: int | None
    applied: bool
    reason: str


def create_app(controller: Controller, metrics: ElasticMetrics, bus: Bus | None = None) -> FastAPI:
    app = FastAPI(title="Alnair elastic", version="1")
    install_problem_handlers(app)

    def job_view(key: str) -> dict[str, Any]:
        obj = controller.jobs.get(key)
        if obj is None:
            raise HTTPException(status_code=404, detail=f"no ElasticJob {key}")
        st = controller.st(key)
        status = st.status or obj.get("status") or {}
        return {
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "phase": status.get("phase", "Pending"),
            "targetReplicas": st.target,
            "currentReplicas": status.get("currentReplicas", 0),
            "minReplicas": (obj.get("spec") or {}).get("minReplicas"),
            "maxReplicas": (obj.get("spec") or {}).get("maxReplicas"),
            "hosts": st.hosts,
        }

    @app.get("/v1/elasticjobs")
    async def list_jobs() -> list[dict[str, Any]]:
        return [job_view(k) for k in sorted(controller.jobs.store)]

    @app.get("/v1/elasticjobs/{namespace}/{name}")
    async def get_job(namespace: str, name: str) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        view = job_view(key)
        view["resizes"] = [r.as_status() for r in controller.st(key).history]
        return view

    @app.get("/v1/elasticjobs/{namespace}/{name}/hosts", response_class=PlainTextResponse)
    async def get_hosts(namespace: str, name: str) -> str:
        view = job_view(f"{namespace}/{name}")
        return "".join(f"{h}\n" for h in view["hosts"])

    @app.post("/v1/elasticjobs/{namespace}/{name}/scale")
    async def post_scale(namespace: str, name: str, body: ScaleBody) -> ScaleReply:
        job_view(f"{namespace}/{name}")
        outcome = await controller.request(
            namespace, name, ScaleRequest(body.replicas, body.reason or "HTTP scale request")
        )
        return ScaleReply(
            replicas=outcome.replicas,
            previous_replicas=outcome.previous,
            applied=not outcome.refused,
            reason=outcome.refused or outcome.reason,
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        if not controller.started.is_set():
            raise HTTPException(status_code=503, detail="watches not synced yet")
        if (why := not_ready(bus)) is not None:
            raise HTTPException(status_code=503, detail=why)
        failing = [inf.name for inf in controller.informers() if not inf.healthy]
        if failing:
            raise HTTPException(status_code=503, detail=f"watches failing: {', '.join(failing)}")
        if not controller.leading():
            raise HTTPException(status_code=503, detail="a follower: another replica leads")
        return {"status": "ready"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        phases: dict[str, int] = {}
        for key in controller.jobs.store:
            phase = (controller.st(key).status or {}).get("phase", "Pending")
            phases[phase] = phases.get(phase, 0) + 1
        for phase in ("Pending", "WaitingForMin", "Running", "Suspended", "Failed", "Invalid"):
            metrics.jobs.labels(phase).set(phases.get(phase, 0))
        return Response(render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
