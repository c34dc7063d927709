"""`within` (alnair.common.tasks): a bounded await whose caller's cancellation is never lost.

Python 3.11's `asyncio.wait_for` returns the awaited result when a cancellation arrives in the
same loop iteration as that result, and the cancelled task goes on. CI once hung for the
pytest timeout on it: a dispatcher's leader elector, cancelled as a renewal completed, renewed
on for ever, so the service's stop never returned and the Lease was never handed back.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from alnair.common.kube import LEASES, ApiError, NotFound, Obj, Resource
from alnair.common.leader import LeaderElector
from alnair.common.tasks import within


async def _quick() -> bool:
    await asyncio.sleep(0)
    return True


async def _cancelled_at_every_step(
    body: Callable[[], Awaitable[None]], steps: int = 7, rounds: int = 300
) -> list[int]:
    """Start `body` as a task and cancel it after 0..steps-1 loop iterations, `rounds` times;
    the rounds whose task was still running a while after its cancellation."""
    survived = []
    for i in range(rounds):
        task = asyncio.create_task(body())
        for _ in range(i % steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done:
            survived.append(i)
            while not task.done():
                task.cancel()
                await asyncio.sleep(0.001)
    return survived


async def test_a_cancellation_arriving_as_the_work_completes_ends_the_caller() -> None:
    async def renewing_for_ever() -> None:
        while True:
            assert await within(_quick(), 1.0)

    assert await _cancelled_at_every_step(renewing_for_ever) == []


async def test_within_times_out_and_returns_the_result() -> None:
    assert await within(_quick(), 1.0) is True
    assert await within(_quick(), None) is True
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)


class _InstantLeases:
    """An API server answering at once (one loop iteration): a Lease store and a refused
    watch, so every renewal completes right where a cancellation can land."""

    def __init__(self) -> None:
        self.lease: Obj | None = None
        self.version = itertools.count(1)

    async def get(self, _res: Resource, _name: str, _ns: str) -> Obj:
        await asyncio.sleep(0)
        if self.lease is None:
            raise NotFound(404, "NotFound", "no lease", "/leases")
        return self.lease

    async def _store(self, body: Obj) -> Obj:
        await asyncio.sleep(0)
        body["metadata"]["resourceVersion"] = str(next(self.version))
        self.lease = body
        return body

    async def create(self, _res: Resource, body: Obj, _ns: str) -> Obj:
        return await self._store(body)

    async def replace(self, _res: Resource, body: Obj, _sub: str = "") -> Obj:
        return await self._store(body)

    async def watch(self, *_a: Any, **_k: Any) -> AsyncIterator[tuple[str, Obj]]:
        raise ApiError(403, "Forbidden", "no watch here", LEASES.path("default"))
        yield  # an async generator, as the real one


async def test_a_leader_cancelled_as_a_renewal_completes_stops_renewing() -> None:
    kube = _InstantLeases()

    async def lead() -> None:
        elector = LeaderElector(
            kube,  # type: ignore[arg-type]
            name="l", namespace="default", identity="a",
            lease_duration_s=1.0, renew_deadline_s=0.5, retry_period_s=1e-6,
        )  # fmt: skip
        await elector.run()

    assert await _cancelled_at_every_step(lead, steps=13) == []
