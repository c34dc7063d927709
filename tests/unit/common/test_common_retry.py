"""The one retry helper: attempts until one works, only on the errors named, within a budget
when given, each failure logged with what was tried; and the back-off schedule of the loops
that wait on an event."""

from __future__ import annotations

import logging

import pytest

from alnair.common.retry import Backoff, retrying


class Flaky(Exception):
    pass


async def test_it_retries_until_an_attempt_works_and_logs_each_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Flaky(f"try {calls}")
        return "written"

    result = None
    with caplog.at_level(logging.WARNING, logger="alnair.common.retry"):
        async for attempt in retrying(
            "slice write", on=Flaky, wait_initial_s=0.001, wait_max_s=0.01, extra={"node": "n1"}
        ):
            with attempt:
                result = await write()
    assert (result, calls) == ("written", 3)
    failures = [r for r in caplog.records if r.getMessage() == "slice write failed; retrying"]
    assert [r.attempt for r in failures] == [1, 2]  # type: ignore[attr-defined]
    assert all(r.node == "n1" and "Flaky" in r.error for r in failures)  # type: ignore[attr-defined]


async def test_an_error_it_was_not_told_to_retry_ends_it_at_once() -> None:
    calls = 0

    async def lookup() -> None:
        nonlocal calls
        async for attempt in retrying("lookup", on=Flaky, wait_initial_s=0.001):
            with attempt:
                calls += 1
                raise KeyError("missing")

    with pytest.raises(KeyError):
        await lookup()
    assert calls == 1


async def test_a_budget_ends_it_with_the_last_error() -> None:
    calls = 0

    async def publish() -> None:
        nonlocal calls
        async for attempt in retrying(
            "publish", on=Flaky, wait_initial_s=0.01, wait_max_s=0.02, timeout_s=0.1
        ):
            with attempt:
                calls += 1
                raise Flaky("still down")

    with pytest.raises(Flaky, match="still down"):
        await publish()
    assert calls >= 2


def test_backoff_doubles_up_to_its_ceiling_and_starts_over() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5
    assert [backoff.at(n) for n in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert Backoff(1.0, 0.2).next() == 0.2  # the first wait is never over the ceiling
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(0, 1)
