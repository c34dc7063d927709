"""Watch-based caches of Kubernetes objects (the informer pattern), with no polling.

An `Informer` lists once, then watches from the list's resourceVersion, resuming from the last
version it saw when the server ends a watch, and relisting only on 410 Gone (the version fell out
of etcd's window). Handlers receive (event, object, old) in order, one object type per informer,
on the event loop; `synced` is set after the first list has been delivered, so a controller can
wait for a complete view before acting. BOOKMARK events only advance the version.

On relist the store is reconciled: objects that vanished while we were away are delivered as
DELETED, so no consumer is left holding a ghost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from alnair.common.kube import Gone, KubeClient, Obj, Resource, Unavailable

log = logging.getLogger(__name__)


class WatchEvent(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


Handler = Callable[[WatchEvent, Obj, Obj | None], Awaitable[None] | None]


def key_of(obj: Obj) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Informer:
    """Keeps `store` equal to the API server's view of one resource."""

    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str | None = None,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.name = name or resource.plural
        self.store: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    async def _emit(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        for h in self.handlers:
            result = h(event, obj, old)
            if result is not None:
                await result

    async def _list(self) -> None:
        listing = await self.kube.list(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        fresh = {key_of(o): o for o in listing["items"]}
        for key in list(self.store):
            if key not in fresh:
                gone = self.store.pop(key)
                await self._emit(WatchEvent.DELETED, gone, gone)
        for key, obj in fresh.items():
            old = self.store.get(key)
            self.store[key] = obj
            if old is None:
                await self._emit(WatchEvent.ADDED, obj, None)
            elif old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                await self._emit(WatchEvent.MODIFIED, obj, old)
        self.resource_version = listing["metadata"]["resourceVersion"]
        self.relists += 1

    async def run(self) -> None:
        """List, then watch forever (run it as a guarded task)."""
        backoff = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    self.synced.set()
                async for etype, obj in self.kube.watch(
                    self.resource,
                    self.namespace,
                    resource_version=self.resource_version,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                ):
                    backoff = 0.2
                    self.resource_version = obj.get("metadata", {}).get(
                        "resourceVersion", self.resource_version
                    )
                    if etype == "BOOKMARK":
                        continue
                    await self._apply(WatchEvent(etype), obj)
            except Gone:
                log.info("watch expired, relisting", extra={"informer": self.name})
                need_list = True
            except Unavailable as exc:
                log.warning("watch broken", extra={"informer": self.name, "error": str(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _apply(self, event: WatchEvent, obj: Obj) -> None:
        key = key_of(obj)
        old = self.store.get(key)
        if event is WatchEvent.DELETED:
            self.store.pop(key, None)
            await self._emit(event, obj, old)
            return
        self.store[key] = obj
        await self._emit(WatchEvent.ADDED if old is None else WatchEvent.MODIFIED, obj, old)

    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def values(self) -> list[Any]:
        return list(self.store.values())
