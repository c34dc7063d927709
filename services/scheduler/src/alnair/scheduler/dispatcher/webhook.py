"""The dispatcher's admission webhook: every queue-labelled workload is held at creation.

Kueue's users never write `suspend: true`; its webhook suspends a queue-labelled Job as the API
server stores it. This one does the same for what the dispatcher queues (batch/v1 Jobs with
`alnair.io/queue-name`, ElasticJobs naming a queue), so a workload created running never starts
outside its queue's quota. At creation it also drops the annotations only the dispatcher
writes (the admitted GPU model, its time, borrowing, preemptions, run time): a user who wrote
them would otherwise be read as admitted, or credited with waiting it never did.

It answers `AdmissionReview` (admission.k8s.io/v1) at `POST /mutate` over TLS (`tls.py`: the
certificate follows its mounted Secret). A body that is not an AdmissionReview gets a problem
response, and the API server applies the webhook's `failurePolicy`; an object this webhook does
not handle is allowed unchanged. `deploy/kustomize/base/dispatcher/webhook.yaml` registers it;
docs/admission.md says why each `failurePolicy` is what it is.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from alnair.common.http import install_problem_handlers, problem
from alnair.common.progress import ANN_PREEMPTIONS
from alnair.scheduler.dispatcher.kinds import KINDS, member_pod
from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_AT,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    ANN_PODS_READY_AT,
    ANN_QUEUE_STATE,
    ANN_RAN,
    ANN_REQUEUE_AT,
    ANN_SELECTED_TYPE,
)

log = logging.getLogger(__name__)

ADMISSION_API = "admission.k8s.io/v1"
Validate = Callable[[dict[str, Any]], str | None]
"""An object's problem in words, or None when it is valid."""
DISPATCHER_OWNED = (
    ANN_ADMITTED_TYPE,
    ANN_ADMITTED_AT,
    ANN_BORROWING,
    ANN_PREEMPTIONS,
    ANN_RAN,
    ANN_SELECTED_TYPE,
    ANN_QUEUE_STATE,
    ANN_PODS_READY_AT,
    ANN_REQUEUE_AT,
)
"""Annotations only the dispatcher writes: a workload is never created with them."""


class ReviewError(ValueError):
    """The request body is not an AdmissionReview this webhook can answer."""


def _pointer(key: str) -> str:
    """A map key as a JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def refusal(kind: str, obj: dict[str, Any]) -> str | None:
    """Why a newly created queued workload cannot be held (its adapter's `refuse`), if so."""
    adapter = KINDS.get(kind)
    if adapter is None or adapter.refuse is None or not adapter.queued(obj):
        return None
    return adapter.refuse(obj)


def hold_patch(kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch that holds a newly created workload for its queue ([] if not queued):
    what the dispatcher queues (`kinds.py`) is what this holds."""
    adapter = KINDS.get(kind)
    if adapter is None:
        return []
    # A pod of a serving workload (its template carries alnair.io/workload) or of a queued
    # PodGroup is gated too, until the dispatcher admits the whole workload.
    if not adapter.queued(obj) and not (kind == "Pod" and member_pod(obj)):
        return []
    ops = adapter.hold(obj)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    ops.extend(
        {"op": "remove", "path": f"/metadata/annotations/{_pointer(key)}"}
        for key in DISPATCHER_OWNED
        if key in annotations
    )
    return ops


def _request(body: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the request, the answer, its response) of an AdmissionReview body; raises ReviewError."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise ReviewError("body is not an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise ReviewError("AdmissionReview has no request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    answer = {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}
    return request, answer, response


def validation(body: Any, validate: Validate) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answering a validation request: refused (422, the reason named)
    when `validate` finds the object wrong."""
    request, answer, response = _request(body)
    obj = request.get("object")
    if request.get("operation") not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
        return answer, "ignored"
    problem_text = validate(obj)
    if problem_text is None:
        return answer, "valid"
    response["allowed"] = False
    response["status"] = {"code": 422, "reason": "Invalid", "message": problem_text}
    return answer, "refused"


def review(body: Any) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answering `body`, and what was done (for the metric)."""
    request, answer, response = _request(body)
    kind = (request.get("kind") or {}).get("kind", "")
    obj = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(obj, dict):
        return answer, "ignored"
    problem_text = refusal(kind, obj)
    if problem_text is not None:
        response["allowed"] = False
        response["status"] = {"code": 422, "reason": "Invalid", "message": problem_text}
        return answer, "refused"
    ops = hold_patch(kind, obj)
    if not ops:
        return answer, "ignored"
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    meta = obj.get("metadata") or {}
    log.info(
        "held for its queue at creation",
        extra={"kind": kind, "namespace": request.get("namespace"),
               "object": meta.get("name") or meta.get("generateName")},
    )  # fmt: skip
    return answer, "held"


def build_webhook_api(metrics: DispatcherMetrics, validate: Validate | None = None) -> FastAPI:
    """`POST /mutate` holds queued workloads; `POST /validate` (with `validate`) refuses queue
    objects the CRD schema cannot catch."""
    app = FastAPI(title="alnair-dispatcher-webhook", version="0.1.0", docs_url=None)
    install_problem_handlers(app)

    async def answer(
        req: Request, decide: Callable[[Any], tuple[dict[str, Any], str]]
    ) -> dict[str, Any] | JSONResponse:
        try:
            body = json.loads(await req.body())
            reply, outcome = decide(body)
        except ValueError as exc:  # not JSON, or a ReviewError
            metrics.webhook_requests.labels("invalid").inc()
            return problem(400, "Bad Request", f"not an admission review: {exc}")
        metrics.webhook_requests.labels(outcome).inc()
        return reply

    @app.post("/mutate", response_model=None)
    async def mutate(req: Request) -> dict[str, Any] | JSONResponse:
        return await answer(req, review)

    if validate is not None:
        check = validate

        @app.post("/validate", response_model=None)
        async def validate_queue(req: Request) -> dict[str, Any] | JSONResponse:
            return await answer(req, lambda body: validation(body, check))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
