"""Crash-only where a watch is what keeps a component right (issue 26): the DRA driver's
ResourceSlice publisher dies with its slice watch (a slice the kubelet deletes would never be
published again), and the dispatcher's loop says when one of its informers died, unless the
informer ended because the API server does not serve its optional resource."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alnair.common.informer import Informer
from alnair.common.kube import NotFound
from alnair.common.tasks import within
from alnair.deviceplugin.draplugin import SlicePublisher, SliceWatchDied
from alnair.deviceplugin.state import NodeDevices
from alnair.scheduler.dispatcher.loop import ReconcileLoop


class _NothingThere:
    """An API server without the Node or a slice yet (the publisher's first reads)."""

    async def get(self, *_a: Any, **_k: Any) -> Any:
        raise NotFound(404, "NotFound", "not there", "/")


async def test_the_slice_publisher_dies_when_its_watch_dies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(_self: Any) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("the watch broke")

    monkeypatch.setattr(Informer, "run", broken)
    publisher = SlicePublisher(_NothingThere(), NodeDevices("n1"))  # type: ignore[arg-type]
    with pytest.raises(SliceWatchDied, match="the watch broke"):
        await within(publisher.run(), 5)


class _Informer:
    def __init__(self, name: str, *, unserved: bool, raises: bool) -> None:
        self.name = name
        self.unserved = unserved
        self.raises = raises
        self.synced = asyncio.Event()
        self.synced.set()

    async def run(self) -> None:
        await asyncio.sleep(0)
        if self.raises:
            raise RuntimeError("list failed in a way nobody handled")


@pytest.mark.parametrize(
    ("unserved", "raises", "dies"),
    [(True, False, False), (False, False, True), (False, True, True)],
    ids=["optional-and-unserved", "returned", "raised"],
)
async def test_the_dispatcher_loop_knows_when_an_informer_died(
    unserved: bool, raises: bool, dies: bool
) -> None:
    loop = ReconcileLoop()
    loop.informers = [_Informer("x", unserved=unserved, raises=raises)]  # type: ignore[list-item]
    await loop.start_watching()
    for _ in range(5):
        await asyncio.sleep(0)
    assert loop.watch_died.is_set() == dies
    await loop.stop()
