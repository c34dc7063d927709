"""Every asyncio task of a service starts here, named, referenced and with its end logged.

A background task that dies silently is the worst kind of outage: the service looks alive and
does nothing. `spawn` starts a long-lived task: it names it, logs its exit (normal, cancelled,
or with the traceback), keeps a strong reference so the event loop cannot garbage-collect it,
and can call `on_death` so the owner may stop the service (crash-only) instead of running
half-broken. A guarded task (one with `on_death`) that returns is a death too, unless its owner
says a return is its end (`ends`): a watch loop that fell out of its `async for` has stopped
watching as surely as one that raised. `in_flight` starts a short one (a binding, a write,
one message) in its owner's set, so the owner can wait for what is in flight at stop, and logs
a failure by name.
`tests/unit/common/test_task_starts.py` fails on a task started any other way.

`within` bounds an await in time. It replaces `asyncio.wait_for`, which on Python 3.11 loses
a cancellation that arrives as the awaited work completes: the caller goes on as if never
cancelled. A leader elector renewing in a loop did exactly that, so a stopped service kept its
Lease for ever and its stop never returned (ruff bans `asyncio.wait_for`; see
`tests/unit/common/test_tasks.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

_running: set[asyncio.Task[Any]] = set()


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """`await aw`, raising TimeoutError after `timeout_s` (None: no limit). A cancellation of
    the caller always propagates, even one that arrives as `aw` completes."""
    async with asyncio.timeout(timeout_s):
        return await aw


class TaskReturned(RuntimeError):
    """A guarded task returned while its owner still needed it running."""


def spawn(
    coro: Coroutine[Any, Any, Any],
    *,
    name: str,
    on_death: Callable[[BaseException], None] | None = None,
    ends: bool | Callable[[], bool] = False,
) -> asyncio.Task[Any]:
    """Start `coro` as a named task whose end is always logged.

    With `on_death`, an exception or a return ends the owner's service, except a return that
    `ends` allows: True for work that finishes (a one-off reconcile), or a check asked when it
    returns (a server asked to exit, a stop already under way)."""
    task = asyncio.create_task(coro, name=name)
    _running.add(task)

    def _done(t: asyncio.Task[Any]) -> None:
        _running.discard(t)
        if t.cancelled():
            log.debug("task cancelled", extra={"task": name})
            return
        exc = t.exception()
        if exc is None:
            if on_death is None or (ends() if callable(ends) else ends):
                log.info("task finished", extra={"task": name})
                return
            exc = TaskReturned(f"task {name} returned: it was meant to run until stopped")
        log.error("task died", extra={"task": name}, exc_info=exc)
        if on_death is not None:
            on_death(exc)

    task.add_done_callback(_done)
    return task


def in_flight(
    coro: Coroutine[Any, Any, Any], *, name: str, into: set[asyncio.Task[Any]]
) -> asyncio.Task[Any]:
    """Start `coro` as a short task held in `into` until it ends; an exception it ends with is
    logged with its name (an owner awaiting it sees it too)."""
    task = asyncio.create_task(coro, name=name)
    into.add(task)

    def _done(t: asyncio.Task[Any]) -> None:
        into.discard(t)
        if not t.cancelled() and (exc := t.exception()) is not None:
            log.error("task failed", extra={"task": name}, exc_info=exc)

    task.add_done_callback(_done)
    return task


async def cancel_all(tasks: list[asyncio.Task[Any]], timeout_s: float = 5.0) -> None:
    """Cancel `tasks` and wait for them to finish (bounded)."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[[], object]) -> Callable[[], None]:
    """Call `callback` on the running loop at SIGTERM or SIGINT; returns the undo."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, callback)

    def remove() -> None:
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(sig)

    return remove


async def first_of(*events: asyncio.Event) -> None:
    """Return as soon as any of `events` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def until_stopped(died: asyncio.Event) -> bool:
    """Wait for SIGTERM/SIGINT or for `died` (a vital task ended); True when a part died.

    The services' main loop: on a signal they shut down cleanly and exit 0; when a part died
    they shut down and exit non-zero, so Kubernetes restarts them (crash-only).
    """
    stop = asyncio.Event()
    remove = on_stop_signals(stop.set)
    try:
        await first_of(stop, died)
    finally:
        remove()
    return died.is_set() and not stop.is_set()
