"""The dispatcher's reading of queues, Jobs and predictor answers: bad input is named."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.scheduler.dispatcher.parsing import (
    ANN_SELECTED_TYPE,
    gpu_model_constraint,
    gpu_request,
    parse_cluster_queue,
    parse_workload,
)
from alnair.scheduler.dispatcher.predictions import (
    PredictionError,
    PredictorClient,
    canonical_match,
    to_prediction,
)


def cq(cohort: str | None = "pool", **resource: Any) -> dict[str, Any]:
    res = {"name": r.GPU, "nominalQuota": 4, **resource}
    spec: dict[str, Any] = {
        "resourceGroups": [{"coveredResources": [r.GPU], "flavors": [
            {"name": "V100M32", "resources": [res]}]}],
        "fairSharing": {"weight": 2},
    }  # fmt: skip
    if cohort:
        spec["cohort"] = cohort
    return {"metadata": {"name": "team-a"}, "spec": spec}


def job(gpus: int | None = 2, **extra: Any) -> dict[str, Any]:
    limits = {} if gpus is None else {r.GPU: str(gpus)}
    return {
        "metadata": {"name": "j", "namespace": "ml", "annotations": extra.pop("annotations", {})},
        "spec": {
            "parallelism": extra.pop("parallelism", 1),
            "suspend": True,
            "template": {"spec": {"nodeSelector": extra.pop("node_selector", {}),
                                  "containers": [{"resources": {"limits": limits}}]}},
        },
    }  # fmt: skip


def test_a_cluster_queue_reads_as_quota_per_gpu_model() -> None:
    spec = parse_cluster_queue(cq(borrowingLimit=2, lendingLimit=1), {"pool"})
    quota = spec.quota["V100M32"]
    assert (quota.nominal, quota.borrowing_limit, quota.lending_limit) == (4, 2, 1)
    assert spec.cohort == "pool" and spec.weight == 2.0


@pytest.mark.parametrize(
    ("obj", "cohorts", "field"),
    [
        (cq(), set(), "spec.cohort"),
        (cq(nominalQuota=-1), {"pool"}, "nominalQuota"),
        (cq(lendingLimit=9), {"pool"}, "lendingLimit"),
        (cq(cohort=None, borrowingLimit=1), set(), "borrowingLimit"),
        (cq(name="cpu"), {"pool"}, "resources[0].name"),
    ],
)
def test_a_bad_cluster_queue_names_the_field(obj: Any, cohorts: set[str], field: str) -> None:
    with pytest.raises(InvalidValueError) as exc:
        parse_cluster_queue(obj, cohorts)
    assert field in exc.value.field


def test_gpu_requests_count_every_parallel_pod() -> None:
    assert gpu_request(job(2, parallelism=3)).gpus == 6
    frac = job(None)
    frac["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {r.GPU_MEMORY: "4096"}
    }
    request = gpu_request(frac)
    assert (request.gpus, request.memory_mib_per_pod) == (1, 4096)
    resources = frac["spec"]["template"]["spec"]["containers"][0]["resources"]
    resources["limits"] = {r.GPU_MEMORY_GIB: "10"}  # the name carries the unit
    assert gpu_request(frac).memory_mib_per_pod == 10 * 1024
    resources["limits"] = {r.GPU_MEMORY_GIB: "10", r.GPU_MEMORY: "512"}
    with pytest.raises(InvalidValueError, match="one unit"):
        gpu_request(frac)
    with pytest.raises(InvalidValueError, match=r.GPU):
        gpu_request(job(None))
    with pytest.raises(InvalidValueError, match="parallelism"):
        gpu_request(job(2, parallelism=0))


def test_our_own_node_selector_is_not_read_as_the_users_constraint() -> None:
    assert gpu_model_constraint(job(node_selector={r.LABEL_GPU_MODEL: "T4"})) == "T4"
    ours = job(node_selector={r.LABEL_GPU_MODEL: "T4"}, annotations={ANN_SELECTED_TYPE: "T4"})
    assert gpu_model_constraint(ours) is None


def test_seed_annotations_are_the_prediction_features() -> None:
    wl = parse_workload(
        job(annotations={"model_name": "resnet50", "epoch": "2", "alnair.io/restart-cost-s": "30"}),
        60.0,
    )
    assert wl.features == {"model_name": "resnet50", "epoch": "2"}
    assert wl.restart_cost_s == 30.0
    with pytest.raises(InvalidValueError, match="restart-cost"):
        parse_workload(job(annotations={"alnair.io/restart-cost-s": "soon"}), 60.0)


def reply(**prediction: Any) -> dict[str, Any]:
    p = {"gpu_type": "V100", "gpu_count": 2, "runtime_s": 100.0,
         "runtime_interval_s": {"low": 80.0, "high": 130.0}, "peak_gpu_mem_mib": 9000.0,
         "low_confidence": False, **prediction}  # fmt: skip
    return {"model_version": 3, "low_confidence": False, "predictions": [p]}


def test_a_predictor_answer_maps_onto_node_gpu_models() -> None:
    got = to_prediction(reply(), 2, ["V100M32", "T4"])
    assert got.runtime["V100M32"].expected_s == 100.0
    assert got.runtime["V100M32"].upper_s == 130.0
    assert "T4" not in got.runtime
    assert got.peak_memory_mib == 9000.0
    assert canonical_match("A100-SXM4-80GB", ["A10", "A100"]) == "A100"


@pytest.mark.parametrize(
    "bad",
    [
        {"predictions": "nope", "model_version": 1, "low_confidence": False},
        reply(runtime_s=float("nan")),
        reply(runtime_s=-5.0),
        reply(peak_gpu_mem_mib=-1.0),
        reply(gpu_type="Z9"),
        ["not", "an", "object"],
    ],
)
def test_malformed_predictor_answers_never_admit(bad: Any) -> None:
    with pytest.raises(PredictionError):
        to_prediction(bad, 2, ["V100M32"])


@pytest.mark.parametrize(
    ("raw", "ran"), [(None, 0.0), ("3600", 3600.0), ("soon", 0.0), ("-5", 0.0), ("inf", 0.0)]
)
def test_the_time_a_preempted_job_ran_is_read_from_its_annotation(
    raw: str | None, ran: float
) -> None:
    """`alnair.io/ran-s` (written at each preemption) is what the policy subtracts to age a job
    by the time it waited; an edited, unreadable or negative value counts as nothing run."""
    from alnair.scheduler.dispatcher.parsing import ANN_RAN
    from alnair.scheduler.dispatcher.writing import ran_s

    annotations = {} if raw is None else {ANN_RAN: raw}
    assert ran_s(parse_workload(job(annotations=annotations), 60.0)) == ran


class _Predictor:
    """The predictor's side of `alnair.predict` as a NATS client sees it: counts requests,
    answers after `delay_s` with `answer` (or times out)."""

    def __init__(self, answer: dict[str, Any] | None, delay_s: float = 0.05) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.requests = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.nc = self

    async def request(self, _subject: str, _data: bytes, **_kw: float) -> Any:
        self.requests += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.answer is None:
                raise TimeoutError
            return SimpleNamespace(data=json.dumps(self.answer).encode())
        finally:
            self.in_flight -= 1


FEATURES = [{"model_name": f"m{i % 3}"} for i in range(300)]
"""A reconcile's waiting workloads: 300 of them, three distinct models."""


