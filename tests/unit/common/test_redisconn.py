"""`alnair.common.redisconn`: how a service's Redis settings become a client (the failover
itself runs against real servers in tests/e2e/test_production_topology.py)."""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool

from alnair.common.errors import ConfigError
from alnair.common.redisconn import RETRY_ATTEMPTS, redis_client, sentinel_addresses
from alnair.common.settings import CommonSettings


def test_sentinel_addresses_are_parsed_and_a_bad_one_is_named() -> None:
    assert sentinel_addresses("a:26379, b.svc:1") == [("a", 26379), ("b.svc", 1)]
    for bad in ("a", "a:", ":1", "a:port", "a:70000"):
        with pytest.raises(ConfigError, match=repr(bad.strip())):
            sentinel_addresses(f"ok:1,{bad}")


async def test_a_url_gives_one_server_and_sentinels_give_the_primary_they_name() -> None:
    plain = redis_client(CommonSettings(redis_url="redis://r:6380/2"))
    kwargs = plain.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("r", 6380, 2)
    assert plain.get_retry() is not None and plain.get_retry().get_retries() == RETRY_ATTEMPTS
    await plain.aclose()
    named = redis_client(
        CommonSettings(
            redis_url="redis://ignored/3",
            redis_sentinels="s1:26379,s2:26379",
            redis_user="aggregator",
            redis_password="pw",
            redis_sentinel_password="spw",
        )
    )
    pool = named.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "alnair"
    assert pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["username"] == "aggregator"
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26379]
    assert all(s.connection_pool.connection_kwargs["password"] == "spw" for s in sentinels)
    await named.aclose()


def test_a_database_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ConfigError, match="'zero'"):
        redis_client(CommonSettings(redis_url="redis://x/zero", redis_sentinels="s:1"))
