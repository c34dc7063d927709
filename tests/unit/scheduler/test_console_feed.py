"""The console's live updates (`console/feed.py`): topics coalesce per client, a client that
stops reading is dropped instead of buffered, and heartbeats are not changes."""

from __future__ import annotations

import time

from alnair.common.informer import WatchEvent
from alnair.common.tasks import within
from alnair.scheduler.console.feed import Feed


async def _next(stream: object) -> bytes:
    return await within(stream.__anext__(), 2)  # type: ignore[attr-defined]


async def test_changes_coalesce_per_client_until_it_reads() -> None:
    feed = Feed()
    client = feed.connect()
    assert client is not None
    stream = feed.stream(client)
    assert await _next(stream) == b"retry: 2000\n\n"
    for _ in range(1000):  # a burst of bindings
        feed.changed("gpus")
    feed.changed("jobs")
    assert await _next(stream) == b"event: gpus\ndata: gpus\n\n"
    assert await _next(stream) == b"event: jobs\ndata: jobs\n\n"
    assert feed.sent == 2
    await stream.aclose()
    assert client not in feed.clients


async def test_a_client_that_stops_reading_is_dropped_not_buffered() -> None:
    feed = Feed(stall_s=0.05)
    slow = feed.connect()
    assert slow is not None
    stream = feed.stream(slow)
    await _next(stream)
    feed.changed("gpus")  # pending, never read
    slow.since = time.monotonic() - 1
    feed.changed("queues")
    assert slow.closed and slow not in feed.clients and feed.dropped == 1
    # Its stream ends (the browser reconnects and reads every view again).
    rest = [chunk async for chunk in stream]
    assert rest == []


async def test_clients_are_bounded() -> None:
    feed = Feed(max_clients=2)
    assert feed.connect() is not None and feed.connect() is not None
    assert feed.connect() is None


def test_a_node_heartbeat_is_not_a_change_but_readiness_is() -> None:
    feed = Feed()
    client = feed.connect()
    assert client is not None

    def node(ready: str, beat: str) -> dict[str, object]:
        return {
            "metadata": {"name": "n1", "labels": {"alnair.io/gpu-model": "T4"}},
            "status": {"conditions": [
                {"type": "Ready", "status": ready, "lastHeartbeatTime": beat},
            ]},
        }  # fmt: skip

    feed.on_node(WatchEvent.MODIFIED, node("True", "t2"), node("True", "t1"))
    assert client.pending == set()
    feed.on_node(WatchEvent.MODIFIED, node("False", "t3"), node("True", "t2"))
    assert client.pending == {"gpus"}
    client.pending.clear()
    # A pod's own status changes are not the GPU map's; a binding or a deletion is.
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}
    feed.on_pod(WatchEvent.MODIFIED, pod, pod)
    assert client.pending == set()
    feed.on_pod(WatchEvent.MODIFIED, pod, {"metadata": {"name": "p"}, "spec": {}})
    assert client.pending == {"gpus"}
