"""The one way tests wait for asynchronous work they observe from outside.

`wait_for` asks a probe until it gives a truthy answer and returns that answer. A probe may be
a plain function or a coroutine function, so the same helper serves a check of an informer's
cache, an API read and a shell command. When time runs out the test fails with an
AssertionError that says what it waited for and the last answer it had, not a bare timeout.

Checks that something did *not* happen do not sleep a fixed time and look: they wait for the
event that proves the system considered it (a FailedScheduling Event, later pods bound, a
decision logged) and then assert, so they are as fast as the system and never pass because
the machine was slow. `consumed` is that event for a bus consumer: every message stored before
the call has been delivered to it and acknowledged, so a duplicate it would act on has been
acted on.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from alnair.common.bus import Bus
from alnair.common.events import Event


async def wait_for(
    probe: Callable[[], Any],
    timeout_s: float = 30,
    interval_s: float = 0.1,
    *,
    what: str = "",
) -> Any:
    """The first truthy answer of `probe()` (awaited when it returns an awaitable), asked every
    `interval_s` for at most `timeout_s`."""
    last: Any = None
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            while True:
                last = probe()
                if inspect.isawaitable(last):
                    last = await last
                if last:
                    return last
                await asyncio.sleep(interval_s)
    except TimeoutError as exc:
        if not limit.expired():
            raise
        name = what or getattr(probe, "__qualname__", repr(probe))
        raise AssertionError(f"{name}: not within {timeout_s}s (last answer {last!r})") from exc


async def consumed(bus: Bus, event_type: type[Event], durable: str, timeout_s: float = 60) -> None:
    """Until the durable consumer `durable` of `event_type`'s stream has nothing left to
    deliver and nothing awaiting an acknowledgement (a redelivery after its ack wait included)."""
    stream = event_type.STREAM
    if stream is None:
        raise ValueError(f"{event_type.__name__} travels on core NATS: nothing is stored")

    async def caught_up() -> bool:
        info = await bus.js.consumer_info(stream, durable)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await wait_for(caught_up, timeout_s, 0.1, what=f"consumer {durable} of {stream} to catch up")
