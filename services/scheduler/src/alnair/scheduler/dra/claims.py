"""The scheduler's view of DRA objects, and which claims a pod needs.

`ClaimCache` is the one owner of ResourceClaims, ResourceSlices and DeviceClasses
(`resource.k8s.io/v1`) as the scheduler sees them: informer handlers feed it, scheduling cycles
read it. It keeps `usage`, the capacity every allocated claim consumes, plus the claims this
scheduler has allocated in a cycle but not yet seen written back (in flight, as upstream's
"in-flight allocations"), so two cycles never hand out the same share.

A pod names its claims in `spec.resourceClaims`: either an existing claim
(`resourceClaimName`) or a template (`resourceClaimTemplateName`), from which
kube-controller-manager's resourceclaim controller creates one claim per pod, records its name
in `status.resourceClaimStatuses` and makes the pod its controlling owner. The claim is found by
that status, else by the owner reference and the `resource.kubernetes.io/pod-claim-name`
annotation the controller writes (the claim's own watch event can arrive before the pod's
status update). Until it exists the pod waits; the claim's ADDED event wakes it (`on_change`),
no timer.

A node that publishes its GPUs only through a ResourceSlice (the DRA driver without the device
plugin: no `nvidia.com/gpu` capacity) gets its snapshot GPU columns from the slice: `node_gpus`
(count, model, memory per device), and `on_node_gpus(node)` when they may have changed.

`claim_pod` gives a parsed pod the GPUs its claims ask of Alnair's driver as the snapshot's
request (whole GPUs, or one fraction: the larger of
compute and memory, memory measured against the smallest GPU the slices publish), so FGD and
Alnair's policies choose the GPU as they do for `alnair.io/gpu-memory`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.informer import WatchEvent
from alnair.common.resources import parse_quantity as r_parse
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.dra.allocator import (
    Device,
    Request,
    UnsupportedClaim,
    Usage,
    claim_results,
    node_devices,
    parse_requests,
)

Obj = dict[str, Any]
R = TypeVar("R", bound=PodRequest)

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set by the resourceclaim controller on a claim made from a template: the pod's claim entry."""


class MalformedClaim(InvalidValueError):
    """A pod's claim reference, or the claim itself, cannot be read (not a capacity problem)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One `spec.resourceClaims` entry of a pod."""

    entry: str
    """The entry's name in the pod (what containers list in `resources.claims`)."""
    claim: str | None
    """The claim's name; None while a template's claim is not created yet."""
    template: str = ""


@dataclass(frozen=True, slots=True)
class PodClaims:
    """The claims one pod references (what the DynamicResources plugin looks up by pod key)."""

    namespace: str
    uid: str
    refs: tuple[ClaimRef, ...]


def claim_refs(pod: Obj) -> tuple[ClaimRef, ...]:
    """The pod's claim entries, resolved to claim names where the API already says them."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    named = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    refs = []
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        name = entry.get("name") or ""
        if not name:
            raise MalformedClaim(f"spec.resourceClaims[{i}].name", name, "an entry needs a name")
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if bool(claim) == bool(template):
            raise MalformedClaim(
                f"spec.resourceClaims[{i}]",
                name,
                "exactly one of resourceClaimName and resourceClaimTemplateName",
            )
        if claim:
            refs.append(ClaimRef(entry=name, claim=claim))
        else:
            refs.append(ClaimRef(entry=name, claim=named.get(name), template=template))
    return tuple(refs)


@dataclass(frozen=True)
class Resolved:
    """A pod's claims as they are now: objects, or what is still missing."""

    claims: tuple[tuple[ClaimRef, Obj], ...] = ()
    waiting: str = ""
    """Non-empty: a claim does not exist yet (the pod waits for its event)."""


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What a node's slice publishes of Alnair's GPUs, in the snapshot's terms."""

    count: int
    model: str
    memory_mib: int
    """The smallest device's memory (every GPU of a snapshot node has one size)."""


