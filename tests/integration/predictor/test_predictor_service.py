"""The predictor service against real nats-server and redis-server.

Records written to Redis in the profiler's format plus a job-completed event on NATS must
lead to a new, validated model version that serves, while requests keep being answered (by
the old version) during the retrain; a restarted predictor serves the stored version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.events import JobEvent, JobPhase
from alnair.predictor.app import Running, start
from alnair.predictor.schemas import PredictReply, PredictRequest
from alnair.predictor.settings import PredictorSettings

pytestmark = pytest.mark.integration

NEW_MODEL = "vgg16"


def settings(nats_url: str, redis_url: str) -> PredictorSettings:
    return PredictorSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        http_host="127.0.0.1",
        http_port=0,
        retrain_debounce_s=0.3,
        retrain_max_wait_s=5.0,
        log_json=False,
        model_key="test-model-key-0123456789",  # the same key across restarts
    )


@pytest.fixture
async def predictor(nats_url: str, redis_url: str) -> AsyncIterator[Running]:
    running = await start(settings(nats_url, redis_url), CollectorRegistry())
    yield running
    await running.stop()


async def write_records(redis_url: str, count: int) -> None:
    """Execution records exactly as the profiler's aggregator writes them."""
    client = aioredis.from_url(redis_url)
    try:
        for i in range(count):
            key = f"alnair:record:ml/vgg-{i}/uid-{i}"
            gpu, gpus, steps_per_s = [("V100", 1, 6.0), ("P100", 1, 3.1), ("V100", 2, 11.0)][i % 3]
            start_ts, duration = 1000.0 + 100 * i, 600.0
            await client.hset(
                key,
                mapping={
                    "model_name": "VGG-16",
                    "batch_size": "64",
                    "data_size": "",
                    "epoch": "",
                    "gpu_model": f"Tesla {gpu}-PCIE-16GB",
                    "gpu_count": str(gpus),
                    "submit_ts": str(start_ts - 5),
                    "start_ts": str(start_ts),
                    "end_ts": str(start_ts + duration),
                    "duration_s": str(duration),
                    "steps": str(int(steps_per_s * duration)),
                    "throughput_steps_per_s": str(steps_per_s),
                    "peak_gpu_mem_mib": "9500",
                    "mean_gpu_util_pct": "91",
                    "outcome": "succeeded",
                },
            )
            await client.zadd("alnair:records", {key: start_ts + duration})
        # A failed job's record is skipped, not fatal.
        await client.hset("alnair:record:ml/bad/uid-x", mapping={"outcome": "failed"})
        await client.zadd("alnair:records", {"alnair:record:ml/bad/uid-x": 99999.0})
    finally:
        await client.aclose()


def vgg_request() -> dict[str, object]:
    return {
        "job": {"model_name": "VGG-16", "batch_size": 64, "total_steps": 6000},
        "gpu_types": ["V100"],
        "gpu_counts": [1],
    }


async def test_completion_retrains_and_new_version_serves(
    predictor: Running, nats_url: str, redis_url: str
) -> None:
    async with httpx.AsyncClient(base_url=predictor.url, timeout=30.0) as http:
        first = (await http.get("/v1/models")).json()
        assert first["version"] == 1
        assert first["training_size"]["records"] == 0
        before = PredictReply.model_validate(
            (await http.post("/v1/predict", json=vgg_request())).json()
        )
        assert before.known_model is False
        assert before.low_confidence is True

        await write_records(redis_url, 9)
        bus = await Bus.connect(nats_url, name="test-publisher")
        try:
            await bus.publish(
                JobEvent(
                    phase=JobPhase.COMPLETED, namespace="ml", kind="Job", name="vgg-8", uid="uid-8"
                ),
                source="test",
            )
            # Keep asking over both transports until the retrain has finished; every answer
            # must come back, and those given while training come from the old version.
            during: list[int] = []
            answered = 0
            retrainer = predictor.retrainer
            while retrainer.attempts < 1:
                training = retrainer.retraining
                reply = await http.post("/v1/predict", json=vgg_request())
                assert reply.status_code == 200
                over_nats = await bus.request(
                    "alnair.predict",
                    PredictRequest.model_validate(vgg_request()),
                    PredictReply,
                    10.0,
                )
                answered += 1
                if training and retrainer.retraining:
                    during += [reply.json()["model_version"], over_nats.model_version]
            assert during, "no request was answered while the model retrained"
            assert set(during) == {1}
            assert answered >= len(during) // 2
        finally:
            await bus.close()

        models = (await http.get("/v1/models")).json()
        assert models["version"] == 2
        assert models["training_size"]["records"] == 9
        assert models["last_evaluation"]["accepted"] == "true"
        assert [h["version"] for h in models["history"]] == [2, 1]

        after = PredictReply.model_validate(
            (await http.post("/v1/predict", json=vgg_request())).json()
        )
        assert after.model_version == 2
        assert after.known_model is True
        assert after.memory_basis == "records"
        (v100,) = after.predictions
        assert v100.basis == "measured"
        assert v100.throughput_steps_per_s == pytest.approx(6.0)
        assert v100.runtime_s == pytest.approx(1000.0)

        metrics = (await http.get("/metrics")).text
        assert 'alnair_predictor_retrains_total{result="promoted"} 1.0' in metrics
        assert 'alnair_predictor_records_skipped{field="outcome"} 1.0' in metrics


