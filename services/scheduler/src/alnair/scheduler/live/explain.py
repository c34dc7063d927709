"""Why a pod is where it is, or pending: its request, queue state, the Filter reason per node
and the scores of the best nodes, from a what-if run of the live framework (nothing is
reserved or evicted: an `explain` cycle runs no PostFilter, Reserve or Permit). A pod with
ResourceClaims also shows each claim's requests and allocation, and the allocator's reason
reaches `message`/`filtered` through DynamicResources."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from alnair.common import resources as r
from alnair.common.informer import Informer
from alnair.common.kube import NotFound
from alnair.scheduler.cluster.pods import InvalidPodError, parse_pod
from alnair.scheduler.dra.claims import MalformedClaim
from alnair.scheduler.dra.live import DraSupport
from alnair.scheduler.framework import Framework
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.live.queue import SchedulingQueue


class Explained(Protocol):
    """What an explanation reads of the live scheduler: its pods, cache, queue and claims, and
    a framework to run a what-if cycle with."""

    pods: Informer
    cache: SchedulerCache
    queue: SchedulingQueue
    dra: DraSupport | None

    def framework(self) -> Framework: ...


def explain_pod(scheduler: Explained, namespace: str, name: str) -> dict[str, Any]:
    """What the scheduler knows and would do about one pod (the `/explain` endpoint)."""
    pod = scheduler.pods.get(f"{namespace}/{name}")
    if pod is None:
        raise NotFound(404, "NotFound", f"pod {namespace}/{name} not found", "explain")
    out: dict[str, Any] = {
        "pod": f"{namespace}/{name}",
        "node": (pod.get("spec") or {}).get("nodeName"),
        "annotations": {
            k: v
            for k, v in ((pod["metadata"].get("annotations") or {}).items())
            if k.startswith(r.DOMAIN)
        },
    }
    try:
        req = parse_pod(pod, scheduler.cache.gpu_memory_table())
    except InvalidPodError as exc:
        out["error"] = str(exc)
        return out
    if scheduler.dra is not None and (pod.get("spec") or {}).get("resourceClaims"):
        try:
            req = scheduler.dra.request(pod, req)
        except MalformedClaim as exc:
            out["error"] = str(exc)
        out["claims"] = scheduler.dra.explain(req.key)
    out["request"] = {
        "cpu_milli": req.cpu_milli,
        "memory_mib": req.memory_mib,
        "num_gpu": req.num_gpu,
        "gpu_milli": req.gpu_milli,
        "gpu_models": sorted(req.gpu_models),
        "priority": req.priority,
        "gang": req.gang,
    }
    entry = scheduler.queue.pods.get(pod["metadata"]["uid"])
    if entry is not None:
        out["queue"] = {"attempts": entry.attempts, "message": entry.last_message}
    if out["node"]:
        out["message"] = f"bound to {out['node']}"
        return out
    snapshot = scheduler.cache.snapshot().copy()
    result = scheduler.framework().schedule(req, snapshot, np.random.default_rng(0), explain=True)
    out["message"] = result.message()
    out["filtered"] = {snapshot.names[n]: why for n, why in sorted(result.node_reasons.items())}
    scores = {
        snapshot.names[int(n)]: {
            "total": float(result.scores[k]),
            **{p: float(v[k]) for p, v in result.plugin_scores.items()},
        }
        for k, n in enumerate(result.feasible)
    }
    out["scores"] = dict(sorted(scores.items(), key=lambda kv: -kv[1]["total"])[:20])
    if result.placement is not None:
        out["would_place"] = {
            "node": result.placement.node_name,
            "gpus": list(result.placement.gpu_indices),
        }
    return out