class ClaimCache:
    """ResourceClaims, ResourceSlices and DeviceClasses, plus the capacity claims consume."""

    def __init__(
        self,
        on_change: Callable[[], object] | None = None,
        on_health: Callable[[str, int, bool], None] | None = None,
        on_node_gpus: Callable[[str], None] | None = None,
    ) -> None:
        self.claims: dict[str, Obj] = {}
        """`namespace/name` -> claim."""
        self.owned: dict[tuple[str, str], str] = {}
        """(owner pod uid, pod claim entry) -> claim key, for claims made from templates."""
        self.slices: dict[str, Obj] = {}
        self.classes: dict[str, Obj] = {}
        self.usage = Usage()
        self.in_flight: dict[str, tuple[Obj, ...]] = {}
        """Claim uid -> results this scheduler allocated and has not seen written yet."""
        self.pods: dict[str, PodClaims] = {}
        """Pod key -> the claims it references (set by `claim_pod`, dropped by `forget_pod`)."""
        self._uid_key: dict[str, str] = {}
        self._devices: dict[str, list[Device]] = {}
        self._on_change = on_change or (lambda: None)
        self._on_health = on_health or (lambda _node, _gpu, _healthy: None)
        self._on_node_gpus = on_node_gpus or (lambda _node: None)
        self.tainted: dict[str, frozenset[int]] = {}
        """Node -> indices of Alnair GPUs whose device carries the unhealthy taint."""

    def double_booked(self, claim_uid: str, results: Iterable[Obj], node: str) -> str | None:
        """Why `results` (the allocation of claim `claim_uid`) share a device beyond what it
        has with another claim, or None. Another allocator on the same slices (kube-scheduler's
        for its own pods) sees this scheduler's claims only as they are written, as this one
        sees its: two allocations made at once land on one device unchecked unless each side
        looks again after writing. Whole devices may hold one claim; shared ones, what their
        capacity adds up to."""
        devices = {d.key: d for d in self.devices(node)}
        for mine in results:
            key = (mine["driver"], mine["pool"], mine["device"])
            others = [
                (uid, r)
                for uid, rs in self.usage.by_claim.items()
                if uid != claim_uid
                for r in rs
                if (r["driver"], r["pool"], r["device"]) == key
            ]
            if not others:
                continue
            holder = self._uid_key.get(others[0][0], others[0][0])
            if mine.get("consumedCapacity") is None or any(
                r.get("consumedCapacity") is None for _, r in others
            ):
                return f"device {key[2]} is allocated to ResourceClaim {holder} too"
            device = devices.get(key)
            for name, spec in (device.capacity if device else {}).items():
                total = sum(
                    (
                        r_parse(r.get("consumedCapacity", {}).get(name, "0"))
                        for r in (mine, *(r for _, r in others))
                    ),
                    Decimal(0),
                )
                if total > spec.value:
                    return (
                        f"device {key[2]}: {total} of {name} allocated, {spec.value} there "
                        f"(with ResourceClaim {holder})"
                    )
        return None

    # --- informer handlers -------------------------------------------------------------

    def on_claim(self, event: WatchEvent, claim: Obj, old: Obj | None) -> None:
        meta = claim["metadata"]
        key, uid = f"{meta.get('namespace', '')}/{meta['name']}", meta.get("uid", "")
        owners = [
            o["uid"]
            for o in meta.get("ownerReferences") or ()
            if o.get("kind") == "Pod" and o.get("controller")
        ]
        entry = (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION)
        if event is WatchEvent.DELETED:
            self.claims.pop(key, None)
            self._uid_key.pop(uid, None)
            for owner in owners:
                if entry:
                    self.owned.pop((owner, entry), None)
            self.in_flight.pop(uid, None)
            freed = uid in self.usage.by_claim
            self.usage.forget(uid)
            if freed:
                self._on_change()
            return
        self.claims[key] = claim
        self._uid_key[uid] = key
        for owner in owners:
            if entry:
                self.owned[(owner, entry)] = key
        results = claim_results(claim)
        if uid in self.in_flight and not results:
            return  # our allocation is being written; keep counting it
        self.in_flight.pop(uid, None)
        had = self.usage.by_claim.get(uid)
        self.usage.set_claim(uid, results)
        if old is None or (had and not results):
            self._on_change()  # a claim a pod waits for, or capacity freed

    def on_slice(self, event: WatchEvent, slice_: Obj, old: Obj | None) -> None:
        name = slice_["metadata"]["name"]
        node = (slice_.get("spec") or {}).get("nodeName") or ""
        if event is WatchEvent.DELETED:
            self.slices.pop(name, None)
        else:
            self.slices[name] = slice_
        before = ((old.get("spec") or {}).get("nodeName") or "") if old is not None else ""
        self._devices.pop(before, None)
        self._devices.pop(node, None)
        if before and before != node:
            self._on_node_gpus(before)
        if node:
            self._follow_taints(node)
            self._on_node_gpus(node)
        if event is not WatchEvent.DELETED:
            self._on_change()

    def _follow_taints(self, node: str) -> None:
        """Tell the GPU health view (the snapshot's withheld GPUs) about the unhealthy taints
        of Alnair's devices, so policies scoring the snapshot avoid them too."""
        now = frozenset(
            dra.gpu_index_of(d.name)
            for d in self.devices(node)
            if d.driver == dra.DRIVER and any(t.key == dra.TAINT_UNHEALTHY for t in d.taints)
        )
        before = self.tainted.get(node, frozenset())
        if now:
            self.tainted[node] = now
        else:
            self.tainted.pop(node, None)
        for gpu in sorted(now - before):
            self._on_health(node, gpu, False)
        for gpu in sorted(before - now):
            self._on_health(node, gpu, True)

    def on_class(self, event: WatchEvent, cls: Obj, old: Obj | None) -> None:
        name = cls["metadata"]["name"]
        if event is WatchEvent.DELETED:
            self.classes.pop(name, None)
        else:
            self.classes[name] = cls
            self._on_change()

    # --- reading ---------------------------------------------------------------------

    def devices(self, node: str) -> list[Device]:
        """The node's devices from its slices (cached until one of its slices changes)."""
        found = self._devices.get(node)
        if found is None:
            found = node_devices(self.slices.values(), node)
            self._devices[node] = found
        return found

    def node_gpus(self, node: str) -> NodeGpus | None:
        """The node's GPUs as Alnair's driver publishes them (None: it publishes none)."""
        ours = [d for d in self.devices(node) if d.driver == dra.DRIVER]
        indices = []
        for d in ours:
            try:
                indices.append(dra.gpu_index_of(d.name))
            except InvalidValueError:
                continue  # not one of the driver's GPU devices
        if not indices:
            return None
        sizes = [
            int(cap.value / dra.MIB)
            for d in ours
            if (cap := d.capacity.get(dra.CAPACITY_MEMORY)) is not None
        ]
        models = sorted({str(m) for d in ours if (m := d.view.attributes.get(dra.ATTR_MODEL))})
        return NodeGpus(
            count=max(indices) + 1,
            model=models[0] if models else "",
            memory_mib=min(sizes) if sizes else 0,
        )

    def nodes_with_devices(self) -> set[str]:
        return {n for s in self.slices.values() if (n := (s.get("spec") or {}).get("nodeName"))}

    def smallest_gpu_mib(self) -> int | None:
        """The smallest memory capacity among the Alnair driver's devices, in MiB."""
        sizes = [
            value
            for s in self.slices.values()
            if (s.get("spec") or {}).get("driver") == dra.DRIVER
            for d in (s.get("spec") or {}).get("devices") or ()
            if (value := _memory(d)) is not None
        ]
        return int(min(sizes) / dra.MIB) if sizes else None

    def resolve(self, namespace: str, uid: str, refs: Iterable[ClaimRef]) -> Resolved:
        """The current claim objects behind `refs` of pod `uid`."""
        found: list[tuple[ClaimRef, Obj]] = []
        for ref in refs:
            key = f"{namespace}/{ref.claim}" if ref.claim else self.owned.get((uid, ref.entry))
            claim = self.claims.get(key) if key else None
            if claim is None:
                what = ref.claim or f"from template {ref.template}"
                return Resolved(waiting=f"waiting for ResourceClaim {what} (pod claim {ref.entry})")
            if ref.template and not _owned_by(claim, uid):
                raise MalformedClaim(
                    f"spec.resourceClaims[{ref.entry}]",
                    claim["metadata"]["name"],
                    "the claim made from the template is not owned by this pod",
                )
            found.append((ref, claim))
        return Resolved(claims=tuple(found))

    def forget_pod(self, key: str) -> None:
        """The pod is gone or bound: its claim references are no longer needed."""
        self.pods.pop(key, None)

    # --- in-flight allocations -------------------------------------------------------

    def assume(self, claim_uid: str, results: Iterable[Obj]) -> None:
        """Count an allocation made in a cycle until its write is seen (or it is forgotten)."""
        kept = tuple(results)
        self.in_flight[claim_uid] = kept
        self.usage.set_claim(claim_uid, kept)

    def changed(self) -> None:
        """Something the cache does not see changed (a claim released): wake waiting pods."""
        self._on_change()

    def forget(self, claim_uid: str) -> None:
        """Undo `assume`: usage goes back to what the API server shows for the claim."""
        if self.in_flight.pop(claim_uid, None) is None:
            return
        key = self._uid_key.get(claim_uid)
        claim = self.claims.get(key) if key else None
        self.usage.set_claim(claim_uid, claim_results(claim) if claim else [])
        self._on_change()


