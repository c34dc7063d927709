"""Following the predictor's co-location table (`alnair.common.colocation`) on the bus.

The binder and the dispatcher both watch key `table` of the `alnair-colocation` KV bucket; each
new model the predictor serves rewrites it. A table that does not parse is logged and ignored:
the one in force stays. A deleted key (a purged bucket) takes the table away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from alnair.common import colocation
from alnair.common.bus import Bus
from alnair.common.colocation import ColocationTable
from alnair.common.errors import InvalidValueError

log = logging.getLogger(__name__)


async def follow_table(bus: Bus, apply: Callable[[ColocationTable | None], None]) -> None:
    """Call `apply` with every table published, until cancelled."""
    kv = await bus.kv(colocation.BUCKET)
    watcher = await kv.watch(colocation.KEY)
    try:
        async for entry in watcher:
            if entry is None:
                continue  # the end-of-history marker
            if not entry.value:
                apply(None)
                continue
            try:
                table = ColocationTable.decode(entry.value)
            except InvalidValueError as exc:
                log.error("co-location table refused", extra={"error": str(exc)})
                continue
            log.info(
                "co-location table",
                extra={"model_version": table.model_version, "workloads": len(table.jobs)},
            )
            apply(table)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
