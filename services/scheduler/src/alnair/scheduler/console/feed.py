"""Live updates for the console: which views changed, pushed to each browser as server-sent
events, never polled.

A change is a topic (`gpus`, `jobs`, `queues`), not the data: the browser reads the view
again through the same authorized APIs, so an update says nothing a user may not read. Each
client has a small set of pending topics: a burst of a thousand bindings is one pending `gpus`
for a client that has not read yet. A client that has not taken its updates for
`stall_s` seconds is dropped (its stream ends; the browser's EventSource reconnects and reads
every view again), so a slow browser costs a bounded amount, never a growing buffer.

Sources: the scheduler's pod and node watches (`gpus`), its GPU health (`gpus`), and job
lifecycle events on the bus (`jobs`, `queues`: admissions, preemptions, completions), read
with a plain subscription (no durable: a console that restarts needs no history).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from alnair.common.informer import WatchEvent
from alnair.common.kube import Obj
from alnair.common.tasks import within

log = logging.getLogger(__name__)

TOPICS = ("gpus", "jobs", "queues")


class Client:
    """One browser's stream: the topics changed since it last read."""

    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.wake = asyncio.Event()
        self.closed = False
        self.since = time.monotonic()
        """When it last took its updates (or connected)."""


class Feed:
    """Fan-out of changed topics to the console's clients."""

    def __init__(self, *, max_clients: int = 200, stall_s: float = 60.0) -> None:
        self.clients: set[Client] = set()
        self.max_clients = max_clients
        self.stall_s = stall_s
        self.sent = 0
        self.dropped = 0

    def changed(self, topic: str) -> None:
        now = time.monotonic()
        for client in list(self.clients):
            if client.pending and now - client.since > self.stall_s:
                self._drop(client)  # it has not read for too long: it reconnects and rereads
                continue
            client.pending.add(topic)
            client.wake.set()

    def _drop(self, client: Client) -> None:
        client.closed = True
        client.wake.set()
        self.clients.discard(client)
        self.dropped += 1

    def connect(self) -> Client | None:
        """A new client, or None when as many are connected as allowed."""
        if len(self.clients) >= self.max_clients:
            return None
        client = Client()
        self.clients.add(client)
        return client

    async def stream(self, client: Client, keepalive_s: float = 15.0) -> AsyncIterator[bytes]:
        """The client's server-sent events until it is dropped or disconnects: one event per
        changed topic, and a comment line every `keepalive_s` so proxies keep it open."""
        try:
            yield b"retry: 2000\n\n"
            while not client.closed:
                try:
                    await within(client.wake.wait(), keepalive_s)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                client.wake.clear()
                if client.closed:
                    break
                topics, client.pending = sorted(client.pending), set()
                client.since = time.monotonic()
                for topic in topics:
                    self.sent += 1
                    yield f"event: {topic}\ndata: {topic}\n\n".encode()
        finally:
            self.clients.discard(client)

    # --- sources ---------------------------------------------------------------------------

    def on_pod(self, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        """A pod bound, gone or moved: the GPU map changed."""
        node = (pod.get("spec") or {}).get("nodeName")
        before = ((old or {}).get("spec") or {}).get("nodeName")
        moved = event is WatchEvent.DELETED or node != before or old is None
        if (node or before) and moved:
            self.changed("gpus")

    def on_node(self, event: WatchEvent, node: Obj, old: Obj | None) -> None:
        """A node added, gone, or its readiness or labels changed (not its heartbeats)."""
        if event is not WatchEvent.MODIFIED or _shape(node) != _shape(old or {}):
            self.changed("gpus")

    async def on_job_message(self, _msg: Any) -> None:
        """A job lifecycle event on the bus (submitted, admitted, preempted, completed)."""
        self.changed("jobs")
        self.changed("queues")


def _shape(node: Obj) -> tuple[Any, ...]:
    conditions = (node.get("status") or {}).get("conditions") or []
    return (
        tuple((c.get("type"), c.get("status")) for c in conditions),
        tuple(sorted(((node.get("metadata") or {}).get("labels") or {}).items())),
    )
