"""Retrying, one way for every service.

Two shapes of retry occur, and each has one helper:

- **Do something until it works** (register with the kubelet, write a ResourceSlice, make the
  bus's streams again, publish within a budget): `retrying` yields attempts from `stamina`
  (exponential back-off with jitter, on the exceptions named, forever or within a time
  budget), and logs each failed attempt with what was tried, the error and the next wait.

      async for attempt in retrying("ResourceSlice write", on=(Conflict, Unavailable)):
          with attempt:
              await write()

- **Wait for an event, or time, whichever comes first** (an informer after a failed watch,
  the kubelet's socket appearing, a publish that failed while the bus looked connected):
  the loop waits on its own event and takes its timeouts from a `Backoff`, which doubles up
  to a ceiling and starts over when the thing worked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import stamina

log = logging.getLogger(__name__)

# Each failed attempt is logged here, with what was tried; stamina's own log line would say it
# twice, without the context.
stamina.instrumentation.set_on_retry_hooks([])

Exceptions = type[Exception] | tuple[type[Exception], ...]


class Backoff:
    """Exponential waits: `initial_s` (no more than `max_s`), doubling, at most `max_s`;
    `reset` after a success."""

    def __init__(self, initial_s: float, max_s: float, factor: float = 2.0) -> None:
        if initial_s <= 0 or max_s <= 0 or factor < 1:
            raise ValueError(f"bad backoff: initial {initial_s}, max {max_s}, factor {factor}")
        initial_s = min(initial_s, max_s)
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self.current_s = initial_s

    def next(self) -> float:
        """The wait to use now; the following one is longer (up to `max_s`)."""
        wait = self.current_s
        self.current_s = min(self.current_s * self.factor, self.max_s)
        return wait

    def reset(self) -> None:
        self.current_s = self.initial_s

    def at(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0 first), without changing the state."""
        return min(self.initial_s * self.factor ** min(attempt, 64), self.max_s)


class _Attempt:
    """One attempt: a failure it retries on is logged before `stamina` schedules the next."""

    def __init__(self, attempt: stamina.Attempt, what: str, on: Exceptions, extra: dict[str, Any]):
        self._attempt = attempt
        self._what = what
        self._on = on
        self._extra = extra

    @property
    def num(self) -> int:
        return self._attempt.num

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        with self._attempt:
            try:
                yield
            except self._on as exc:
                log.warning(
                    "%s failed; retrying",
                    self._what,
                    extra={
                        **self._extra,
                        "attempt": self._attempt.num,
                        "error": repr(exc),
                        "retry_in_s": round(self._attempt.next_wait, 3),
                    },
                )
                raise

    def __enter__(self) -> None:
        self._cm = self._guard()
        self._cm.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._cm.__exit__(*exc_info)


async def retrying(
    what: str,
    *,
    on: Exceptions,
    wait_initial_s: float = 0.1,
    wait_max_s: float = 5.0,
    timeout_s: float | None = None,
    attempts: int | None = None,
    extra: dict[str, Any] | None = None,
) -> AsyncIterator[_Attempt]:
    """Attempts at `what` until one does not raise one of `on` (any other exception ends the
    retrying at once). Forever unless `timeout_s` or `attempts` bounds it; then the last
    error is raised."""
    async for attempt in stamina.retry_context(
        on=on,
        attempts=attempts,
        timeout=timeout_s,
        wait_initial=wait_initial_s,
        wait_max=wait_max_s,
        wait_jitter=wait_initial_s,
    ):
        yield _Attempt(attempt, what, on, extra or {})
