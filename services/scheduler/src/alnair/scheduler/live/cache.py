"""The scheduler cache: the live cluster as a `ClusterSnapshot`, kept current by watch events.

One owner (the scheduler's event handlers, on one event loop) changes it; scheduling cycles read
it between changes. Nodes and their capacity come from Node objects (allocatable CPU, memory,
`nvidia.com/gpu`, the `alnair.io/gpu-model` label); consumption comes from every pod bound to a
node and not finished, placed on the GPUs its `alnair.io/gpu-indices` annotation names (pods
bound by someone else get the first free GPUs, as the device plugin would hand them out), plus
the pods this scheduler has assumed while their Binding is in flight ("assumed pods", as in
upstream's cache, so two cycles never give away the same GPU).

Pods with ResourceClaims (DRA) get their GPU request from the claims through `claims`, and a
bound one sits on the GPUs its claims' allocation names; a node that publishes its GPUs only in
a ResourceSlice (no `nvidia.com/gpu`) gets its GPU columns from the slice (`set_slice_gpus`).

A change in the set of nodes or their capacity rebuilds the snapshot (rare); everything else is
an incremental assume/forget. Unhealthy GPUs are withheld: their free milli-GPU is parked in
`withheld` so no plugin can place on them, and returned when the GPU is healthy again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.common.topology import Topology
from alnair.scheduler.cluster.books import GangBook, Nominations, Reservations
from alnair.scheduler.cluster.budgets import DisruptionBudgets
from alnair.scheduler.cluster.pods import (
    MODELLED_RESOURCES,
    LivePod,
    parse_bound_pod,
    placement_annotations,
)
from alnair.scheduler.cluster.requests import (
    MAX_GPUS_PER_NODE,
    UNLIMITED,
    NodeSpec,
    Placement,
    PodRequest,
)
from alnair.scheduler.cluster.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


MODELLED = MODELLED_RESOURCES | {"pods"}
"""What a node reports that is not an `extra`: the snapshot's own arrays and the pod count."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    spec: NodeSpec
    taints: tuple[Obj, ...]
    labels: dict[str, str]
    pods: int = UNLIMITED
    extra: tuple[tuple[str, int], ...] = ()
    """Allocatable of the resources outside `MODELLED`, in whole units (bytes for sizes)."""


def node_info(node: Obj) -> NodeInfo:
    meta, status = node["metadata"], node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    labels = dict(meta.get("labels") or {})
    gpus = int(r.parse_quantity(alloc.get(r.GPU, 0), r.GPU))
    taints = [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in BLOCKING_EFFECTS
    ]
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    conds = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    if not ready and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    spec = NodeSpec(
        name=meta["name"],
        cpu_milli=r.cpu_milli(alloc.get("cpu", 0)),
        memory_mib=r.memory_mib(alloc.get("memory", 0)),
        gpu_count=min(gpus, MAX_GPUS_PER_NODE),
        gpu_model=labels.get(r.LABEL_GPU_MODEL, "") if gpus else "",
    )
    pods = alloc.get("pods")
    extra = tuple(
        sorted(
            (name, math.floor(float(r.parse_quantity(q, name))))
            for name, q in alloc.items()
            if name not in MODELLED
        )
    )
    return NodeInfo(
        spec=spec,
        taints=tuple(taints),
        labels=labels,
        pods=UNLIMITED if pods is None else int(r.parse_quantity(pods, "pods")),
        extra=extra,
    )


class ClaimView(Protocol):
    """What the cache asks of DRA about a bound pod with ResourceClaims (`dra.live`)."""

    def request(self, pod: Obj, req: LivePod) -> LivePod:
        """`req` with the GPUs the pod's claims ask for (MalformedClaim names a bad claim)."""
        ...

    def allocated_gpus(self, pod: Obj, node: str) -> tuple[int, ...] | None:
        """The GPU indices the pod's claims are allocated on `node` (None: not known)."""
        ...


