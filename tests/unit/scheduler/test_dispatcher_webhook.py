"""The admission webhook's answers: a queued workload is held at creation and loses the
annotations only the dispatcher writes; everything else passes unchanged; a body that is not
an AdmissionReview gets a problem response naming what is wrong."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from alnair.scheduler.dispatcher.metrics import DispatcherMetrics
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, ANN_RAN, LABEL_QUEUE
from alnair.scheduler.dispatcher.webhook import build_webhook_api, hold_patch, review, validation


def admission(kind: str, obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    group = {"Job": "batch", "ElasticJob": "alnair.io"}.get(kind, "")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "operation": operation,
            "namespace": "team-a",
            "object": obj,
        },
    }


def job(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "labels": labels or {}},
        "spec": {"template": {"spec": {"containers": []}}, **spec},
    }


def patched(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def test_a_queued_job_created_running_is_suspended() -> None:
    answer, outcome = review(admission("Job", job({LABEL_QUEUE: "lq"})))
    assert outcome == "held"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert answer["response"]["allowed"] is True
    assert patched(answer) == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_a_job_the_user_already_suspended_keeps_its_spec() -> None:
    answer, outcome = review(admission("Job", job({LABEL_QUEUE: "lq"}, suspend=True)))
    assert (outcome, "patch" in answer["response"]) == ("ignored", False)


def test_annotations_only_the_dispatcher_writes_are_dropped_at_creation() -> None:
    obj = job({LABEL_QUEUE: "lq"}, suspend=False)
    obj["metadata"]["annotations"] = {ANN_ADMITTED_TYPE: "A100", ANN_RAN: "99999", "x": "kept"}
    ops = patched(review(admission("Job", obj))[0])
    assert ops == [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {"op": "remove", "path": "/metadata/annotations/alnair.io~1admitted-gpu-model"},
        {"op": "remove", "path": "/metadata/annotations/alnair.io~1ran-s"},
    ]


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        ("Job", job()),  # no queue
        ("Job", job({LABEL_QUEUE: ""})),
        ("Job", job({LABEL_QUEUE: "lq"}, managedBy="alnair.io/multicluster")),  # the hub's
        ("ElasticJob", {"metadata": {"name": "e"}, "spec": {"minReplicas": 1}}),
        ("Pod", {"metadata": {"name": "p"}, "spec": {}}),
        ("Service", {"metadata": {"name": "s", "labels": {LABEL_QUEUE: "lq"}}, "spec": {}}),
    ],
)
def test_what_no_queue_holds_passes_unchanged(kind: str, obj: dict[str, Any]) -> None:
    assert hold_patch(kind, obj) == []
    answer, outcome = review(admission(kind, obj))
    assert outcome == "ignored" and "patch" not in answer["response"]


def test_an_elastic_job_naming_a_queue_in_its_spec_is_held() -> None:
    obj = {"metadata": {"name": "e"}, "spec": {"queue": "lq", "minReplicas": 1}}
    assert hold_patch("ElasticJob", obj) == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_updates_are_not_mutated() -> None:
    answer, outcome = review(admission("Job", job({LABEL_QUEUE: "lq"}), operation="UPDATE"))
    assert outcome == "ignored" and "patch" not in answer["response"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"{not json", "not an admission review"),
        (b'{"kind": "Pod"}', "body is not an AdmissionReview"),
        (b'{"kind": "AdmissionReview", "request": {}}', "no request.uid"),
        (b"[1, 2]", "body is not an AdmissionReview"),
    ],
)
async def test_a_body_that_is_not_a_review_gets_a_problem(body: bytes, detail: str) -> None:
    metrics = DispatcherMetrics(CollectorRegistry())
    transport = httpx.ASGITransport(app=build_webhook_api(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="https://webhook") as client:
        resp = await client.post("/mutate", content=body)
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/problem+json"
    assert detail in resp.json()["detail"]
    assert metrics.webhook_requests.labels("invalid")._value.get() == 1


async def test_the_endpoint_answers_reviews_and_counts_them() -> None:
    metrics = DispatcherMetrics(CollectorRegistry())
    transport = httpx.ASGITransport(app=build_webhook_api(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="https://webhook") as client:
        resp = await client.post("/mutate", json=admission("Job", job({LABEL_QUEUE: "lq"})))
    assert resp.status_code == 200
    assert patched(resp.json()) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    assert metrics.webhook_requests.labels("held")._value.get() == 1


def test_a_queued_pod_of_its_own_is_gated_and_one_a_controller_owns_is_not() -> None:
    pod = {"metadata": {"name": "p", "labels": {LABEL_QUEUE: "lq"}}, "spec": {"containers": []}}
    ops = patched(review(admission("Pod", pod))[0])
    assert ops == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "alnair.io/admission"}]}
    ]
    gated = {**pod, "spec": {"schedulingGates": [{"name": "other"}]}}
    assert hold_patch("Pod", gated) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "alnair.io/admission"}}
    ]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}
    owned = {**pod, "metadata": {**pod["metadata"], "ownerReferences": [owner]}}
    assert hold_patch("Pod", owned) == []


def test_a_validation_refuses_with_the_reason_and_passes_what_is_fine() -> None:
    def validate(obj: dict[str, Any]) -> str | None:
        return "bad flavor" if obj["metadata"]["name"] == "bad" else None

    body = admission("ClusterQueue", {"metadata": {"name": "bad"}, "spec": {}})
    answer, outcome = validation(body, validate)
    assert outcome == "refused" and answer["response"]["allowed"] is False
    assert answer["response"]["status"] == {
        "code": 422,
        "reason": "Invalid",
        "message": "bad flavor",
    }
    fine = admission("ClusterQueue", {"metadata": {"name": "ok"}, "spec": {}}, "UPDATE")
    answer, outcome = validation(fine, validate)
    assert (outcome, answer["response"]["allowed"]) == ("valid", True)
    gone = admission("ClusterQueue", {"metadata": {"name": "bad"}}, "DELETE")
    assert validation(gone, validate)[1] == "ignored"


def test_a_ray_job_kuberay_would_not_suspend_is_refused_at_creation() -> None:
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "r", "namespace": "ml", "labels": {"alnair.io/queue-name": "lq"}},
        "spec": {"entrypoint": "python t.py", "rayClusterSpec": {}},
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"kind": "RayJob"}, "operation": "CREATE", "object": job},
    }
    answer, outcome = review(body)
    assert outcome == "refused" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 422
    assert "spec.shutdownAfterJobFinishes" in answer["response"]["status"]["message"]
    job["spec"]["shutdownAfterJobFinishes"] = True
    answer, outcome = review(body)
    assert outcome == "held" and answer["response"]["allowed"] is True
    # Not queued (no label): none of the queue's business.
    del job["metadata"]["labels"]
    job["spec"]["shutdownAfterJobFinishes"] = False
    assert review(body)[1] == "ignored"
