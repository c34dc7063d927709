"""The scheduler's read API as an aggregated Kubernetes API: `scheduler.query.alnair.io/v1alpha1`.

What `kubectl alnair gpus`, `top` and `why pod/NAME` show, from the scheduler's own cache (every
replica keeps it warm, so a follower answers too), reached through the API server with the
user's identity (`alnair.common.aggregated`):

- `GET .../gpus`: per node, its GPU model and each GPU: free and used milli-GPU, the pods
  holding a share and how much, measured utilization (the sum of its pods' latest samples),
  health; per node its free GPU capacity and how much of it is stranded in GPUs already
  partly held (usable by fractional pods only: `fragmentation` is that share of the free).
  Cluster-scoped.
- `GET .../podmetrics`, `GET .../namespaces/{ns}/podmetrics`: per pod holding GPUs, its node,
  GPUs and share, and its latest measured utilization and GPU memory per GPU.
- `GET .../namespaces/{ns}/pods/{name}`: why a pod waits or where it went: the explanation of
  `GET /v1/pods/{ns}/{name}/explain` (every filter's verdict per node group, the best nodes'
  scores, the sentence shown on the pod).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from alnair.common.aggregated import (
    QUERY_VERSION,
    SCHEDULER_GROUP,
    GroupVersion,
    Resource,
    status,
)
from alnair.common.kube import NotFound
from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.live.scheduler import Scheduler

API_VERSION = f"{SCHEDULER_GROUP}/{QUERY_VERSION}"

QUERY_API = GroupVersion(
    SCHEDULER_GROUP,
    QUERY_VERSION,
    (
        Resource("gpus", namespaced=False, kind="NodeGpus", verbs=("list",)),
        Resource("podmetrics", namespaced=True, kind="PodGpuMetrics", verbs=("list",)),
        Resource("pods", namespaced=True, kind="PodExplanation", verbs=("get",)),
    ),
)


def _holders(scheduler: Scheduler) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(node index, GPU) -> the pods holding a share of it (bound or assumed)."""
    snap = scheduler.cache.snapshot()
    out: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for req, placement in snap.placed.values():
        share = placement.gpu_milli if placement.gpu_milli else MILLI_PER_GPU
        for gpu in placement.gpu_indices:
            out[(placement.node, gpu)].append(
                {"pod": f"{req.namespace}/{req.name}", "milli": share}
            )
    return out


def node_gpus(scheduler: Scheduler) -> dict[str, Any]:
    """`gpus`: every node with GPUs, each GPU's holders, use and health."""
    snap = scheduler.cache.snapshot()
    holders = _holders(scheduler)
    items: list[dict[str, Any]] = []
    for i, name in enumerate(snap.names):
        count = int(snap.gpu_count[i])
        if count == 0:
            continue
        gpus = []
        free_total = stranded = 0
        for g in range(count):
            healthy = not bool(snap.unhealthy[i, g]) if snap.unhealthy.size else True
            free = int(snap.gpu_free[i, g]) + (int(snap.withheld[i, g]) if not healthy else 0)
            if healthy:
                free_total += free
                if 0 < free < MILLI_PER_GPU:
                    stranded += free
            gpus.append(
                {
                    "index": g,
                    "freeMilli": free,
                    "usedMilli": MILLI_PER_GPU - free,
                    "holders": sorted(holders.get((i, g), []), key=lambda h: h["pod"]),
                    "utilizationPct": round(float(snap.gpu_util[i, g]), 1)
                    if snap.gpu_util.size
                    else 0.0,
                    "healthy": healthy,
                }
            )
        items.append(
            {
                "node": name,
                "model": snap.models[int(snap.model_id[i])],
                "gpus": gpus,
                "freeMilli": free_total,
                "strandedMilli": stranded,
                "fragmentation": round(stranded / free_total, 3) if free_total else 0.0,
            }
        )
    items.sort(key=lambda n: str(n["node"]))
    return {"kind": "NodeGpusList", "apiVersion": API_VERSION, "metadata": {}, "items": items}


def pod_metrics(scheduler: Scheduler, namespace: str | None) -> dict[str, Any]:
    """`podmetrics`: each pod holding GPUs in `namespace` (None: all), with what it uses."""
    cache = scheduler.cache
    items: list[dict[str, Any]] = []
    for uid, (req, placement) in cache.snapshot().placed.items():
        if not placement.gpu_indices or (namespace is not None and req.namespace != namespace):
            continue
        node = placement.node_name
        util = {g: (cache.util_shares.get((node, g)) or {}).get(uid) for g in placement.gpu_indices}
        memory = cache.mem_of_pod.get(uid) or {}
        items.append(
            {
                "pod": f"{req.namespace}/{req.name}",
                "node": node,
                "gpus": [
                    {
                        "index": g,
                        "milli": placement.gpu_milli or MILLI_PER_GPU,
                        "utilizationPct": util[g],
                        "memoryMiB": memory.get((node, g)),
                    }
                    for g in placement.gpu_indices
                ],
            }
        )
    items.sort(key=lambda p: str(p["pod"]))
    return {"kind": "PodGpuMetricsList", "apiVersion": API_VERSION, "metadata": {},
            "items": items}  # fmt: skip


def add_query_routes(app: FastAPI, scheduler: Scheduler) -> None:
    """The routes under `QUERY_API.prefix` (authorization is `install_aggregated`'s)."""
    prefix = QUERY_API.prefix

    @app.get(prefix + "/gpus")
    async def gpus() -> dict[str, Any]:
        return node_gpus(scheduler)

    @app.get(prefix + "/podmetrics")
    async def all_metrics() -> dict[str, Any]:
        return pod_metrics(scheduler, None)

    @app.get(prefix + "/namespaces/{namespace}/podmetrics")
    async def metrics_in(namespace: str) -> dict[str, Any]:
        return pod_metrics(scheduler, namespace)

    @app.get(prefix + "/namespaces/{namespace}/pods/{name}", response_model=None)
    async def why(namespace: str, name: str) -> dict[str, Any] | JSONResponse:
        try:
            doc = scheduler.explain(namespace, name)
        except NotFound as exc:
            return status(404, "NotFound", exc.api_message)
        return {
            "kind": "PodExplanation",
            "apiVersion": API_VERSION,
            "metadata": {"name": name, "namespace": namespace},
            "pod": doc,
        }
