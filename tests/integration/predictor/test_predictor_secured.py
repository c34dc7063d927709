"""The predictor runs as its own NATS and Redis users with nothing more (issue 16): against a
nats-server and a redis-server that admit only the service users, it starts (streams, buckets,
its consumer), stores its signed model, answers the dispatcher's request over NATS and
retrains on the aggregator's completion event.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from alnair.common.bus import Bus
from alnair.common.events import JobEvent, JobPhase
from alnair.common.natsauth import ADMIN_USER, SERVICE_PERMISSIONS
from alnair.common.redisauth import SERVICE_USERS
from alnair.dev.localstack import NatsServer, RedisServer
from alnair.predictor.app import start
from alnair.predictor.settings import PredictorSettings

pytestmark = pytest.mark.integration


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    users = {u: secrets.token_urlsafe(12) for u in [*SERVICE_PERMISSIONS, ADMIN_USER]}
    (tmp_path / "nats").mkdir()
    srv = NatsServer(tmp_path / "nats", users=users).start()
    yield srv
    srv.stop()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    srv = RedisServer(
        tmp_path / "redis", users={u: secrets.token_urlsafe(12) for u in SERVICE_USERS}
    ).start()
    yield srv
    srv.stop()


async def test_predictor_works_with_only_its_own_permissions(
    nats: NatsServer, redis: RedisServer
) -> None:
    settings = PredictorSettings(
        nats_url=nats.url,
        nats_user="predictor",
        nats_password=nats.users["predictor"],
        redis_url=redis.url,
        redis_user="predictor",
        redis_password=redis.users["predictor"],
        model_key="a-key-of-at-least-sixteen-bytes",
        http_host="127.0.0.1",
        http_port=0,
        retrain_debounce_s=0.1,
        log_json=False,
    )
    running = await start(settings, CollectorRegistry())
    dispatcher = await Bus.connect(
        nats.url, name="dispatcher", credentials=nats.credentials("dispatcher")
    )
    aggregator = await Bus.connect(
        nats.url, name="aggregator", credentials=nats.credentials("aggregator")
    )
    try:
        request = {"job": {"model_name": "ResNet-50", "batch_size": 64}, "gpu_types": ["V100"]}
        reply = await dispatcher.nc.request("alnair.predict", json.dumps(request).encode(), 10)
        answer = json.loads(reply.data)
        assert "error" not in answer, answer
        assert answer["predictions"]
        before = running.retrainer.attempts
        done = JobEvent(phase=JobPhase.COMPLETED, namespace="ml", kind="Job", name="j", uid="uid-1")
        await aggregator.publish(done, source="aggregator")
        await running.retrainer.wait_for_attempts(before + 1, timeout_s=60)
    finally:
        await dispatcher.close()
        await aggregator.close()
        await running.stop()
