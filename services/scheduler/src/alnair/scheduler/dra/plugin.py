"""DynamicResources: ResourceClaims allocated by Alnair's framework, as upstream's plugin does.

Extension points (the framework's protocols, plus the two live-only steps around the Binding):
- PreFilter: the pod's claims from `ClaimCache` (see `claims`). A claim not created yet, a
  malformed reference or a claim shape the allocator refuses is UNSCHEDULABLE_AND_UNRESOLVABLE
  with the reason (preemption cannot help); the binder writes it as a FailedScheduling Event and
  the claim's own event wakes the pod.
- Filter: a node passes when `allocate` succeeds for every unallocated claim on its devices,
  with the capacity of allocated and in-flight claims taken (an allocated claim pins the pod to
  the allocation's nodes). The reason is the allocator's, naming the claim and request.
- GPU choice (`DraGpus`, wrapping the profile's selector): the claim's memory and compute are the
  pod's fractional request (`claims.claim_pod`), so FGD and Alnair's policies pick the GPU as for
  `alnair.io/gpu-memory`; GPUs whose device cannot hold the claim are hidden from them.
- Reserve: allocate on exactly the chosen GPUs (devices `gpu-<index>` of driver
  `gpu.alnair.io`) and count it in flight.
- PreBind (live only, before the Binding): write `status.allocation` and `reservedFor` (the
  pod's real UID) to each claim.
- Unreserve (a Reserve undone, a failed PreBind or Binding): forget the in-flight usage and, for
  claims PreBind already wrote, take the pod's reservation and this scheduler's allocation off
  them on the API server (`unbind`, started as a task since Unreserve is synchronous).
- `bound` after a successful Binding ends the pod's bookkeeping; the claims' watch events make
  the written allocations facts of the cache.

`dra_options` registers the plugin in a `ProfileOptions` (the live binder's path); `with_dra`
adds it to an already built profile (tests of the plugin alone).

Alnair is the only allocator of its DeviceClasses for pods with `schedulerName: alnair`; pods on
kube-scheduler use upstream's allocator on the same slices, and both see each other's claims
through the claims' `status.allocation`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from alnair.common import dra
from alnair.common.errors import InvalidValueError
from alnair.common.kube import ApiError, Conflict, KubeClient, NotFound
from alnair.common.tasks import in_flight
from alnair.scheduler.cluster.requests import IntArray, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.dra.allocator import (
    Device,
    Request,
    UnsupportedClaim,
    Usage,
    allocate,
    claim_results,
    parse_requests,
)
from alnair.scheduler.dra.cel import compile_selector
from alnair.scheduler.dra.claims import ClaimCache, ClaimRef, MalformedClaim
from alnair.scheduler.framework.interface import CycleState, GpuSelector, NodeVerdicts
from alnair.scheduler.framework.runtime import Profile
from alnair.scheduler.framework.status import (
    SKIP,
    SUCCESS,
    Status,
    error,
    unresolvable,
    unschedulable,
)
from alnair.scheduler.plugins.registry import ProfileOptions

log = logging.getLogger(__name__)

Obj = dict[str, Any]

NO_DEVICES = "no DRA devices on the node"


@dataclass
class _Claim:
    ref: ClaimRef
    claim: Obj
    requests: list[Request] = field(default_factory=list)
    nodes: frozenset[str] | None = None
    """Allocated already: the nodes its allocation allows (None: any node)."""

    @property
    def allocated(self) -> bool:
        return bool(claim_results(self.claim))

    @property
    def name(self) -> str:
        return str(self.claim["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.claim["metadata"]["uid"])


@dataclass
class _Cycle:
    claims: list[_Claim]
    usage: dict[str, Usage]
    """Pool (node) -> usage of the claims allocated from it (computed once per cycle)."""

    @property
    def to_allocate(self) -> list[_Claim]:
        return [c for c in self.claims if not c.allocated]


@dataclass
class Written:
    """A claim this scheduler changed for a pod: allocated (results) or only reserved."""

    claim: Obj
    results: tuple[Obj, ...] | None
    node: str
    pod_uid: str = ""
    written: bool = False
    """PreBind wrote it to the API server (a failed bind must take it back there)."""


def allocation_nodes(claim: Obj) -> frozenset[str] | None:
    """The node names an allocation's `nodeSelector` allows (None: any node, or a selector on
    labels, which only node-local allocations of other allocators would write)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
    names: set[str] = set()
    for term in (selector or {}).get("nodeSelectorTerms") or ():
        for f in term.get("matchFields") or ():
            if f.get("key") == "metadata.name" and f.get("operator") == "In":
                names.update(f.get("values") or ())
    return frozenset(names) if names else None