def _owned_by(claim: Obj, uid: str) -> bool:
    return any(
        o.get("uid") == uid and o.get("kind") == "Pod"
        for o in claim["metadata"].get("ownerReferences") or ()
    )


def _memory(device: Obj) -> Decimal | None:
    raw = (device.get("capacity") or {}).get(dra.CAPACITY_MEMORY)
    if raw is None:
        return None
    return r.parse_quantity(raw["value"], "capacity.memory")


def gpu_request(requests: Iterable[Request], smallest_mib: int | None) -> tuple[int, int] | None:
    """(number of GPUs, milli-GPU each) the requests ask of Alnair's classes, or None when
    they ask for nothing the snapshot models; MalformedClaim for a shape it cannot model."""
    whole = 0
    shares: list[Request] = []
    for req in requests:
        if req.device_class not in dra.CLASSES:
            continue
        if req.capacity:
            shares.extend([req] * req.count)
        else:
            whole += req.count
    if not whole and not shares:
        return None
    if shares and (whole or len(shares) > 1):
        raise MalformedClaim(
            "request",
            shares[0].name,
            "a GPU share must be the pod's only GPU request (one shim per container)",
        )
    if whole:
        return whole, r.MILLI_PER_GPU
    share = shares[0]
    compute = share.capacity.get(dra.CAPACITY_COMPUTE)
    memory = share.capacity.get(dra.CAPACITY_MEMORY)
    milli = math.ceil(compute * 10) if compute is not None else r.MILLI_PER_GPU
    if memory is not None and smallest_mib:
        milli = max(milli, math.ceil(memory / dra.MIB * r.MILLI_PER_GPU / smallest_mib))
    elif memory is None and compute is None:
        milli = r.MILLI_PER_GPU
    return 1, max(1, min(milli, r.MILLI_PER_GPU))


