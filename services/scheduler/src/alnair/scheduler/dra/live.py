"""DRA in the live scheduler: the informers, the claim cache and the plugin, as one part.

`Scheduler` (live/scheduler.py) turns it on at start (`settings.dra`: `auto` asks the API server
with `unavailable`, so a cluster that does not serve `resource.k8s.io/v1`, or a scheduler
without RBAC for it, keeps scheduling without DRA) and wires it in:
- `informers()` join the scheduler's (crash-only, readiness checks them) and sync before the
  pods informer, so a bound pod's claims are known when it is counted;
- `resolve(pod, req)` in the scheduling cycle (only for pods with `spec.resourceClaims`) gives
  the pod its claims' GPU request, or says which claim it waits for; the cache's `request` and
  `allocated_gpus` do the same for bound pods (`SchedulerCache.claims`);
- `options(options)` registers DynamicResources in the profile (PreFilter, Filter, GPU choice,
  Reserve, PreBind; Unreserve after a failed bind takes the claims back);
- `bound(key)` after a Binding, `forget_pod(key)` when the pod is gone;
- `node_gpus(node)` sizes the snapshot row of a node that publishes GPUs only in a slice.
Claim, slice and class events call `on_change` (wake unschedulable pods: a claim was created,
capacity freed, a slice or class changed); unhealthy taints on Alnair's devices call
`on_health(node, gpu, healthy)`, the same path the profiler's health events take; a slice
change calls `on_node_gpus(node)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from alnair.common import dra
from alnair.common.errors import InvalidValueError
from alnair.common.informer import Informer
from alnair.common.kube import ApiError, KubeClient, NotFound, Obj
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.dra.allocator import claim_results, parse_requests
from alnair.scheduler.dra.claims import ClaimCache, MalformedClaim, claim_pod
from alnair.scheduler.dra.plugin import DynamicResources, dra_options, with_dra
from alnair.scheduler.framework.runtime import Profile
from alnair.scheduler.plugins.registry import ProfileOptions

R = TypeVar("R", bound=PodRequest)


async def unavailable(kube: KubeClient) -> str:
    """Why this scheduler cannot schedule with DRA ("" when it can): the API server does not
    serve `resource.k8s.io/v1`, or RBAC does not let it list claims, slices or classes."""
    for res in (dra.DEVICECLASSES, dra.RESOURCESLICES, dra.RESOURCECLAIMS):
        try:
            await kube.request("GET", res.path(), params={"limit": 1})
        except NotFound:
            return f"the API server does not serve {res.group}/{res.version} {res.plural}"
        except ApiError as exc:
            return f"listing {res.plural} refused: {exc}"
    return ""


class DraSupport:
    def __init__(
        self,
        kube: KubeClient,
        *,
        on_change: Callable[[], object],
        on_health: Callable[[str, int, bool], None] | None = None,
        on_node_gpus: Callable[[str], None] | None = None,
    ) -> None:
        self.kube = kube
        self.cache = ClaimCache(on_change=on_change, on_health=on_health, on_node_gpus=on_node_gpus)
        self.plugin = DynamicResources(self.cache, kube)
        self.claims = Informer(kube, dra.RESOURCECLAIMS, name="resourceclaims")
        self.slices = Informer(kube, dra.RESOURCESLICES, name="resourceslices")
        self.classes = Informer(kube, dra.DEVICECLASSES, name="deviceclasses")
        self.claims.add_handler(self.cache.on_claim)
        self.slices.add_handler(self.cache.on_slice)
        self.classes.add_handler(self.cache.on_class)
        self.typical: set[str] = set()
        """Pods whose claim request joined the scheduler's workload (dropped with the pod)."""

    def informers(self) -> list[Informer]:
        return [self.classes, self.slices, self.claims]

    def request(self, pod: Obj, req: R) -> R:
        """`req` with its claims' GPUs (MalformedClaim, an InvalidValueError, names a bad one)."""
        return claim_pod(pod, req, self.cache)

    def resolve(self, pod: Obj, req: R) -> tuple[R, str]:
        """`request`, and why the pod waits ("" when every claim exists)."""
        full = claim_pod(pod, req, self.cache)
        wanted = self.cache.pods.get(req.key)
        if wanted is None:
            return full, ""
        return full, self.cache.resolve(wanted.namespace, wanted.uid, wanted.refs).waiting

    def allocated_gpus(self, pod: Obj, node: str) -> tuple[int, ...] | None:
        """GPU indices of `node` that the pod's claims are allocated on (Alnair's driver)."""
        wanted = self.cache.pods.get(pod["metadata"]["uid"])
        if wanted is None:
            return None
        try:
            resolved = self.cache.resolve(wanted.namespace, wanted.uid, wanted.refs)
        except MalformedClaim:
            return None
        gpus: set[int] = set()
        for _ref, claim in resolved.claims:
            for res in claim_results(claim):
                if res.get("driver") == dra.DRIVER and res.get("pool") == dra.pool_name(node):
                    try:
                        gpus.add(dra.gpu_index_of(str(res.get("device"))))
                    except InvalidValueError:
                        continue
        return tuple(sorted(gpus)) if gpus and not resolved.waiting else None

    def node_gpus(self, node: str) -> tuple[int, str, int] | None:
        """(GPUs, model, memory MiB) of Alnair's devices in the node's slice, if any."""
        got = self.cache.node_gpus(node)
        return None if got is None else (got.count, got.model, got.memory_mib)

    def options(self, options: ProfileOptions) -> ProfileOptions:
        return dra_options(options, self.plugin)

    def profile(self, profile: Profile) -> Profile:
        return with_dra(profile, self.plugin)

    def bound(self, key: str) -> None:
        self.plugin.bound(key)

    def forget_pod(self, key: str) -> None:
        self.plugin.release(key)
        self.cache.forget_pod(key)
        self.typical.discard(key)

    def explain(self, key: str) -> list[dict[str, Any]]:
        return explain_claims(self.cache, key)

    async def drain(self) -> None:
        await self.plugin.drain()


def explain_claims(cache: ClaimCache, key: str) -> list[dict[str, Any]]:
    """The pod's claims for the explain API: each request, and the allocation if any."""
    wanted = cache.pods.get(key)
    if wanted is None:
        return []
    out: list[dict[str, Any]] = []
    for ref in wanted.refs:
        item: dict[str, Any] = {"pod_claim": ref.entry, "claim": ref.claim}
        try:
            resolved = cache.resolve(wanted.namespace, wanted.uid, [ref])
        except MalformedClaim as exc:
            out.append({**item, "error": str(exc)})
            continue
        if resolved.waiting:
            out.append({**item, "waiting": resolved.waiting})
            continue
        [(_, claim)] = resolved.claims
        item["claim"] = claim["metadata"]["name"]
        try:
            item["requests"] = [
                {
                    "name": q.name,
                    "device_class": q.device_class,
                    "count": q.count,
                    "capacity": {k: str(v) for k, v in sorted(q.capacity.items())},
                }
                for q in parse_requests(claim)
            ]
        except (MalformedClaim, KeyError, TypeError, ValueError) as exc:
            item["error"] = str(exc)
        results = claim_results(claim)
        if results:
            item["allocation"] = [
                {k: r[k] for k in ("request", "pool", "device", "consumedCapacity") if k in r}
                for r in results
            ]
        out.append(item)
    return out
