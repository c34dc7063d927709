"""The one way a service connects to Redis: one server by URL, or the primary that Redis
Sentinel names, following a failover.

A failover takes a few seconds (the Sentinels' `down-after-milliseconds`, then the election
and the promotion). Meanwhile a command meets a closed connection, a refused one, or a demoted
primary answering READONLY; each is retried with a backoff (`RETRY_ATTEMPTS`), on a
connection to whatever primary the Sentinels name by then, so a service rides a failover
without a restart. Retrying is safe for what the services write: keyed sets and hashes, and
MULTI/EXEC blocks of them (run again, they leave the same state); the predictor's model
sequence number may skip one.
"""

from __future__ import annotations

from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from alnair.common.errors import ConfigError
from alnair.common.settings import CommonSettings

RETRY_ATTEMPTS = 12
"""With the backoff below (0.05 s doubling to 1 s), about 9 s of retries for a connection,
and as many for a command, each of whose tries may wait for a connection: a failover's
detection (the deploy's Sentinels: 5 s) and election fit inside it."""


class _FollowingConnection(SentinelManagedConnection):
    """A connection to whatever primary the Sentinels name at each connection attempt.
    redis-py 8's own reconnects after a lost connection (`send_packed_command`, and the
    retries inside `connect_check_health`) go straight to the address of the last primary,
    and so kept knocking on a dead one until the retries ran out."""

    async def _connect(self) -> None:
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super()._connect()  # type: ignore[no-untyped-call]


class _SentinelRedis(aioredis.Redis):
    """The client of a Sentinel-named primary: closing it closes its Sentinel connections."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


def _retry() -> Retry:
    return Retry(
        ExponentialBackoff(cap=1.0, base=0.05),
        RETRY_ATTEMPTS,
        supported_errors=(RedisConnectionError, RedisTimeoutError, ReadOnlyError),
    )


def sentinel_addresses(spec: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` as (host, port) pairs; a bad entry is a ConfigError."""
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"ALNAIR_REDIS_SENTINELS: {entry!r} is not host:port", sentinels=spec)
        out.append((host, int(port)))
    return out


def _database(url: str) -> int:
    path = urlparse(url).path.strip("/") or "0"
    if not path.isdigit():
        raise ConfigError(f"ALNAIR_REDIS_URL: database {path!r} is not a number", url=url)
    return int(path)


def redis_client(settings: CommonSettings) -> aioredis.Redis:
    """A client for the service's Redis, with its ACL user (`settings.redis_credentials`)."""
    creds = settings.redis_credentials()
    if not settings.redis_sentinels:
        return aioredis.from_url(settings.redis_url, retry=_retry(), **creds)
    password = settings.redis_sentinel_password
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinel_addresses(settings.redis_sentinels),
        sentinel_kwargs={
            "password": None if password is None else password.get_secret_value(),
            "socket_timeout": 2.0,
        },
        socket_timeout=5.0,
    )
    client: aioredis.Redis = sentinel.master_for(
        settings.redis_sentinel_master,
        db=_database(settings.redis_url),
        retry=_retry(),
        redis_class=_SentinelRedis,
        connection_class=_FollowingConnection,
        username=creds.get("username"),
        password=creds.get("password"),
    )
    return client
