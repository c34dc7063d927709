"""Execution records in Redis, written exactly once per job uid (the format is
`alnair.common.records`, shared with the predictor that learns from them).

A record is written exactly once per job uid, whoever tries and however often: the
aggregator may see a completion twice (a watch restarts, the aggregator restarts mid-job).
The check and both writes run in one Lua script, which Redis executes atomically, so there
is no window in which a crash leaves a guard without a record or a record without its
index entry.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from alnair.common.records import (
    RECORDS_INDEX,
    ExecutionRecord,
    decode_fields,
    record_key,
    text,
)

# KEYS[1] record hash, KEYS[2] index; ARGV[1] end_ts score, ARGV[2..] field/value pairs.
_WRITE_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
return 1
"""


class RecordStore:
    """Reads and writes execution records in Redis."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._write_once = client.register_script(_WRITE_ONCE)

    async def write_once(self, record: ExecutionRecord) -> bool:
        """Store the record unless one exists for this job uid; True when this call wrote it."""
        flat: list[str] = []
        for name, value in record.to_fields().items():
            flat += [name, value]
        written = await self._write_once(
            keys=[record.key, RECORDS_INDEX], args=[record.end_ts, *flat]
        )
        return bool(written)

    async def get(self, namespace: str, job_name: str, uid: str) -> ExecutionRecord | None:
        key = record_key(namespace, job_name, uid)
        fields = await self._redis.hgetall(key)
        return ExecutionRecord.from_fields(key, decode_fields(fields)) if fields else None

    async def find(self, namespace: str, job_name: str) -> list[ExecutionRecord]:
        """Records of every run of a job name (one per uid), oldest first."""
        prefix = record_key(namespace, job_name, "")
        keys = [text(k) for k in await self._redis.zrange(RECORDS_INDEX, 0, -1)]
        out = []
        for key in keys:
            if key.startswith(prefix):
                fields = await self._redis.hgetall(key)
                if fields:
                    out.append(ExecutionRecord.from_fields(key, decode_fields(fields)))
        return out

    async def query(
        self, model: str | None = None, gpu: str | None = None, limit: int = 1000
    ) -> list[ExecutionRecord]:
        """Most recent records first, filtered by model name and GPU model (exact match)."""
        keys = [text(k) for k in await self._redis.zrevrange(RECORDS_INDEX, 0, -1)]
        out: list[ExecutionRecord] = []
        for key in keys:
            fields = decode_fields(await self._redis.hgetall(key))
            if not fields:
                continue
            if model is not None and fields.get("model_name") != model:
                continue
            if gpu is not None and fields.get("gpu_model") != gpu:
                continue
            out.append(ExecutionRecord.from_fields(key, fields))
            if len(out) >= limit:
                break
        return out
