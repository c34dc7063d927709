"""A real redis-server started by the fixture: the round trip the profiler and predictor use."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from alnair.dev.localstack import RedisServer

pytestmark = pytest.mark.integration


async def test_redis_round_trip_survives_restart(redis_server: RedisServer) -> None:
    client = aioredis.from_url(redis_server.url, decode_responses=True)
    await client.hset(
        "alnair:record:ns/job/uid", mapping={"gpu_model": "V100M32", "gpu_count": "4"}
    )
    await client.zadd("alnair:records", {"alnair:record:ns/job/uid": 1700000000})
    assert await client.hgetall("alnair:record:ns/job/uid") == {
        "gpu_model": "V100M32",
        "gpu_count": "4",
    }
    await client.aclose()

    redis_server.stop()
    redis_server.start()  # append-only file: the data is still there
    client = aioredis.from_url(redis_server.url, decode_responses=True)
    assert await client.zrange("alnair:records", 0, -1) == ["alnair:record:ns/job/uid"]
    await client.aclose()
