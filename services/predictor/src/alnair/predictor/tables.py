"""Publishing the co-location table (`alnair.common.colocation`) for the binder and dispatcher.

Each model that starts serving (the first, a retrained one, one that absorbed a measurement)
gets its table computed in a worker thread and written to key `table` of the `alnair-colocation`
KV bucket, where the scheduler and dispatcher watch it. A reconnect writes it again (a server
that lost its store lost the table too). A failed write is retried with a backoff until it
lands or a newer model replaces the one being published.
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import nats.js.errors

from alnair.common import colocation
from alnair.common.bus import Bus
from alnair.common.retry import retrying
from alnair.predictor.metrics import PredictorMetrics
from alnair.predictor.predictor import colocation_table
from alnair.predictor.retraining import Retrainer

log = logging.getLogger(__name__)


async def publish_tables(bus: Bus, retrainer: Retrainer, metrics: PredictorMetrics) -> None:
    """Run until cancelled: publish the table of every model that starts serving."""

    async def again() -> None:
        retrainer.installed.set()

    bus.on_reconnect(again)
    while True:
        await retrainer.installed.wait()
        retrainer.installed.clear()
        bundle = retrainer.current
        if bundle is None:
            continue
        table = await asyncio.to_thread(colocation_table, bundle)
        payload = table.encode()
        async for attempt in retrying(
            "co-location table publish",
            on=(nats.errors.Error, nats.js.errors.Error, TimeoutError),
            wait_initial_s=0.5,
            wait_max_s=5.0,
            extra={"model_version": bundle.version},
        ):
            with attempt:
                kv = await bus.kv(colocation.BUCKET)
                await kv.put(colocation.KEY, payload)
        metrics.colocation_table_version.set(bundle.version)
        log.info(
            "co-location table published",
            extra={
                "model_version": bundle.version,
                "workloads": len(table.jobs),
                "bytes": len(payload),
            },
        )