def _identity(results: Sequence[Obj]) -> list[tuple[str, str, str]]:
    """An allocation's devices and share IDs (the API server rewrites quantities, so results
    read back are not equal to those written)."""
    return sorted(
        (str(r.get("pool")), str(r.get("device")), str(r.get("shareID"))) for r in results
    )


def _usage_by_pool(usage: Usage) -> dict[str, Usage]:
    pools: dict[str, Usage] = defaultdict(Usage)
    for uid, results in usage.by_claim.items():
        for pool in {r["pool"] for r in results}:
            pools[pool].by_claim[uid] = [r for r in results if r["pool"] == pool]
    return pools


class DynamicResources:
    """PreFilter, Filter, Reserve/Unreserve over `ClaimCache`; PreBind through `kube`."""

    NAME: ClassVar[str] = "DynamicResources"

    def __init__(
        self,
        cache: ClaimCache,
        kube: KubeClient | None = None,
        *,
        share_id: Callable[[], object] = uuid.uuid4,
    ) -> None:
        self.cache = cache
        self.kube = kube
        """The API server PreBind writes to (None: a simulation, which writes nothing)."""
        self.share_id = share_id
        self.reserved: dict[str, list[Written]] = {}
        """Pod key -> claims Reserve allocated or reserved for it (until bound or undone)."""
        self.undoing: set[asyncio.Task[None]] = set()
        """`unbind` tasks started by Unreserve (awaited by `drain`)."""
        self.taking_back: set[str] = set()
        """Claim uids an `unbind` task is writing (no new cycle allocates them until done)."""

    # --- PreFilter -----------------------------------------------------------------------

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        wanted = self.cache.pods.get(pod.key)
        if wanted is None:
            return SKIP
        try:
            resolved = self.cache.resolve(wanted.namespace, wanted.uid, wanted.refs)
        except MalformedClaim as exc:
            return unresolvable(str(exc), self.NAME)
        if resolved.waiting:
            return unresolvable(resolved.waiting, self.NAME)
        claims: list[_Claim] = []
        for ref, claim in resolved.claims:
            name = claim["metadata"]["name"]
            if claim["metadata"].get("deletionTimestamp"):
                return unresolvable(f"ResourceClaim {name} is being deleted", self.NAME)
            if claim["metadata"]["uid"] in self.cache.in_flight and not claim_results(claim):
                return unschedulable(f"ResourceClaim {name} is being allocated", self.NAME)
            if claim["metadata"]["uid"] in self.taking_back:
                return unschedulable(f"ResourceClaim {name} is being released", self.NAME)
            item = _Claim(ref, claim)
            if item.allocated:
                item.nodes = allocation_nodes(claim)
            else:
                try:
                    item.requests = parse_requests(claim)
                except UnsupportedClaim as exc:
                    return unresolvable(f"ResourceClaim {name}: {exc}", self.NAME)
                except (KeyError, TypeError, ValueError) as exc:
                    return unresolvable(f"ResourceClaim {name} is malformed: {exc!r}", self.NAME)
                if not item.requests:
                    return unresolvable(f"ResourceClaim {name} has no requests", self.NAME)
                refused = self._selectors_refused(item.requests)
                if refused:
                    return unresolvable(f"ResourceClaim {name}: {refused}", self.NAME)
            claims.append(item)
        state.data[self.NAME] = _Cycle(claims, _usage_by_pool(self.cache.usage))
        return SUCCESS

    def _selectors_refused(self, requests: Sequence[Request]) -> str:
        """Why a request's or its class's CEL selector cannot be evaluated ("" when all can)."""
        for q in requests:
            cls = self.cache.classes.get(q.device_class) or {}
            exprs = [
                s["cel"]["expression"]
                for s in (cls.get("spec") or {}).get("selectors") or ()
                if s.get("cel")
            ]
            for expr in [*exprs, *q.selectors]:
                try:
                    compile_selector(expr, dra.DRIVER)
                except InvalidValueError as exc:
                    return f"request {q.name}: {exc}"
        return ""

    # --- Filter --------------------------------------------------------------------------

    def _allocate_all(
        self, cycle: _Cycle, node: str, devices: Sequence[Device], *, commit: bool = False
    ) -> tuple[list[tuple[_Claim, tuple[Obj, ...]]], str]:
        """Allocate every unallocated claim of the cycle on `devices`; ([], reason) on failure."""
        usage = Usage(by_claim=dict(cycle.usage.get(node, Usage()).by_claim))
        done: list[tuple[_Claim, tuple[Obj, ...]]] = []
        for item in cycle.to_allocate:
            try:
                got = allocate(
                    item.claim,
                    item.requests,
                    devices,
                    self.cache.classes,
                    usage,
                    new_share_id=self.share_id if commit else None,
                )
            except (InvalidValueError, KeyError, TypeError, ValueError) as exc:
                return [], f"ResourceClaim {item.name}: {exc}"
            if not got.results:
                return [], f"ResourceClaim {item.name} {got.reason}"
            usage.set_claim(item.uid, got.results)
            done.append((item, got.results))
        return done, ""

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        cycle = state.data.get(self.NAME)
        if not isinstance(cycle, _Cycle):
            return NodeVerdicts(np.ones(nodes.size, dtype=np.bool_))
        passed = np.ones(nodes.size, dtype=np.bool_)
        reasons: dict[str, list[int]] = defaultdict(list)
        with_devices = self.cache.nodes_with_devices()
        for k, n in enumerate(nodes):
            name = snapshot.names[int(n)]
            why = ""
            pinned = [c for c in cycle.claims if c.nodes is not None and name not in c.nodes]
            if pinned:
                why = f"ResourceClaim {pinned[0].name} is allocated on another node"
            elif cycle.to_allocate:
                if name not in with_devices:
                    why = NO_DEVICES
                else:
                    _, why = self._allocate_all(cycle, name, self.cache.devices(name))
            if why:
                passed[k] = False
                reasons[why].append(k)
        failures = []
        for why, ks in reasons.items():
            mask = np.zeros(nodes.size, dtype=np.bool_)
            mask[ks] = True
            failures.append((why, mask))
        return NodeVerdicts(passed, tuple(failures))

    # --- GPU choice ----------------------------------------------------------------------

    def gpus_that_fit(self, state: CycleState, node: str, count: int) -> set[int] | None:
        """GPU indices of `node` whose own device can hold the pod's claims (one device each);
        None when the pod has no claims on Alnair's driver to constrain."""
        cycle = state.data.get(self.NAME)
        if not isinstance(cycle, _Cycle) or not cycle.to_allocate:
            return None
        devices = self.cache.devices(node)
        ours = [d for d in devices if d.driver == dra.DRIVER]
        if not ours:
            return None
        others = [d for d in devices if d.driver != dra.DRIVER]
        single = _Cycle(
            [
                replace(c, requests=[replace(q, count=1) for q in c.requests])
                for c in cycle.to_allocate
            ],
            cycle.usage,
        )
        fit: set[int] = set()
        for dev in ours:
            done, _ = self._allocate_all(single, node, [dev, *others])
            if done:
                fit.add(dra.gpu_index_of(dev.name))
        return fit

    # --- Reserve -------------------------------------------------------------------------

    def reserve(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> Status:
        cycle = state.data.get(self.NAME)
        if not isinstance(cycle, _Cycle):
            return SUCCESS
        node = placement.node_name
        devices = self.cache.devices(node)
        if placement.gpu_indices:
            chosen = {dra.device_name(g) for g in placement.gpu_indices}
            devices = [d for d in devices if d.driver != dra.DRIVER or d.name in chosen]
        done, why = self._allocate_all(cycle, node, devices, commit=True)
        if why:
            where = f" on GPUs {placement.annotation_indices()}" if placement.gpu_indices else ""
            return unschedulable(f"{why}{where}", self.NAME)
        written = [Written(item.claim, results, node, pod.uid) for item, results in done]
        written += [Written(c.claim, None, node, pod.uid) for c in cycle.claims if c.allocated]
        for item, results in done:
            self.cache.assume(item.uid, results)
        self.reserved[pod.key] = written
        return SUCCESS

    def unreserve(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> None:
        self.release(pod.key)

    def release(self, key: str) -> None:
        """Forget what Reserve counted for pod `key` (a failed bind, a released gang, a pod
        deleted); claims PreBind already wrote are taken back on the API server."""
        written = self.reserved.pop(key, [])
        for w in written:
            if w.results is not None:
                self.cache.forget(w.claim["metadata"]["uid"])
        undo = [w for w in written if w.written]
        if undo and self.kube is not None:
            self.taking_back.update(w.claim["metadata"]["uid"] for w in undo)
            in_flight(self._take_back(self.kube, undo), name="dra.take-back", into=self.undoing)

    async def drain(self) -> None:
        """Wait for the `unbind` writes Unreserve started (shutdown, tests)."""
        while self.undoing:
            await asyncio.gather(*self.undoing, return_exceptions=True)

    # --- live: around the Binding ------------------------------------------------------

    async def pre_bind(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> Status:
        """Write each reserved claim's allocation and the pod's reservation before the Binding
        (the kubelet prepares only claims reserved for the pod)."""
        written = self.reserved.get(pod.key, ())
        if written and self.kube is None:
            return error("no API server to write the pod's ResourceClaims to", self.NAME)
        for w in written:
            assert self.kube is not None
            try:
                await self._write(self.kube, w, pod)
            except (ApiError, MalformedClaim) as exc:
                return error(
                    f"writing ResourceClaim {w.claim['metadata']['name']}: {exc}", self.NAME
                )
        # Another allocator may have handed one of these devices to a claim of its own while
        # ours was written: looked at again now, and given back (Unreserve) if so.
        for w in written:
            if w.results is None:
                continue
            clash = self.cache.double_booked(w.claim["metadata"]["uid"], w.results, w.node)
            if clash is not None:
                return error(
                    f"ResourceClaim {w.claim['metadata']['name']}: {clash}; allocated again",
                    self.NAME,
                )
        return SUCCESS

    async def _write(self, kube: KubeClient, w: Written, pod: PodRequest) -> None:
        meta = w.claim["metadata"]
        ref = {"resource": "pods", "name": pod.name, "uid": pod.uid}
        claim = w.claim
        for attempt in range(2):
            status = dict(claim.get("status") or {})
            if w.results is not None:
                if claim_results(claim):
                    raise MalformedClaim(
                        "ResourceClaim", meta["name"], "allocated meanwhile by another scheduler"
                    )
                status["allocation"] = {
                    "devices": {"results": list(w.results)},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [w.node]}
                                ]
                            }
                        ]
                    },
                }
            reserved = list(status.get("reservedFor") or [])
            if not any(x.get("uid") == pod.uid for x in reserved):
                reserved.append(ref)
            status["reservedFor"] = reserved
            try:
                written = await kube.replace(
                    dra.RESOURCECLAIMS, {**claim, "status": status}, sub="status"
                )
                w.claim = written
                w.written = True
                return
            except Conflict:
                if attempt:
                    raise
                claim = await kube.get(dra.RESOURCECLAIMS, meta["name"], meta["namespace"])

    def bound(self, key: str) -> None:
        """The Binding succeeded: the claims' writes are facts now (the watch confirms them)."""
        self.reserved.pop(key, None)

    async def _take_back(self, kube: KubeClient, written: Sequence[Written]) -> None:
        """After a failed bind: take the pod off its claims and deallocate those this scheduler
        allocated and nobody else uses (upstream's Unreserve). A claim whose allocation is no
        longer the one written here is left alone. The claims' pods wake when it is done."""
        try:
            for w in written:
                await self._take_back_one(kube, w)
        finally:
            self.taking_back.difference_update(w.claim["metadata"]["uid"] for w in written)
            self.cache.changed()

    async def _take_back_one(self, kube: KubeClient, w: Written) -> None:
        meta = w.claim["metadata"]
        for attempt in range(2):
            try:
                claim = await kube.get(dra.RESOURCECLAIMS, meta["name"], meta["namespace"])
                if w.results is not None and _identity(claim_results(claim)) != _identity(
                    w.results
                ):
                    return  # allocated anew since (or already taken back)
                status = dict(claim.get("status") or {})
                reserved = [x for x in status.get("reservedFor") or [] if x.get("uid") != w.pod_uid]
                status["reservedFor"] = reserved
                if w.results is not None and not reserved:
                    status.pop("allocation", None)
                    status.pop("reservedFor", None)
                await kube.replace(dra.RESOURCECLAIMS, {**claim, "status": status}, sub="status")
                break
            except NotFound:
                break
            except Conflict:
                if attempt:
                    log.warning("claim not released after a failed bind (conflicts)",
                                extra={"claim": meta["name"]})  # fmt: skip
            except Exception as exc:  # a task of its own: log, never lose it silently
                log.warning(
                    "claim not released after a failed bind",
                    extra={"claim": meta["name"], "error": repr(exc)},
                )
                break


