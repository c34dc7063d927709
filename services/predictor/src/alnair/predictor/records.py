"""Reading the profiler's execution records out of Redis.

The index `alnair:records` orders record keys by end time, so the newest records come last;
validation holds the newest out, which is the honest test of a model that will next be asked
about jobs that have not run yet. Records that cannot be learned from (failed jobs, unknown
GPUs, missing fields) are returned with the reason rather than raised, so one bad record never
stops a retrain.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from alnair.common.records import RECORDS_INDEX, decode_fields, text
from alnair.predictor.datasets import Observation, RecordProblem, parse_record


async def load_record(redis: aioredis.Redis, key: str) -> Observation | RecordProblem:
    """One record by key (the one a job-completed event names), or why it cannot be used."""
    raw = await redis.hgetall(key)
    if not raw:
        return RecordProblem(key, "key", "no record under this key")
    return parse_record(key, decode_fields(raw))


async def load_records(
    redis: aioredis.Redis, batch: int = 500
) -> tuple[list[Observation], list[RecordProblem]]:
    """Every record in end-time order, as observations, plus the ones that were skipped."""
    keys = [text(k) for k in await redis.zrange(RECORDS_INDEX, 0, -1)]
    observations: list[Observation] = []
    problems: list[RecordProblem] = []
    for start in range(0, len(keys), batch):
        chunk = keys[start : start + batch]
        async with redis.pipeline(transaction=False) as pipe:
            for key in chunk:
                pipe.hgetall(key)
            hashes = await pipe.execute()
        for key, raw in zip(chunk, hashes, strict=True):
            if not raw:
                problems.append(RecordProblem(key, "key", "indexed but the hash is missing"))
                continue
            parsed = parse_record(key, decode_fields(raw))
            if isinstance(parsed, RecordProblem):
                problems.append(parsed)
            else:
                observations.append(parsed)
    return observations, problems