class SchedulerCache:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.bound: dict[str, tuple[LivePod, str, Obj]] = {}
        """uid -> (request, node name, pod object) for pods running on a node."""
        self.assumed: dict[str, tuple[LivePod, Placement]] = {}
        self.unhealthy: set[tuple[str, int]] = set()
        self.util: dict[tuple[str, int], float] = {}
        """Measured use per (node, GPU): the sum of its pods' latest shares, at most 100."""
        self.util_shares: dict[tuple[str, int], dict[str, float]] = {}
        """Each pod's latest measured share of each GPU it runs on (by pod uid)."""
        self.util_of_pod: dict[str, set[tuple[str, int]]] = {}
        """The GPUs each pod has a share on (so a pod's end finds them at once)."""
        self.mem_of_pod: dict[str, dict[tuple[str, int], float]] = {}
        """Each pod's latest measured GPU memory (MiB) per GPU it runs on (`kubectl alnair
        top`); gone with the pod."""
        self._snap: ClusterSnapshot | None = None
        self._memory_table: dict[str, int] | None = None
        self.rebuilds = 0
        self.reservations = Reservations()
        self.gangs = GangBook()
        self.budgets = DisruptionBudgets()
        self.nominations = Nominations()
        """Preemptors waiting for their victims, and victims being deleted (the binder's
        background deletes): counted by preemption and `NominatedPods`, ended here when the
        preemptor is placed or either is gone."""
        self.topology: dict[str, Topology] = {}
        """Node name -> GPU link matrix (GpuInventory.topology), when the profiler sent one."""
        self.claims: ClaimView | None = None
        """DRA, when enabled: requests and GPUs of bound pods with ResourceClaims."""
        self.slice_gpus: dict[str, tuple[int, str, int]] = {}
        """Node -> (GPUs, model, memory MiB) its ResourceSlice publishes (used for a node
        without `nvidia.com/gpu` capacity)."""

    # --- reading -------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        if self._snap is None:
            self._snap = self._build()
        return self._snap

    def gpu_memory_table(self) -> dict[str, int]:
        """GPU memory per model: the nodes' labels, else the built-in table (cached)."""
        if self._memory_table is not None:
            return self._memory_table
        table = dict(r.GPU_MODEL_MEMORY_MIB)
        for _count, model, mib in self.slice_gpus.values():
            if model and mib:
                table.setdefault(model, mib)
        for info in self.nodes.values():
            mem = info.labels.get(r.LABEL_GPU_MEMORY_MIB)
            if info.spec.gpu_model and mem and mem.isdigit():
                table[info.spec.gpu_model] = int(mem)
        self._memory_table = table
        return table

    def drop_derived(self) -> None:
        """Forget what plugins derived from the snapshot (`ClusterSnapshot.memo`): a new
        profile's plugins key their entries anew, the old ones' would stay for good."""
        if self._snap is not None:
            self._snap.memo.clear()

    def is_placed(self, uid: str) -> bool:
        return uid in self.assumed or uid in self.bound

    # --- nodes ---------------------------------------------------------------------------

    def upsert_node(self, node: Obj) -> bool:
        """Returns True when the node is new or gained room (pods may now fit)."""
        info = node_info(node)
        old = self.nodes.get(info.spec.name)
        self.nodes[info.spec.name] = info
        if old is None or old.labels != info.labels:
            self._memory_table = None
        if old is None or (old.spec, old.pods, old.extra) != (info.spec, info.pods, info.extra):
            self._snap = None
            return True
        if old.taints != info.taints or old.labels != info.labels:
            if self._snap is not None:
                i = self._snap.node_index(info.spec.name)
                self._snap.taints[i] = info.taints
                self._snap.tainted[i] = bool(info.taints)
                self._snap.set_labels(i, info.labels)
                self._snap.generation[i] += 1
            return len(info.taints) < len(old.taints) or old.labels != info.labels
        return False

    def set_slice_gpus(self, node: str, gpus: tuple[int, str, int] | None) -> bool:
        """The GPUs `node`'s ResourceSlice publishes (None: no slice); True when a node
        without `nvidia.com/gpu` changed its GPU columns (pods may now fit)."""
        old = self.slice_gpus.get(node)
        if gpus is None:
            self.slice_gpus.pop(node, None)
        else:
            self.slice_gpus[node] = gpus
        if old == gpus:
            return False
        self._memory_table = None
        info = self.nodes.get(node)
        if info is None or info.spec.gpu_count:
            return False
        self._snap = None
        return True

    def _spec(self, info: NodeInfo) -> NodeSpec:
        """The node's row: its own GPU capacity, else what its ResourceSlice publishes."""
        got = self.slice_gpus.get(info.spec.name)
        if info.spec.gpu_count or got is None:
            return info.spec
        count, model, _mib = got
        return replace(
            info.spec,
            gpu_count=min(count, MAX_GPUS_PER_NODE),
            gpu_model=info.labels.get(r.LABEL_GPU_MODEL) or model,
        )

    def delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self._snap = None
        # bounded: measured use of a node that is gone is never read again
        for key in [k for k in self.util if k[0] == name]:
            del self.util[key]
            self.util_shares.pop(key, None)

    # --- pods ----------------------------------------------------------------------------

    def add_bound(self, pod: Obj) -> str | None:
        """Account a pod that the API server shows bound to a node (idempotent). Returns why
        its request could not be read in full, the first time it is accounted (None if it
        could): the caller tells the pod's owner."""
        uid = pod["metadata"]["uid"]
        node = pod["spec"]["nodeName"]
        known = self.bound.get(uid)
        if known is not None:
            req = known[0]
            labels = tuple(sorted((pod["metadata"].get("labels") or {}).items()))
            if labels != req.labels:  # relabelled: selectors must see the new labels
                req = replace(req, labels=labels)
                if self._snap is not None and uid in self._snap.placed:
                    self._snap.relabel(req)
            self.bound[uid] = (req, known[1], pod)  # keep the latest status (phase)
            return None
        # Bound by whoever: what it holds counts, even where its request cannot be read.
        req, problem = parse_bound_pod(pod, self.gpu_memory_table())
        if problem is not None:
            log.warning(
                "bound pod's request not fully readable; counting what it holds",
                extra={"pod": uid, "node": node, "gpus": req.num_gpu, "error": problem},
            )
        if self.claims is not None and pod["spec"].get("resourceClaims"):
            try:
                req = self.claims.request(pod, req)
            except InvalidValueError as exc:
                log.warning("bound pod's claims unreadable", extra={"pod": uid, "error": str(exc)})
        assumed = self.assumed.pop(uid, None)
        self.bound[uid] = (req, node, pod)
        self.nominations.clear(uid)  # placed (by us or by someone else): nothing to promise
        if assumed is not None and assumed[1].node_name == node:
            return problem  # our own bind landed: the snapshot already holds it
        snap = self._snap
        if snap is None:
            return problem
        if assumed is not None:
            self._forget(snap, uid)
        self._place_bound(snap, req, node, pod)
        return problem

    def remove_pod(self, uid: str) -> bool:
        """A pod finished or was deleted; returns True if it held resources."""
        self.nominations.gone(uid)
        self.mem_of_pod.pop(uid, None)
        for node, gpu in self.util_of_pod.pop(uid, ()):
            self.util_shares.get((node, gpu), {}).pop(uid, None)
            self._set_util(node, gpu)  # an idle GPU reads idle again
        held = self.bound.pop(uid, None) is not None
        held = self.assumed.pop(uid, None) is not None or held
        if held and self._snap is not None and uid in self._snap.placed:
            self._forget(self._snap, uid)
        return held

    def assume(self, pod: LivePod, placement: Placement) -> None:
        snap = self.snapshot()
        snap.assume(pod, placement)
        self.assumed[pod.key] = (pod, placement)
        self.nominations.clear(pod.key)

    def forget(self, uid: str) -> None:
        """Undo an assume (a failed bind, a released gang)."""
        if self.assumed.pop(uid, None) is None:
            return
        if self._snap is not None and uid in self._snap.placed:
            self._forget(self._snap, uid)

    # --- GPU health and measured use --------------------------------------------------

    def set_gpu_health(self, node: str, gpu: int, healthy: bool) -> bool:
        """Returns True when a GPU came back (pods waiting for GPUs may now fit)."""
        key = (node, gpu)
        was_unhealthy = key in self.unhealthy
        if healthy == (not was_unhealthy):
            return False
        if healthy:
            self.unhealthy.discard(key)
        else:
            self.unhealthy.add(key)
        snap = self._snap
        if snap is not None and node in snap._index:
            i = snap.node_index(node)
            if gpu < snap.gpu_free.shape[1]:
                snap.unhealthy[i, gpu] = not healthy
                if healthy:
                    snap.gpu_free[i, gpu] += snap.withheld[i, gpu]
                    snap.withheld[i, gpu] = 0
                else:
                    self._withhold(snap, i, gpu)
                snap.generation[i] += 1
        return healthy

    def set_gpu_util(
        self, node: str, gpu: int, pct: float, pod_uid: str = "", mem_mib: float = 0.0
    ) -> None:
        """A pod's measured share of one GPU (the profiler's latest sample). A shared GPU's
        use is the sum over the pods on it, not the last one heard; a pod's share goes when
        the pod does (`remove_pod`). A sample for a pod not bound here (one that just ended)
        is dropped, so it cannot leave a share behind."""
        if pod_uid and pod_uid not in self.bound and pod_uid not in self.assumed:
            return
        self.util_shares.setdefault((node, gpu), {})[pod_uid] = pct
        self.util_of_pod.setdefault(pod_uid, set()).add((node, gpu))
        if pod_uid:
            self.mem_of_pod.setdefault(pod_uid, {})[(node, gpu)] = mem_mib
        self._set_util(node, gpu)

    def _set_util(self, node: str, gpu: int) -> None:
        shares = self.util_shares.get((node, gpu)) or {}
        total = min(100.0, sum(shares.values()))
        if shares:
            self.util[(node, gpu)] = total
        else:
            self.util.pop((node, gpu), None)
            self.util_shares.pop((node, gpu), None)
        snap = self._snap
        if snap is not None and node in snap._index and gpu < snap.gpu_util.shape[1]:
            snap.gpu_util[snap.node_index(node), gpu] = total

    # --- internals -----------------------------------------------------------------------

    @staticmethod
    def _withhold(snap: ClusterSnapshot, i: int, gpu: int) -> None:
        snap.withheld[i, gpu] += snap.gpu_free[i, gpu]
        snap.gpu_free[i, gpu] = 0

    def _forget(self, snap: ClusterSnapshot, uid: str) -> None:
        _pod, placement = snap.forget(uid)
        for g in placement.gpu_indices:
            if snap.unhealthy[placement.node, g]:
                self._withhold(snap, placement.node, g)

    def _place_bound(self, snap: ClusterSnapshot, req: LivePod, node: str, pod: Obj) -> None:
        if node not in snap._index:
            return  # the node is unknown yet; the rebuild that adds it places the pod
        i = snap.node_index(node)
        gpus: tuple[int, ...] = ()
        milli = req.gpu_milli
        ann = placement_annotations(pod)
        if req.num_gpu:
            claimed = None
            if ann is None and self.claims is not None and pod["spec"].get("resourceClaims"):
                claimed = self.claims.allocated_gpus(pod, node)
            if ann is not None and len(ann[0]) == req.num_gpu:
                gpus = tuple(ann[0])
            elif claimed is not None and len(claimed) == req.num_gpu:
                gpus = claimed
            else:
                gpus = self._first_fit(snap, req, i)
        placement = Placement(node=i, node_name=node, gpu_indices=gpus, gpu_milli=milli)
        # Capacity that the API server already granted is a fact: account it even when it
        # over-commits our view (an external binder), clamping at zero instead of refusing.
        self._force_assume(snap, req, placement)

    @staticmethod
    def _first_fit(snap: ClusterSnapshot, req: PodRequest, i: int) -> tuple[int, ...]:
        count = int(snap.gpu_count[i])
        order = np.argsort(-(snap.gpu_free[i, :count] + snap.withheld[i, :count]), kind="stable")
        return tuple(int(g) for g in order[: req.num_gpu])

    def _force_assume(self, snap: ClusterSnapshot, req: PodRequest, placement: Placement) -> None:
        if snap.fits(req, placement) is None:
            snap.assume(req, placement)
            return
        n = placement.node
        log.warning(
            "bound pod over-commits the node in our view",
            extra={"pod": req.key, "node": placement.node_name},
        )
        snap.cpu_free[n] -= req.cpu_milli
        snap.mem_free[n] -= req.memory_mib
        for g in placement.gpu_indices:
            if g < snap.gpu_count[n]:
                take = min(req.gpu_milli, int(snap.gpu_free[n, g]))
                snap.gpu_free[n, g] -= take
        snap.generation[n] += 1
        snap.placed[req.key] = (req, placement)
        snap.count(req, n, 1)

    def _build(self) -> ClusterSnapshot:
        infos = sorted(self.nodes.values(), key=lambda i: i.spec.name)
        snap = ClusterSnapshot.build([self._spec(i) for i in infos])
        width = snap.gpu_free.shape[1]
        snap.taints = [i.taints for i in infos]
        snap.tainted = np.array([bool(i.taints) for i in infos], dtype=np.bool_)
        snap.labels = [i.labels for i in infos]
        snap.unhealthy = np.zeros((len(infos), width), dtype=np.bool_)
        snap.withheld = np.zeros((len(infos), width), dtype=np.int64)
        snap.gpu_util = np.zeros((len(infos), width), dtype=np.float64)
        snap.reservations = self.reservations
        snap.gangs = self.gangs
        snap.budgets = self.budgets
        snap.nominations = self.nominations
        snap.topology = self.topology
        snap.pods_cap = np.array([i.pods for i in infos], dtype=np.int64)
        snap.pods_used = np.zeros(len(infos), dtype=np.int64)
        names = sorted({name for i in infos for name, _ in i.extra})
        snap.extra_cap = {
            name: np.array([dict(i.extra).get(name, 0) for i in infos], dtype=np.int64)
            for name in names
        }
        snap.extra_used = {name: np.zeros(len(infos), dtype=np.int64) for name in names}
        for (node, gpu), pct in self.util.items():
            if node in snap._index and gpu < width:
                snap.gpu_util[snap.node_index(node), gpu] = pct
        for req, node, pod in self.bound.values():
            self._place_bound(snap, req, node, pod)
        for uid, (req, placement) in list(self.assumed.items()):
            if placement.node_name not in snap._index:
                del self.assumed[uid]
                continue
            moved = Placement(
                node=snap.node_index(placement.node_name),
                node_name=placement.node_name,
                gpu_indices=placement.gpu_indices,
                gpu_milli=placement.gpu_milli,
            )
            self.assumed[uid] = (req, moved)
            self._force_assume(snap, req, moved)
        for node, gpu in self.unhealthy:
            if node in snap._index and gpu < width:
                i = snap.node_index(node)
                snap.unhealthy[i, gpu] = True
                self._withhold(snap, i, gpu)
        self.rebuilds += 1
        return snap

    def stats(self) -> dict[str, Any]:
        return {
            "nodes": len(self.nodes),
            "bound_pods": len(self.bound),
            "assumed_pods": len(self.assumed),
            "unhealthy_gpus": len(self.unhealthy),
            "rebuilds": self.rebuilds,
        }
