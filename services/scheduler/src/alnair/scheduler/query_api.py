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
- `GET .../console/`, `GET .../updates`: the web console and its live updates
  (`console/`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

import numpy as np
from fastapi import FastAPI, Query
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
        Resource("console", namespaced=False, kind="Console", verbs=("get", "list")),
        Resource("updates", namespaced=False, kind="Update", verbs=("list",)),
    ),
)


def _holders(scheduler: Scheduler, nodes: set[int]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(node index, GPU) -> the pods holding a share of it (bound or assumed), on `nodes`."""
    snap = scheduler.cache.snapshot()
    out: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for req, placement in snap.placed.values():
        if placement.node not in nodes:
            continue
        share = placement.gpu_milli if placement.gpu_milli else MILLI_PER_GPU
        for gpu in placement.gpu_indices:
            out[(placement.node, gpu)].append(
                {"pod": f"{req.namespace}/{req.name}", "milli": share}
            )
    return out


def _gpu_columns(scheduler: Scheduler) -> dict[str, Any]:
    """Per node with GPUs (by name): valid, healthy, free and stranded milli-GPU columns."""
    snap = scheduler.cache.snapshot()
    rows = np.flatnonzero(snap.gpu_count > 0)
    width = snap.gpu_free.shape[1] if snap.gpu_free.ndim == 2 else 0
    valid = np.arange(width)[None, :] < snap.gpu_count[rows][:, None]
    unhealthy = snap.unhealthy[rows] if snap.unhealthy.shape[0] else np.zeros_like(valid)
    healthy = valid & ~unhealthy
    free = np.where(healthy, snap.gpu_free[rows], 0)
    stranded = np.where((free > 0) & (free < MILLI_PER_GPU), free, 0)
    util = snap.gpu_util[rows] if snap.gpu_util.shape[0] else np.zeros(valid.shape)
    return {
        "rows": rows, "valid": valid, "healthy": healthy, "free": free,
        "stranded": stranded, "util": util, "snap": snap,
    }  # fmt: skip


def _summary(cols: dict[str, Any]) -> list[dict[str, Any]]:
    """Per GPU model: nodes, GPUs, used, unhealthy, free, stranded, mean utilization."""
    snap = cols["snap"]
    models = snap.model_id[cols["rows"]]
    out = []
    for m in np.unique(models):
        sel = models == m
        valid, healthy = cols["valid"][sel], cols["healthy"][sel]
        free = int(cols["free"][sel].sum())
        stranded = int(cols["stranded"][sel].sum())
        gpus = int(valid.sum())
        out.append(
            {
                "model": snap.models[int(m)],
                "nodes": int(sel.sum()),
                "gpus": gpus,
                "unhealthy": int((valid & ~healthy).sum()),
                "usedMilli": int(healthy.sum()) * MILLI_PER_GPU - free,
                "freeMilli": free,
                "strandedMilli": stranded,
                "fragmentation": round(stranded / free, 3) if free else 0.0,
                "utilizationPct": round(float(cols["util"][sel][valid].mean()), 1) if gpus else 0.0,
            }
        )
    return sorted(out, key=lambda s: str(s["model"]))


_VIEW: dict[int, tuple[tuple[int, int, float], dict[str, Any]]] = {}
"""Per scheduler: the columns, the nodes' order by name and the summary, with the state of the
snapshot they were made from (its identity, its placements' generation, the measured use)."""


def _view(scheduler: Scheduler) -> dict[str, Any]:
    """Columns, order and summary, made again only when the snapshot changed: 5,000 nodes
    sorted and summed once per change, not once per page read."""
    snap = scheduler.cache.snapshot()
    made_from = (id(snap), int(snap.generation.sum()), float(snap.gpu_util.sum()))
    cached = _VIEW.get(id(scheduler))
    if cached is not None and cached[0] == made_from:
        return cached[1]
    cols = _gpu_columns(scheduler)
    names = [snap.names[int(i)] for i in cols["rows"]]
    cols["order"] = sorted(range(len(names)), key=names.__getitem__)
    cols["sorted_names"] = [names[k] for k in cols["order"]]
    cols["summary"] = _summary(cols)
    if len(_VIEW) > 16:
        _VIEW.clear()
    _VIEW[id(scheduler)] = (made_from, cols)
    return cols


def node_gpus(scheduler: Scheduler, limit: int = 0, after: str = "") -> dict[str, Any]:
    """`gpus`: nodes with GPUs by name (`limit` of them after the node `after`; 0: all), each
    GPU's holders, use and health, and the summary per model of every node."""
    cols = _view(scheduler)
    snap = cols["snap"]
    order = cols["order"]
    if after:
        order = order[bisect.bisect_right(cols["sorted_names"], after) :]
    more = bool(limit) and len(order) > limit
    page = order[:limit] if limit else order
    holders = _holders(scheduler, {int(cols["rows"][k]) for k in page})
    items: list[dict[str, Any]] = []
    for k in page:
        i = int(cols["rows"][k])
        gpus = []
        for g in range(int(snap.gpu_count[i])):
            healthy = bool(cols["healthy"][k, g])
            used = MILLI_PER_GPU - int(cols["free"][k, g]) if healthy else 0
            gpus.append(
                {
                    "index": g,
                    "freeMilli": int(cols["free"][k, g]),
                    "usedMilli": used,
                    "holders": sorted(holders.get((i, g), []), key=lambda h: str(h["pod"])),
                    "utilizationPct": round(float(cols["util"][k, g]), 1),
                    "healthy": healthy,
                }
            )
        free = int(cols["free"][k].sum())
        stranded = int(cols["stranded"][k].sum())
        items.append(
            {
                "node": snap.names[i],
                "model": snap.models[int(snap.model_id[i])],
                "gpus": gpus,
                "freeMilli": free,
                "strandedMilli": stranded,
                "fragmentation": round(stranded / free, 3) if free else 0.0,
            }
        )
    metadata: dict[str, Any] = {"total": len(order) if not after else None}
    if more:
        metadata["continue"] = items[-1]["node"]
    return {
        "kind": "NodeGpusList",
        "apiVersion": API_VERSION,
        "metadata": {k: v for k, v in metadata.items() if v is not None},
        "summary": cols["summary"],
        "items": items,
    }


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

    # Each route answers a JSONResponse of a document it built: FastAPI's encoder would walk
    # every value again (a page of 200 nodes is thousands), for nothing.
    @app.get(prefix + "/gpus")
    async def gpus(
        limit: int = Query(0, ge=0), cont: str = Query("", alias="continue")
    ) -> JSONResponse:
        return JSONResponse(node_gpus(scheduler, limit, cont))

    @app.get(prefix + "/podmetrics")
    async def all_metrics() -> JSONResponse:
        return JSONResponse(pod_metrics(scheduler, None))

    @app.get(prefix + "/namespaces/{namespace}/podmetrics")
    async def metrics_in(namespace: str) -> JSONResponse:
        return JSONResponse(pod_metrics(scheduler, namespace))

    @app.get(prefix + "/namespaces/{namespace}/pods/{name}", response_model=None)
    async def why(namespace: str, name: str) -> dict[str, Any] | JSONResponse:
        try:
            doc = scheduler.explain(namespace, name)
        except NotFound as exc:
            return status(404, "NotFound", exc.api_message)
        return JSONResponse(
            {
                "kind": "PodExplanation",
                "apiVersion": API_VERSION,
                "metadata": {"name": name, "namespace": namespace},
                "pod": doc,
            }
        )
