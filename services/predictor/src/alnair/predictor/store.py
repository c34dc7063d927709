"""Model versions in Redis: every trained bundle kept, one of them current.

Layout (all keys under `alnair:predictor:`):
- `model:seq`: counter that hands out version numbers (INCR, so two replicas never collide);
- `model:<version>`: hash with `blob` (the pickled bundle), `hmac` (HMAC-SHA256 of the
  version and the blob, keyed by the predictor's model key) and `meta` (JSON: kind, training
  size, validation, trained_at);
- `models`: sorted set of versions (score = version) for the history;
- `model:current`: the version that serves. Replicas and restarts load it, so a restarted
  predictor serves the validated model at once instead of retraining first.

The blob is a pickle, and unpickling runs code: whoever can write Redis must not be able to
choose what the predictor unpickles. So every blob is signed with HMAC-SHA256 under a key only
the predictor holds (`ALNAIR_PREDICTOR_MODEL_KEY`, a Secret in deploy), and the tag is checked
in constant time before a single byte is deserialised. A checksum stored beside the blob would
not do: whoever rewrites the blob rewrites the checksum too. The version is signed with the
blob, so an old, genuinely signed blob cannot be replayed under a newer version. Old versions
beyond `keep` are deleted when a new one is saved.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
from typing import Any

import redis.asyncio as aioredis

from alnair.common.errors import ConfigError, PermanentError
from alnair.predictor.predictor import ModelBundle

PREFIX = "alnair:predictor:"
SEQ_KEY = PREFIX + "model:seq"
CURRENT_KEY = PREFIX + "model:current"
INDEX_KEY = PREFIX + "models"


def version_key(version: int) -> str:
    return f"{PREFIX}model:{version}"


def _int(raw: object) -> int:
    return int(raw.decode() if isinstance(raw, bytes) else str(raw))


class CorruptModelError(PermanentError):
    """A stored model blob that is not signed by this predictor's key (altered, or foreign)."""


def sign(key: bytes, version: int, blob: bytes) -> str:
    """The HMAC-SHA256 tag of `blob` stored as `version`, hex."""
    mac = hmac.new(key, f"{version}\n".encode(), hashlib.sha256)
    mac.update(blob)
    return mac.hexdigest()


def bundle_meta(bundle: ModelBundle) -> dict[str, Any]:
    """The JSON-safe description of a bundle kept beside its blob."""
    return {
        "version": bundle.version,
        "kind": bundle.kind,
        "interval_level": bundle.level,
        "trained_at": bundle.trained_at,
        "training_size": bundle.training_size,
        "halfwidths": bundle.halfwidths(),
        "validation": None if bundle.validation is None else bundle.validation.as_dict(),
    }


class ModelStore:
    """Saves, promotes and loads model bundles."""

    def __init__(self, redis: aioredis.Redis, key: bytes, keep: int = 10) -> None:
        if len(key) < 16:
            raise ConfigError("model key too short: it needs at least 16 bytes", length=len(key))
        self.redis = redis
        self._key = key
        self.keep = keep

    async def next_version(self) -> int:
        return int(await self.redis.incr(SEQ_KEY))

    async def save(self, bundle: ModelBundle) -> None:
        """Store `bundle` under its version (not yet current)."""
        blob = pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
        meta = json.dumps(bundle_meta(bundle))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                version_key(bundle.version),
                mapping={"blob": blob, "hmac": sign(self._key, bundle.version, blob), "meta": meta},
            )
            pipe.zadd(INDEX_KEY, {str(bundle.version): bundle.version})
            await pipe.execute()
        await self._trim()

    async def promote(self, version: int) -> None:
        await self.redis.set(CURRENT_KEY, str(version))

    async def current_version(self) -> int | None:
        raw = await self.redis.get(CURRENT_KEY)
        return None if raw is None else int(raw)

    async def load(self, version: int) -> ModelBundle | None:
        blob, tag = await self.redis.hmget(version_key(version), ["blob", "hmac"])
        if not isinstance(blob, bytes):
            return None
        if not isinstance(tag, bytes) or not hmac.compare_digest(
            sign(self._key, version, blob).encode(), tag
        ):
            raise CorruptModelError(
                "stored model blob is not signed by this predictor's key: refused unread",
                version=version,
            )
        # Trusted: the tag proves the predictor itself wrote these bytes under this version.
        bundle = pickle.loads(blob)  # noqa: S301
        if not isinstance(bundle, ModelBundle):
            raise CorruptModelError("stored blob is not a model bundle", version=version)
        return bundle

    async def load_current(self) -> ModelBundle | None:
        version = await self.current_version()
        return None if version is None else await self.load(version)

    async def history(self) -> list[dict[str, Any]]:
        """Metadata of the kept versions, newest first."""
        versions = await self.redis.zrevrange(INDEX_KEY, 0, -1)
        out = []
        for raw in versions:
            meta = await self.redis.hget(version_key(_int(raw)), "meta")
            if meta is not None:
                out.append(json.loads(meta))
        return out

    async def _trim(self) -> None:
        current = await self.current_version()
        old = await self.redis.zrange(INDEX_KEY, 0, -(self.keep + 1))
        for raw in old:
            version = _int(raw)
            if version == current:
                continue
            await self.redis.delete(version_key(version))
            await self.redis.zrem(INDEX_KEY, str(version))