class DraGpus:
    """The profile's GPU selector, held to the GPUs whose device can hold the pod's claims.

    Score plugins such as FGD choose the GPU while scoring the whole snapshot, so the choice is
    checked afterwards rather than the snapshot masked before."""

    NAME: ClassVar[str] = "DraGpus"

    def __init__(self, base: GpuSelector, plugin: DynamicResources) -> None:
        self.base = base
        self.plugin = plugin

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        fit = self.plugin.gpus_that_fit(state, snapshot.names[node], pod.num_gpu)
        chosen = self.base.select_gpus(pod, snapshot, state, node)
        if fit is None or (chosen is not None and set(chosen) <= fit):
            return chosen
        # The policy chose a GPU the allocator cannot use (a device tainted, or filled by claims
        # the snapshot does not count): the tightest GPU that both agree on, else any that fits.
        free = snapshot.gpu_free[node]
        agreed = [g for g in sorted(fit) if free[g] >= pod.gpu_milli]
        ranked = sorted(agreed, key=lambda g: (int(free[g]), g)) or sorted(fit)
        if len(ranked) < pod.num_gpu:
            return None
        return tuple(sorted(ranked[: pod.num_gpu]))


def with_dra(profile: Profile, plugin: DynamicResources) -> Profile:
    """`profile` with DynamicResources at PreFilter, Filter (last: the cheapest filters have
    narrowed the nodes), Reserve and PreBind, and its GPU selector restricted to devices that
    fit."""
    return replace(
        profile,
        pre_filter=(*profile.pre_filter, plugin),
        filter=(*profile.filter, plugin),
        reserve=(*profile.reserve, plugin),
        pre_bind=(*profile.pre_bind, plugin),
        gpu_selector=DraGpus(profile.gpu_selector, plugin),
    )


def dra_options(options: ProfileOptions, plugin: DynamicResources) -> ProfileOptions:
    """`options` with DynamicResources registered at the same points as `with_dra`."""
    return replace(
        options,
        pre_filter=(*options.pre_filter, plugin),
        filter=(*options.filter, plugin),
        reserve=(*options.reserve, plugin),
        pre_bind=(*options.pre_bind, plugin),
        gpu_selector=lambda base: DraGpus(base, plugin),
    )
