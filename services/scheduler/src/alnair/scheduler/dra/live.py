"""DRA in the live scheduler: the informers, the claim cache and the plugin, as one part.

The binder wires it in a few places (see docs/notes/issue-17.md):
- `informers()` join the scheduler's (readiness checks them; crash-only like the rest);
- `request(pod, req)` after `parse_pod`, for queued and bound pods alike, gives a pod with
  claims its GPU request (so the snapshot counts claim pods as it counts `alnair.io/gpu-*`);
- `profile(profile)` adds DynamicResources at PreFilter/Filter/Reserve and holds the GPU
  selector to devices that fit;
- `pre_bind(pod)` before the Binding writes the claims; `unbind(pod)` after a failed Binding
  clears them; `bound(key)` after a successful one; `forget_pod(key)` when the pod is gone.
Claim, slice and class events call `on_change` (wake unschedulable pods: a claim was created,
capacity freed, a slice or class changed); unhealthy taints on Alnair's devices call
`on_health(node, gpu, healthy)`, the same path the profiler's health events take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from alnair.common import dra
from alnair.common.informer import Informer
from alnair.common.kube import KubeClient, Obj
from alnair.scheduler.dra.allocator import claim_results, parse_requests
from alnair.scheduler.dra.claims import ClaimCache, MalformedClaim, claim_pod
from alnair.scheduler.dra.plugin import DynamicResources, with_dra
from alnair.scheduler.framework.runtime import Profile
from alnair.scheduler.framework.status import Status
from alnair.scheduler.snapshot import PodRequest

R = TypeVar("R", bound=PodRequest)


class DraSupport:
    def __init__(
        self,
        kube: KubeClient,
        *,
        on_change: Callable[[], None],
        on_health: Callable[[str, int, bool], None] | None = None,
    ) -> None:
        self.kube = kube
        self.cache = ClaimCache(on_change=on_change, on_health=on_health)
        self.plugin = DynamicResources(self.cache)
        self.claims = Informer(kube, dra.RESOURCECLAIMS, name="resourceclaims")
        self.slices = Informer(kube, dra.RESOURCESLICES, name="resourceslices")
        self.classes = Informer(kube, dra.DEVICECLASSES, name="deviceclasses")
        self.claims.add_handler(self.cache.on_claim)
        self.slices.add_handler(self.cache.on_slice)
        self.classes.add_handler(self.cache.on_class)

    def informers(self) -> list[Informer]:
        return [self.classes, self.slices, self.claims]

    def request(self, pod: Obj, req: R) -> R:
        """`req` with its claims' GPUs (MalformedClaim, an InvalidValueError, names a bad one)."""
        return claim_pod(pod, req, self.cache)

    def profile(self, profile: Profile) -> Profile:
        return with_dra(profile, self.plugin)

    async def pre_bind(self, pod: PodRequest) -> Status:
        return await self.plugin.pre_bind(self.kube, pod)

    async def unbind(self, pod: PodRequest) -> None:
        await self.plugin.unbind(self.kube, pod)

    def bound(self, key: str) -> None:
        self.plugin.bound(key)

    def release(self, key: str) -> None:
        self.plugin.release(key)

    def forget_pod(self, key: str) -> None:
        self.plugin.release(key)
        self.cache.forget_pod(key)

    def explain(self, key: str) -> list[dict[str, Any]]:
        return explain_claims(self.cache, key)


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
