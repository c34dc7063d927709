"""HTTP API of the predictor.

- `POST /v1/predict`: job features -> per GPU type and count: throughput, runtime, interval,
  peak memory.
- `POST /v1/colocation`: two jobs and one GPU type -> both slowdowns.
- `GET /v1/models`: serving version, training size, last validation, kept history.
- `GET /healthz`, `GET /readyz` (ready once a model serves), `GET /metrics`.

Bad input is refused by the request models (`schemas`) with a 422 problem response
(`application/problem+json`) whose `detail` and `invalid_params` name each bad field.
Requests are answered from the retrainer's current snapshot, so they keep being answered while
a new model trains.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Response

from alnair.common.bus import Bus, not_ready
from alnair.common.http import install_problem_handlers
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.predictor.metrics import PredictorMetrics
from alnair.predictor.predictor import ModelBundle, colocation, predict
from alnair.predictor.retraining import Retrainer
from alnair.predictor.schemas import (
    ColocationReply,
    ColocationRequest,
    ModelInfoReply,
    PredictReply,
    PredictRequest,
)
from alnair.predictor.store import ModelStore


def create_app(
    retrainer: Retrainer, store: ModelStore, metrics: PredictorMetrics, bus: Bus | None = None
) -> FastAPI:
    app = FastAPI(title="Alnair predictor", version="1")
    install_problem_handlers(app)

    def serving() -> ModelBundle:
        bundle = retrainer.current
        if bundle is None:
            raise HTTPException(status_code=503, detail="no model trained yet")
        return bundle

    @app.post("/v1/predict")
    async def post_predict(request: PredictRequest) -> PredictReply:
        reply = predict(serving(), request)
        metrics.requests.labels("predict", "http", "ok").inc()
        if reply.low_confidence:
            metrics.low_confidence.labels("predict").inc()
        return reply

    @app.post("/v1/colocation")
    async def post_colocation(request: ColocationRequest) -> ColocationReply:
        reply = colocation(serving(), request)
        metrics.requests.labels("colocation", "http", "ok").inc()
        if reply.low_confidence:
            metrics.low_confidence.labels("colocation").inc()
        return reply

    @app.get("/v1/models")
    async def get_models() -> ModelInfoReply:
        bundle = serving()
        history: list[dict[str, Any]] = await store.history()
        last = retrainer.last_validation or bundle.validation
        return ModelInfoReply(
            version=bundle.version,
            kind=bundle.kind,
            trained_at=bundle.trained_at,
            training_size=bundle.training_size,
            interval_level=bundle.level,
            halfwidths=bundle.halfwidths(),
            last_evaluation={} if last is None else last.as_dict(),
            retraining=retrainer.retraining,
            history=[
                {
                    "version": h.get("version"),
                    "kind": h.get("kind"),
                    "trained_at": h.get("trained_at"),
                    "records": (h.get("training_size") or {}).get("records"),
                }
                for h in history
            ],
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        if (why := not_ready(bus)) is not None:
            raise HTTPException(status_code=503, detail=why)
        bundle = serving()
        return {"status": "ready", "version": bundle.version}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
