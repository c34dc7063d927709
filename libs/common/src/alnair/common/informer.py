"""Watch-based caches of Kubernetes objects (the informer pattern), with no polling.

An `Informer` lists once, then watches from the list's resourceVersion, resuming from the last
version it saw when the server ends a watch, and relisting only on 410 Gone (the version fell out
of etcd's window). Handlers receive (event, object, old) in order, one object type per informer,
on the event loop; `synced` is set after the first list has been delivered, so a controller can
wait for a complete view before acting. BOOKMARK events only advance the version.

On relist the store is reconciled: objects that vanished while we were away are delivered as
DELETED, so no consumer is left holding a ghost.

Crash-only: `run` never ends on its own. A watch the server ends is resumed; anything else
(the API server unreachable, 401/403 while credentials rotate or RBAC is fixed, a watch ERROR
event, a malformed response) is logged, backs off exponentially up to `max_backoff_s` and
relists, since nothing is known about what was missed. A handler that raises is logged with
its traceback and counted (`handler_errors`); the object stays in the store and the other
objects keep flowing, as one bad object must not freeze the cache for all. `healthy` turns
false when the informer is not running, has not synced, or has failed for longer than
`stale_after_s`; readiness probes use it so a dead watch is visible instead of silent.
`on_health` is called whenever the watch starts failing, fails again, or recovers (and once
when it first syncs), so a consumer can react to a cluster going away without polling.

An `optional` informer follows a resource another project serves (a CRD that may not be
installed): a 404 on its first list means the API server does not serve it, which is an
answer, not a failure. It then sets `unserved` and `synced` and `run` returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any

from alnair.common.kube import Gone, KubeClient, NotFound, Obj, Resource, Unavailable
from alnair.common.retry import Backoff

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
        stale_after_s: float = 30.0,
        max_backoff_s: float = 30.0,
        on_health: Callable[[], None] | None = None,
        optional: bool = False,
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
        self.stale_after_s = stale_after_s
        self.max_backoff_s = max_backoff_s
        self.handler_errors = 0
        self.failures = 0
        """Consecutive failed list/watch attempts (0 while the watch works)."""
        self.last_error: str | None = None
        self.last_exception: Exception | None = None
        self.failing_since: float | None = None
        """When the current run of failures began (monotonic); None while the watch works."""
        self.on_health = on_health
        self.optional = optional
        self.unserved = False
        """An optional resource the API server does not serve (its first list was a 404)."""
        self._announced = False
        self._running = False

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    @property
    def healthy(self) -> bool:
        """Running, synced, and not failing for longer than `stale_after_s`."""
        if not self._running or not self.synced.is_set():
            return False
        since = self.failing_since
        return since is None or time.monotonic() - since < self.stale_after_s

    def status(self) -> dict[str, Any]:
        """What readiness endpoints show about this informer."""
        since = self.failing_since
        return {
            "healthy": self.healthy,
            "running": self._running,
            "synced": self.synced.is_set(),
            "failures": self.failures,
            "failing_for_s": None if since is None else round(time.monotonic() - since, 1),
            "last_error": self.last_error,
            "handler_errors": self.handler_errors,
        }

    async def _emit(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        for h in self.handlers:
            try:
                result = h(event, obj, old)
                if result is not None:
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                self.handler_errors += 1
                log.exception(
                    "informer handler failed",
                    extra={"informer": self.name, "event": event.value, "key": key_of(obj)},
                )

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
        """List, then watch forever (run it as a guarded task); it returns only for an
        optional resource the API server does not serve."""
        backoff = Backoff(0.2, self.max_backoff_s)
        need_list = True
        self._running = True
        try:
            while True:
                try:
                    if need_list:
                        await self._list()
                        need_list = False
                        self.synced.set()
                        self._recovered()
                    async for etype, obj in self.kube.watch(
                        self.resource,
                        self.namespace,
                        resource_version=self.resource_version,
                        label_selector=self.label_selector,
                        field_selector=self.field_selector,
                    ):
                        backoff.reset()
                        self._recovered()
                        self.resource_version = obj.get("metadata", {}).get(
                            "resourceVersion", self.resource_version
                        )
                        if etype == "BOOKMARK":
                            continue
                        await self._apply(WatchEvent(etype), obj)
                    self._recovered()
                except Gone:
                    log.info("watch expired, relisting", extra={"informer": self.name})
                    need_list = True
                except asyncio.CancelledError:
                    raise
                except NotFound as exc:
                    if self.optional and not self.synced.is_set():
                        self._unserved()
                        return
                    need_list = True
                    await self._back_off(exc, backoff)
                except Unavailable as exc:
                    await self._back_off(exc, backoff)
                except Exception as exc:
                    # 401/403, a watch ERROR event, a malformed answer: what we missed is
                    # unknown, so start over from a list once the back-off has passed.
                    need_list = True
                    await self._back_off(exc, backoff)
        finally:
            self._running = False

    async def _back_off(self, exc: Exception, backoff: Backoff) -> None:
        wait = backoff.next()
        self._failed(exc, wait)
        await asyncio.sleep(wait)

    def _unserved(self) -> None:
        self.unserved = True
        self.synced.set()
        log.info("the API server does not serve this resource", extra={"informer": self.name})
        self._tell()

    def _tell(self) -> None:
        if self.on_health is not None:
            self.on_health()

    def _failed(self, exc: Exception, backoff_s: float) -> None:
        self.failures += 1
        self.last_exception = exc
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        level = logging.WARNING if isinstance(exc, Unavailable) else logging.ERROR
        log.log(
            level,
            "watch failed, retrying",
            extra={
                "informer": self.name,
                "error": self.last_error,
                "failures": self.failures,
                "retry_in_s": backoff_s,
            },
        )
        self._tell()

    def _recovered(self) -> None:
        # Also called once the first list is in: a consumer may be waiting for the view to
        # be complete, which no object event says when the list is empty.
        changed = self.failing_since is not None or not self._announced
        if self.failing_since is not None:
            log.info("watch recovered", extra={"informer": self.name, "failures": self.failures})
        self._announced = True
        self.failures = 0
        self.failing_since = None
        if changed:
            self._tell()

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


def not_ready(informers: Sequence[Informer]) -> tuple[str, dict[str, Any]] | None:
    """Why a process whose view comes from `informers` is not ready (a reason and each
    informer's status, for a readiness probe's problem response), or None when it is: a dead,
    unsynced or failing watch freezes the view, and serving from it must be visible."""
    if all(inf.healthy for inf in informers):
        return None
    reason = (
        "caches not synced yet"
        if not all(inf.synced.is_set() for inf in informers)
        else "a watch is failing"
    )
    return reason, {inf.name: inf.status() for inf in informers}


class LabelIndex:
    """An informer's objects by (namespace, value of one label): the ones carrying a value are
    found in O(their number), not by scanning the store. It keeps keys, and reads each object
    from the store, so a copy written into the store directly (a controller's own write) is
    the one returned."""

    def __init__(self, informer: Informer, label: str) -> None:
        self.informer = informer
        self.label = label
        self._keys: dict[tuple[str, str], set[str]] = {}
        informer.add_handler(self._on_event)

    def _entry(self, obj: Obj) -> tuple[str, str] | None:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(self.label)
        return (str(meta.get("namespace") or ""), str(value)) if value else None

    def _on_event(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        key = key_of(obj)
        if old is not None and (gone := self._entry(old)) is not None:
            keys = self._keys.get(gone)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._keys[gone]
        if event is not WatchEvent.DELETED and (entry := self._entry(obj)) is not None:
            self._keys.setdefault(entry, set()).add(key)

    def get(self, namespace: str, value: str) -> list[Obj]:
        """The objects in `namespace` whose label is `value`, as the store holds them."""
        store = self.informer.store
        return [store[k] for k in sorted(self._keys.get((namespace, value), ())) if k in store]
