"""The model store never unpickles a blob it did not sign (issue 16).

Whoever can write Redis could otherwise make the predictor run code: a pickle's `__reduce__`
executes on load. Blobs carry an HMAC-SHA256 under the predictor's own key; an altered blob,
a blob re-signed with a checksum (the old scheme) or with another key, and a genuine blob
replayed under another version are all refused before deserialisation, and the service
trains a fresh model instead of crashing.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from alnair.predictor.app import start
from alnair.predictor.settings import PredictorSettings
from alnair.predictor.store import CURRENT_KEY, CorruptModelError, ModelStore, sign, version_key

pytestmark = pytest.mark.integration

KEY = b"predictor-signing-key-for-tests"


class _Exploit:
    """A pickle that creates `marker` when unpickled: proof that bytes were deserialised."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.marker), "pwned"))  # type: ignore[return-value]


def _settings(nats_url: str, redis_url: str, key: str) -> PredictorSettings:
    return PredictorSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        http_host="127.0.0.1",
        http_port=0,
        log_json=False,
        model_key=key,
    )


async def test_tampered_blobs_are_refused_unread(redis_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(_Exploit(marker))
    redis = aioredis.from_url(redis_url)
    store = ModelStore(redis, KEY)
    try:
        # 1. the attacker's pickle with a correct SHA-256 beside it (what used to be checked)
        await redis.hset(version_key(7), mapping={"blob": evil, "sha256": "0" * 64})
        # 2. signed, but with a key the predictor does not hold
        await redis.hset(version_key(8), mapping={"blob": evil, "hmac": sign(b"x" * 32, 8, evil)})
        # 3. a tag that is genuine for version 9, replayed under version 10
        await redis.hset(version_key(10), mapping={"blob": evil, "hmac": sign(KEY, 9, evil)})
        for version in (7, 8, 10):
            with pytest.raises(CorruptModelError, match="not signed by this predictor's key"):
                await store.load(version)
        assert not marker.exists()
        # the same bytes under a genuine tag would be loaded: the check is what refused them
        await redis.hset(version_key(9), mapping={"blob": evil, "hmac": sign(KEY, 9, evil)})
        with pytest.raises(CorruptModelError, match="not a model bundle"):
            await store.load(9)
        assert marker.read_text() == "pwned"
    finally:
        await redis.aclose()


async def test_short_key_is_a_config_error(redis_url: str) -> None:
    redis = aioredis.from_url(redis_url)
    try:
        with pytest.raises(Exception, match="model key too short"):
            ModelStore(redis, b"short")
    finally:
        await redis.aclose()


async def test_service_retrains_instead_of_loading_a_foreign_model(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    first = await start(_settings(nats_url, redis_url, KEY.decode()), CollectorRegistry())
    stored = first.retrainer.current.version if first.retrainer.current else None
    await first.stop()
    assert stored == 1
    marker = tmp_path / "unpickled"
    redis = aioredis.from_url(redis_url)
    try:
        # overwrite the current model's blob but keep its (now wrong) tag
        await redis.hset(version_key(1), "blob", pickle.dumps(_Exploit(marker)))
        second = await start(_settings(nats_url, redis_url, KEY.decode()), CollectorRegistry())
        try:
            current = second.retrainer.current
            assert current is not None and current.version == 2
            assert int(await redis.get(CURRENT_KEY) or 0) == 2
        finally:
            await second.stop()
        assert not marker.exists()
    finally:
        await redis.aclose()
