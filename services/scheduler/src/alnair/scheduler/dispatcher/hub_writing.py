"""Every write the hub makes about a placed workload: its mirror created on the worker, the
mirror's status copied back onto the hub's object (and the completion published), the hub's
conditions on a Job and its wait Events. Each write is isolated like the dispatcher's
(`writing.py`): a conflict wakes the loop, a refusal is logged and the queue goes on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from alnair.common.events import JobPhase
from alnair.common.informer import Informer
from alnair.common.kube import (
    JOBS,
    NAMESPACES,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
    Unavailable,
)
from alnair.scheduler.dispatcher.hub_report import HubJobState
from alnair.scheduler.dispatcher.kinds import JOB, KINDS
from alnair.scheduler.dispatcher.mirrors import ANN_PLACED_TYPE, job_status, mirror_of
from alnair.scheduler.dispatcher.parsing import Workload
from alnair.scheduler.dispatcher.worker_clusters import Worker
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind
from alnair.scheduler.dispatcher.writing import PostEvent

log = logging.getLogger(__name__)


class HubPublish(Protocol):
    def __call__(
        self, wl: Workload, phase: JobPhase, detail: dict[str, Any], seq: str = "0",
        cluster: str | None = None,
    ) -> Awaitable[None]: ...  # fmt: skip


class HubWriter:
    """Writes about placed workloads; `jobs` is the hub's Job informer (its conditions are
    merged with what is there), `cluster` the hub's own name (mirrors say where they came
    from)."""

    def __init__(
        self,
        kube: KubeClient,
        cluster: str,
        jobs: Informer,
        *,
        event: PostEvent,
        publish: HubPublish,
        wake: Callable[[], None],
        remember: Callable[[Workload, Obj], None],
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.jobs = jobs
        self.event = event
        self.publish = publish
        self.wake = wake
        self.remember = remember

    async def ensure_mirror(
        self, worker: Worker, hub_obj: Obj, wl: Workload, gpu_type: str
    ) -> None:
        kind = KINDS[wl.kind]
        mirror = mirror_of(hub_obj, gpu_type, self.cluster, wl)
        ns = mirror["metadata"]["namespace"]
        with contextlib.suppress(Conflict):
            await worker.kube.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
        try:
            created = await worker.kube.create(kind.resource, mirror, ns)
            worker.mirrors[kind.kind].store[f"{ns}/{mirror['metadata']['name']}"] = created
        except Conflict:
            pass  # already there: created by an earlier attempt
        except (ApiError, Unavailable) as exc:
            await self.event(
                kind.ref(hub_obj), "MirrorFailed", f"on {worker.name}: {exc}", warning=True
            )

    async def mirror_status(
        self, wl: Workload, kind: WorkloadKind, mirror: Obj, cluster: str, state: HubJobState
    ) -> None:
        rv = str(mirror["metadata"].get("resourceVersion"))
        if state.mirrored_rv == rv:
            return
        status = mirror.get("status") or {}
        finished = kind.finished(mirror)
        if kind.kind == JOB.kind:
            copied = job_status(wl, status, finished, cluster)
            if copied is None:
                return  # the worker's Job controller is finishing it: its final status follows
        else:
            # Another kind's status is its controller's, whole (what users and tools read).
            copied = status
        try:
            updated = await self.kube.patch(
                wl.resource, wl.name, {"status": copied}, wl.namespace, sub="status"
            )
        except (Conflict, NotFound):
            self.wake()
            return
        except ApiError as exc:
            log.warning("hub status not written: %s", exc, extra={"job": wl.key, "error": str(exc)})
            return
        state.mirrored_rv = rv
        # What was just written is what the hub explains now, not what the watch brings later.
        self.remember(wl, updated)
        if finished is not None:
            runtime = None
            start, end = status.get("startTime"), status.get("completionTime")
            if start and end:
                runtime = (
                    datetime.fromisoformat(end.replace("Z", "+00:00"))
                    - datetime.fromisoformat(start.replace("Z", "+00:00"))
                ).total_seconds()
            phase = JobPhase.FAILED if finished == "Failed" else JobPhase.COMPLETED
            await self.publish(
                wl,
                phase,
                {
                    "cluster": cluster,
                    "gpu_model": wl.annotations.get(ANN_PLACED_TYPE),
                    "gpus": wl.request.gpus,
                    "runtime_s": runtime,
                    **wl.features,
                },
                seq="0",
                cluster=cluster,
            )

    async def status(
        self, wl: Workload, fields: dict[str, Any], conditions: list[dict[str, str]]
    ) -> None:
        """The hub's conditions on a Job's status (`kubectl describe job`); another kind's
        status is its own controller's, copied from its mirror: Events say it there."""
        if not KINDS[wl.kind].writes_conditions:
            return
        current = self.jobs.get(f"{wl.namespace}/{wl.name}") or {}
        kept = [
            c
            for c in ((current.get("status") or {}).get("conditions") or [])
            if c.get("type") not in {x["type"] for x in conditions}
        ]
        body = {"status": {**fields, "conditions": [*kept, *conditions]}}
        with contextlib.suppress(NotFound, Conflict):
            try:
                await self.kube.patch(JOBS, wl.name, body, wl.namespace, sub="status")
            except ApiError as exc:
                log.warning("hub condition not written", extra={"job": wl.key, "error": str(exc)})

    async def wait_event(self, wl: Workload, state: HubJobState) -> None:
        if state.reason is None or state.reason_evented == state.reason.kind:
            return
        state.reason_evented = state.reason.kind
        text = f"{state.reason.kind}: {state.reason.message}"
        await self.event(
            wl.ref(),
            "Waiting",
            f"waiting ({text})",
            warning=state.reason.kind in ("queue", "prediction"),
        )