async def test_restart_serves_the_stored_version(nats_url: str, redis_url: str) -> None:
    first = await start(settings(nats_url, redis_url), CollectorRegistry())
    try:
        await write_records(redis_url, 3)
        await first.retrainer.retrain_once()
        version = first.retrainer.current.version if first.retrainer.current else None
        assert version == 2
    finally:
        await first.stop()
    second = await start(settings(nats_url, redis_url), CollectorRegistry())
    try:
        async with httpx.AsyncClient(base_url=second.url) as http:
            models = (await http.get("/v1/models")).json()
        assert models["version"] == 2
        assert models["training_size"]["records"] == 3
    finally:
        await second.stop()


async def test_nonsense_input_is_refused_naming_the_field(predictor: Running) -> None:
    async with httpx.AsyncClient(base_url=predictor.url) as http:
        bad_batch = await http.post(
            "/v1/predict", json={"job": {"model_name": "resnet50", "batch_size": -4}}
        )
        bad_gpu = await http.post(
            "/v1/predict", json={"job": {"model_name": "resnet50"}, "gpu_types": ["V100", "G9"]}
        )
        bad_pair = await http.post(
            "/v1/colocation",
            json={"job_a": {"model_name": "lm"}, "job_b": {"model_name": ""}, "gpu_type": "V100"},
        )
    for reply in (bad_batch, bad_gpu, bad_pair):
        assert reply.status_code == 422
        assert reply.headers["content-type"] == "application/problem+json"
    assert bad_batch.json()["invalid_params"][0]["name"] == "job.batch_size"
    assert bad_batch.json()["invalid_params"][0]["value"] == -4
    assert "job.batch_size" in bad_batch.json()["detail"]
    assert bad_gpu.json()["invalid_params"][0]["name"] == "gpu_types"
    assert "'G9'" in bad_gpu.json()["invalid_params"][0]["reason"]
    assert bad_pair.json()["invalid_params"][0]["name"] == "job_b.model_name"


async def test_colocation_and_unknown_models(predictor: Running, nats_url: str) -> None:
    async with httpx.AsyncClient(base_url=predictor.url) as http:
        pair = (
            await http.post(
                "/v1/colocation",
                json={
                    "job_a": {"model_name": "ResNet-18", "batch_size": 64},
                    "job_b": {"model_name": "Transformer", "batch_size": 32},
                    "gpu_type": "v100",
                },
            )
        ).json()
        unknown = (
            await http.post("/v1/predict", json={"job": {"model_name": "my-secret-net"}})
        ).json()
    assert pair["gpu_type"] == "V100"
    for side in ("job_a", "job_b"):
        assert pair[side]["slowdown"] >= 0.9
        assert pair[side]["slowdown_interval"]["low"] <= pair[side]["slowdown"]
        assert pair[side]["slowdown"] <= pair[side]["slowdown_interval"]["high"]
    assert pair["low_confidence"] is False
    assert unknown["low_confidence"] is True
    assert unknown["known_model"] is False
    assert len(unknown["predictions"]) == 7 * 4
    assert all(p["throughput_steps_per_s"] > 0 for p in unknown["predictions"])
    bus = await Bus.connect(nats_url, name="test-colocation")
    try:
        raw = await bus.nc.request(
            "alnair.predict", b'{"job": {"model_name": "x", "batch_size": 0}}', timeout=10.0
        )
    finally:
        await bus.close()
    assert b'"status": 400' in raw.data
    assert b"job.batch_size" in raw.data
