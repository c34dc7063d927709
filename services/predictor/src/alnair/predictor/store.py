"""Model versions in Redis: every trained bundle kept, one of them current.

Layout (all keys under `alnair:predictor:`):
- `model:seq`: counter that hands out version numbers (INCR, so two replicas never collide);
- `model:<version>`: hash with `blob` (the pickled bundle), `sha256` of the blob and `meta`
  (JSON: kind, training size, validation, trained_at);
- `models`: sorted set of versions (score = version) for the history;
- `model:current`: the version that serves. Replicas and restarts load it, so a restarted
  predictor serves the validated model at once instead of retraining first.

The blob is a pickle: Redis is the predictor's own store, written only by the predictor, and
the digest check refuses a blob that was cut short or altered. Old versions beyond `keep` are
deleted when a new one is saved.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from typing import Any

import redis.asyncio as aioredis

from alnair.common.errors import PermanentError
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
    """A stored model blob whose digest does not match."""


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

    def __init__(self, redis: aioredis.Redis, keep: int = 10) -> None:
        self.redis = redis
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
                mapping={"blob": blob, "sha256": hashlib.sha256(blob).hexdigest(), "meta": meta},
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
        blob, digest = await self.redis.hmget(version_key(version), ["blob", "sha256"])
        if not isinstance(blob, bytes):
            return None
        expected = digest.decode() if isinstance(digest, bytes) else str(digest)
        if hashlib.sha256(blob).hexdigest() != expected:
            raise CorruptModelError("stored model blob fails its digest", version=version)
        # Trusted: written by this service into its own store, digest checked above.
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
