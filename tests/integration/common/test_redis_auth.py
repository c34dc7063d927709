"""Redis ACL users against a real redis-server started with an ACL file (issue 16).

The aggregator writes execution records, the predictor reads them and writes its model store;
neither may touch the other's keys or run administrative commands, and a client without
credentials can run nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from alnair.common.errors import ConfigError
from alnair.common.redisauth import ADMIN_USER, SERVICE_USERS, acl_file
from alnair.dev.localstack import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RedisServer]:
    users = {name: secrets.token_urlsafe(16) for name in [*SERVICE_USERS, ADMIN_USER]}
    srv = RedisServer(tmp_path, users=users).start()
    yield srv
    srv.stop()


@pytest.fixture
async def clients(secured: RedisServer) -> AsyncIterator[dict[str, aioredis.Redis]]:
    out = {
        user: aioredis.from_url(secured.url, **secured.credentials(user))
        for user in [*SERVICE_USERS, ADMIN_USER]
    }
    out["anonymous"] = aioredis.from_url(secured.url)
    yield out
    for client in out.values():
        await client.aclose()


async def test_aggregator_writes_records_predictor_reads_them(
    clients: dict[str, aioredis.Redis],
) -> None:
    aggregator, predictor = clients["aggregator"], clients["predictor"]
    await aggregator.hset("alnair:record:ml/job/uid-1", mapping={"model_name": "VGG-16"})
    await aggregator.zadd("alnair:records", {"alnair:record:ml/job/uid-1": 1.0})
    assert await predictor.zrange("alnair:records", 0, -1) == [b"alnair:record:ml/job/uid-1"]
    assert await predictor.hget("alnair:record:ml/job/uid-1", "model_name") == b"VGG-16"
    # the predictor's model store, in a transaction as ModelStore.save writes it
    async with predictor.pipeline(transaction=True) as pipe:
        pipe.hset("alnair:predictor:model:1", mapping={"blob": b"x", "hmac": "00"})
        pipe.zadd("alnair:predictor:models", {"1": 1})
        await pipe.execute()
    assert await predictor.incr("alnair:predictor:model:seq") == 1


async def test_denied_commands(clients: dict[str, aioredis.Redis]) -> None:
    aggregator, predictor = clients["aggregator"], clients["predictor"]
    # the profiler cannot swap the serving model, nor read the signed blobs
    with pytest.raises(NoPermissionError, match="alnair:predictor:model:current|key"):
        await aggregator.set("alnair:predictor:model:current", "666")
    with pytest.raises(NoPermissionError):
        await aggregator.hgetall("alnair:predictor:model:1")
    # the predictor cannot forge the aggregator's working state
    with pytest.raises(NoPermissionError):
        await predictor.hset("alnair:pod:uid-1:stats", "gpu_util_pct:max", 1)
    # nobody but the operator runs administrative commands
    for client in (aggregator, predictor):
        with pytest.raises(NoPermissionError, match="flushall"):
            await client.flushall()
        with pytest.raises(NoPermissionError):
            await client.config_set("appendonly", "no")
        with pytest.raises(NoPermissionError):
            await client.keys("*")
    # no credentials: nothing at all
    with pytest.raises(
        (AuthenticationError, ResponseError), match="NOAUTH|Authentication|authenticated"
    ):
        await clients["anonymous"].get("alnair:records")
    await clients[ADMIN_USER].flushall()


async def test_wrong_password_is_refused(secured: RedisServer) -> None:
    client = aioredis.from_url(secured.url, username="predictor", password="guess")
    try:
        with pytest.raises(AuthenticationError):
            await client.ping()
    finally:
        await client.aclose()


def test_acl_file_names_bad_users() -> None:
    with pytest.raises(ConfigError, match="unknown Redis user 'mallory'"):
        acl_file({"mallory": "pw"})
    with pytest.raises(ConfigError, match="password empty or with spaces"):
        acl_file({"predictor": "two words"})
    seven = acl_file({"predictor": "pw"}, redis_major=7)
    assert "%R~alnair:record:*" in seven and "~alnair:predictor:*" in seven
    assert "user default off" in seven


async def test_aggregator_folds_samples_with_its_script(
    clients: dict[str, aioredis.Redis],
) -> None:
    from alnair.profiler.aggregator.store import _FOLD  # the script the aggregator really runs

    fold = clients["aggregator"].register_script(_FOLD)
    keys = [
        "alnair:pod:uid-1:stats",
        "alnair:owner:own-1:gpus",
        "alnair:done:own-1",
        "alnair:pod:uid-1:meta",
        "alnair:owner:own-1:pods",
        "alnair:owner:own-1:nodes",
        "alnair:owner:own-1:meta",
        "alnair:owner-by-name:ml/train",
    ]
    for ts in (1, 2):
        await fold(keys=keys, args=[ts, "GPU-0", 50, 1000, 40, 1.5, 2048, 600])
    stats = await clients["aggregator"].hgetall("alnair:pod:uid-1:stats")
    assert stats[b"gpu_util_pct:count"] == b"2"
    # a script runs under its caller's ACL: it cannot reach the predictor's keys either
    sneaky = clients["aggregator"].register_script(_FOLD)
    with pytest.raises(ResponseError, match="[Nn]o permissions|NOPERM|permission"):
        await sneaky(
            keys=["alnair:predictor:model:current", *keys[1:]], args=[3, "", 0, 0, 0, 0, 0, 600]
        )


async def test_a_secured_server_starts_from_a_relative_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `make demo` keeps its stack under ./out: the ACL file must not be resolved twice.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    srv = RedisServer(Path("rel"), users={"aggregator": "pwsecret"}).start()
    try:
        client = aioredis.from_url(srv.url, **srv.credentials("aggregator"))
        assert await client.ping()
        await client.aclose()
    finally:
        srv.stop()
