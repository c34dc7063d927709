"""Running the live scheduler in a test process, and reading what it did on the control plane:
shared by every e2e test of the binder."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import EVENTS, PODS, KubeClient, NotFound
from alnair.dev.builders import make_pod
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings


def settings(**kw: Any) -> SchedulerSettings:
    base: dict[str, Any] = {
        "leader_elect": False,
        "nats_enabled": False,
        "seed": 7,
        "initial_backoff_s": 0.2,
        "max_backoff_s": 1.0,
        "identity": f"test-{uuid.uuid4().hex[:6]}",
    }
    base.update(kw)
    return SchedulerSettings(**base)


class Running:
    """A scheduler started in this process, stopped when the test ends."""

    def __init__(self, kube: KubeClient, **kw: Any) -> None:
        self.scheduler = Scheduler(kube, settings(**kw))
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> Scheduler:
        await self.scheduler.start_watching()
        self.task = asyncio.create_task(self.scheduler.run())
        return self.scheduler

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.scheduler.stop()


async def pool(cp: ControlPlane, kube: KubeClient, spec: str, name: str) -> list[str]:
    return await cp.create_gpu_nodes(
        spec, kube=kube, prefix=name, labels={"alnair.io/test-pool": name}
    )


async def seen_ready(scheduler: Scheduler, nodes: list[str], timeout_s: float = 10) -> None:
    """Wait until the scheduler's own cache holds every node in `nodes` untainted (Ready). The
    API server shows a node Ready before the scheduler's watch has delivered it: a cycle in
    between counts the node as not ready, and an explanation's counts differ by one."""

    async def seen() -> bool:
        infos = [scheduler.cache.nodes.get(n) for n in nodes]
        return all(i is not None and not i.taints for i in infos)

    await wait_for(seen, timeout_s, 0.05)


async def pods_in(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    return list((await kube.list(PODS, ns))["items"])


async def events_for(kube: KubeClient, ns: str, name: str, *reasons: str) -> list[dict[str, Any]]:
    """The Events about object `name`; only those with one of `reasons` when any are given."""
    items = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={name}"))["items"]
    return [e for e in items if not reasons or e["reason"] in reasons]


def assert_no_overcommit(pods: list[dict[str, Any]], gpus_per_node: int) -> None:
    used: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[tuple[str, int], int] = defaultdict(int)
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in {"Succeeded", "Failed"}:
            continue  # finished pods hold no GPU
        ann = p["metadata"].get("annotations") or {}
        indices = r.parse_indices(ann[r.ANN_GPU_INDICES]) if ann.get(r.ANN_GPU_INDICES) else []
        milli = int(ann.get(r.ANN_GPU_MILLI, "0"))
        res = p["spec"]["containers"][0]["resources"]["requests"]
        if r.GPU in res:
            assert len(indices) == int(res[r.GPU]), p["metadata"]["name"]
            assert milli == 1000
        for g in indices:
            assert 0 <= g < gpus_per_node
            used[(node, g)] += milli
            whole[(node, g)] += milli == 1000
    assert all(v <= 1000 for v in used.values()), dict(used)
    # A whole GPU is never shared with anything else.
    assert all(used[k] == 1000 for k, n in whole.items() if n), dict(used)


async def bound_node(kube: KubeClient, ns: str, name: str) -> str | None:
    """The node the pod is bound to; None while it is pending or not created yet."""
    try:
        pod = await kube.get(PODS, name, ns)
    except NotFound:
        return None
    node: str | None = pod["spec"].get("nodeName")
    return node


def node(name: str, gpus: int = 4, model: str = "T4", **extra: Any) -> dict[str, Any]:
    """A Ready GPU node as the scheduler's cache reads it (unit tests)."""
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": {r.LABEL_GPU_MODEL: model}},
        "spec": extra.get("spec", {}),
        "status": {
            "allocatable": {"cpu": "32", "memory": "128Gi", r.GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return obj


def bound(name: str, node_name: str, gpus: int, indices: str, uid: str) -> dict[str, Any]:
    """A pod bound to `node_name` on whole GPUs `indices` (unit tests)."""
    pod = make_pod(name, "ns").gpus(gpus).obj()
    pod["metadata"]["uid"] = uid
    pod["metadata"]["annotations"][r.ANN_GPU_INDICES] = indices
    pod["metadata"]["annotations"][r.ANN_GPU_MILLI] = "1000"
    pod["spec"]["nodeName"] = node_name
    return pod


async def table_published(nats_url: str, timeout_s: float = 60.0) -> None:
    """Wait for the predictor's first co-location table in the KV bucket. Tests that start
    the predictor in their own process wait for it before building other services' apps: the
    table is computed in a worker thread whose library code swaps the process's warning
    filters (`warnings.catch_warnings`), which races with FastAPI's own swap while it builds
    an app's routes and lets its suppressed warning through as an error."""
    from alnair.common import colocation
    from alnair.common.bus import Bus

    bus = await Bus.connect(nats_url, name="test-table-wait")
    try:
        kv = await bus.kv(colocation.BUCKET)

        async def there() -> bool:
            try:
                return bool((await kv.get(colocation.KEY)).value)
            except Exception:
                return False

        await wait_for(there, timeout_s, 0.2)
    finally:
        await bus.close()
