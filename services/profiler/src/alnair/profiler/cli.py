"""`alnair profiler ...`: run the agent or the aggregator, or read execution records.

alnair profiler run [agent|aggregator] [--backend sim|nvml]
alnair profiler records [--model M] [--gpu G] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from alnair.common.errors import AlnairError
from alnair.common.redisconn import redis_client
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.settings import ProfilerSettings


async def _records(
    settings: ProfilerSettings, model: str | None, gpu: str | None, limit: int
) -> int:
    client = redis_client(settings)
    try:
        found = await RecordStore(client).query(model=model, gpu=gpu, limit=limit)
    finally:
        await client.aclose()
    for record in found:
        print(json.dumps(record.model_dump(mode="json") | {"key": record.key}))
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="alnair profiler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the node agent or the aggregator")
    run.add_argument(
        "role",
        nargs="?",
        choices=["agent", "aggregator", "bus-auth"],
        help="default: ALNAIR_PROFILER_ROLE",
    )
    run.add_argument("--backend", choices=["nvml", "sim"], help="agent GPU backend")
    rec = sub.add_parser("records", help="print execution records as JSON lines, newest first")
    rec.add_argument("--model", help="only records of this model name")
    rec.add_argument("--gpu", help="only records on this GPU model")
    rec.add_argument("--limit", type=int, default=100)
    args = parser.parse_args(list(argv))
    updates: dict[str, Any] = {}
    if args.cmd == "run" and args.role:
        updates["role"] = args.role
    if args.cmd == "run" and args.backend:
        updates["backend"] = args.backend
    try:
        # validated with the command line's choices, so defaults that follow the role do
        settings = ProfilerSettings(**updates)
    except ValidationError as exc:
        print(f"alnair profiler: bad settings: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "records":
        try:
            return asyncio.run(_records(settings, args.model, args.gpu, args.limit))
        except RedisConnectionError as exc:
            print(
                f"alnair profiler: cannot reach Redis at {settings.redis_url}: {exc}",
                file=sys.stderr,
            )
            return 1
    from alnair.profiler.app import serve

    try:
        asyncio.run(serve(settings))
    except AlnairError as exc:
        # Configuration a person must fix (no NVIDIA driver, no node name): say it plainly.
        print(f"alnair profiler: {exc}", file=sys.stderr)
        return 2
    return 0
