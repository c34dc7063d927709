"""List-then-watch of one Kubernetes resource, resumed and relisted as the API requires.

The sim agent learns which pods run where, and the aggregator learns that jobs finished, from
watches: the API server tells us, we never poll. `watch_resource` lists once (handing the
complete set to `on_sync`, so state for objects deleted while we were away is dropped), then
follows the watch from that resourceVersion; when the server ends the stream it resumes from
the last version seen, and when the version has expired (410 Gone) it relists. Transient
API errors back off and retry; a missing resource (a CRD not installed yet) waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.common.kube import Gone, KubeClient, NotFound, Resource, Unavailable

log = logging.getLogger(__name__)

Obj = dict[str, Any]
OnEvent = Callable[[str, Obj], Awaitable[None]]
OnSync = Callable[[list[Obj]], Awaitable[None]]


async def watch_resource(
    kube: KubeClient,
    resource: Resource,
    on_event: OnEvent,
    on_sync: OnSync | None = None,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    retry_s: float = 1.0,
    ready: asyncio.Event | None = None,
) -> None:
    """Run forever: call `on_sync(items)` after each (re)list and `on_event` for each change."""
    while True:
        try:
            listed = await kube.list(
                resource, namespace, label_selector=label_selector, field_selector=field_selector
            )
        except (Unavailable, NotFound) as exc:
            log.info(
                "list failed, retrying", extra={"resource": resource.plural, "error": str(exc)}
            )
            await asyncio.sleep(retry_s)
            continue
        items: list[Obj] = listed.get("items", [])
        if on_sync is not None:
            await on_sync(items)
        else:
            for item in items:
                await on_event("ADDED", item)
        if ready is not None:
            ready.set()
        version = str(listed.get("metadata", {}).get("resourceVersion", ""))
        while True:
            try:
                async for kind, obj in kube.watch(
                    resource,
                    namespace,
                    resource_version=version,
                    label_selector=label_selector,
                    field_selector=field_selector,
                ):
                    version = str(obj.get("metadata", {}).get("resourceVersion", version))
                    if kind in {"ADDED", "MODIFIED", "DELETED"}:
                        await on_event(kind, obj)
            except Gone:
                break  # relist
            except Unavailable as exc:
                log.info(
                    "watch broken, resuming", extra={"resource": resource.plural, "error": str(exc)}
                )
                await asyncio.sleep(retry_s)
        # fallthrough: relist


def parse_resource(spec: str) -> Resource:
    """A Resource from "group/version/plural" ("batch/v1/jobs") or "version/plural" (core)."""
    parts = spec.strip("/").split("/")
    if len(parts) == 3:
        return Resource(parts[0], parts[1], parts[2])
    if len(parts) == 2:
        return Resource("", parts[0], parts[1])
    raise InvalidValueError(
        "owner_kinds", spec, "expected group/version/plural, e.g. batch/v1/jobs"
    )