def claim_pod(pod: Obj, req: R, cache: ClaimCache, smallest_mib: int | None = None) -> R:
    """`req` with the GPUs the pod's claims ask for as its GPU request; records the pod's
    claims in `cache.pods` for the DynamicResources plugin (`cache.forget_pod` drops them).

    Pods without claims come back unchanged. Claims not created yet leave the GPU request
    empty (the plugin's PreFilter makes the pod wait). Raises MalformedClaim.
    """
    refs = claim_refs(pod)
    meta = pod["metadata"]
    if not refs:
        cache.pods.pop(req.key, None)
        return req
    namespace = meta.get("namespace", "default")
    cache.pods[req.key] = PodClaims(namespace, meta.get("uid", ""), refs)
    resolved = cache.resolve(namespace, meta.get("uid", ""), refs)
    if resolved.waiting:
        return req
    requests: list[Request] = []
    for _ref, claim in resolved.claims:
        try:
            requests.extend(parse_requests(claim))
        except UnsupportedClaim:
            continue  # the plugin refuses it with the allocator's reason
        except (InvalidValueError, KeyError, TypeError, ValueError) as exc:
            raise MalformedClaim(
                "ResourceClaim", claim["metadata"]["name"], f"unreadable: {exc}"
            ) from exc
    asked = gpu_request(requests, smallest_mib or cache.smallest_gpu_mib())
    if asked is None:
        return req
    if req.num_gpu:
        raise MalformedClaim(
            r.GPU, req.num_gpu, "ask for GPUs through claims or resources, not both"
        )
    return replace(req, num_gpu=asked[0], gpu_milli=asked[1])


def request_from_claims(
    name: str,
    claims: Iterable[Obj],
    gpu_memory_mib: int,
    *,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    namespace: str = "default",
) -> PodRequest:
    """A simulated pod's request from its claims, in the units of `alnair.io/gpu-memory` and
    `alnair.io/gpu-compute` (memory against a GPU of `gpu_memory_mib`): what the simulator and
    what-if tools replay. Raises MalformedClaim or UnsupportedClaim naming the claim."""
    requests: list[Request] = []
    for claim in claims:
        try:
            requests.extend(parse_requests(claim))
        except UnsupportedClaim:
            raise
        except (InvalidValueError, KeyError, TypeError, ValueError) as exc:
            claim_name = (claim.get("metadata") or {}).get("name", "")
            raise MalformedClaim("ResourceClaim", claim_name, f"unreadable: {exc}") from exc
    asked = gpu_request(requests, gpu_memory_mib) or (0, 0)
    return PodRequest(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        num_gpu=asked[0],
        gpu_milli=asked[1],
        namespace=namespace,
    )
