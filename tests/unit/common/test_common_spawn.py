"""A guarded task's end: an exception or an unexpected return is a death; a return its owner
allows (`ends`) is not; a cancellation never is."""

from __future__ import annotations

import asyncio
import contextlib

from alnair.common.tasks import TaskReturned, spawn


async def returns() -> str:
    await asyncio.sleep(0)
    return "done"


async def raises() -> None:
    await asyncio.sleep(0)
    raise ValueError("bad input")


async def ended(coro: object, **kw: object) -> list[BaseException]:
    deaths: list[BaseException] = []
    task = spawn(coro, name="test.task", on_death=deaths.append, **kw)  # type: ignore[arg-type]
    with contextlib.suppress(BaseException):
        await task
    await asyncio.sleep(0)  # the done callback runs on the next turn
    return deaths


async def test_a_guarded_task_that_returns_is_a_death_naming_the_task() -> None:
    (death,) = await ended(returns())
    assert isinstance(death, TaskReturned) and "test.task" in str(death)


async def test_a_return_the_owner_allows_is_no_death() -> None:
    assert await ended(returns(), ends=True) == []
    assert await ended(returns(), ends=lambda: True) == []
    (death,) = await ended(returns(), ends=lambda: False)  # asked at its return: not stopping
    assert isinstance(death, TaskReturned)


async def test_an_exception_is_a_death_whatever_ends_says() -> None:
    (death,) = await ended(raises(), ends=True)
    assert isinstance(death, ValueError)


async def test_a_cancelled_task_is_no_death() -> None:
    deaths: list[BaseException] = []
    task = spawn(asyncio.sleep(60), name="test.sleeper", on_death=deaths.append)
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert deaths == []


async def test_an_unguarded_task_that_returns_is_only_logged() -> None:
    task = spawn(returns(), name="test.unguarded")
    assert await task == "done"