async def test_a_reconcile_asks_once_per_distinct_job_and_never_floods_the_predictor() -> None:
    bus = _Predictor(reply(low_confidence=True) | {"low_confidence": True})
    now = [0.0]
    client = PredictorClient(cast(Any, bus), "alnair.predict", 5.0, max_in_flight=2,
                             low_confidence_s=5.0, clock=lambda: now[0])  # fmt: skip
    many = [client.predict(f, 2, ["V100M32"]) for f in FEATURES]
    answers = await asyncio.gather(*many)
    assert bus.requests == 3 and bus.most_in_flight <= 2
    assert all(a.low_confidence for a in answers)
    # A low-confidence answer is reused for a while, then asked again.
    await asyncio.gather(*(client.predict(f, 2, ["V100M32"]) for f in FEATURES))
    assert bus.requests == 3
    now[0] = 6.0
    await client.predict(FEATURES[0], 2, ["V100M32"])
    assert bus.requests == 4


async def test_every_workload_waiting_on_a_request_gets_its_failure() -> None:
    bus = _Predictor(None)
    client = PredictorClient(cast(Any, bus), "alnair.predict", 5.0)
    results = await asyncio.gather(
        *(client.predict(f, 2, ["V100M32"]) for f in FEATURES[:30]), return_exceptions=True
    )
    assert bus.requests == 3
    assert all(isinstance(x, PredictionError) and "did not answer" in str(x) for x in results)
    # Nothing is remembered from a failure: the next reconcile asks again.
    with pytest.raises(PredictionError):
        await client.predict(FEATURES[0], 2, ["V100M32"])
    assert bus.requests == 4
