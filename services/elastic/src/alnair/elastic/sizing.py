"""How many workers an elastic job can run, and the size to run at: pure functions.

`capacity` counts, from the node and pod caches, the workers of one job that run or could run
now: its bound workers plus the worker-sized holes in free GPUs on nodes it may use, minus the
GPUs that pending pods of equal or higher priority wait for (a grow must not take the room the
scheduler is freeing for a more important job). `decide` turns that into the StatefulSet's
replicas:

- a first start runs at the largest allowed size that fits, or sits at `minReplicas` pending
  (the PodGroup keeps all of them from binding until the minimum fits: WaitingForMin);
- a grow takes the largest allowed size that fits, at most once per `scaleCooldownSeconds`
  (anti-flap), and needs nothing running to be exempt from the cooldown (a start is no resize);
- a shrink happens only when told: workers taken by the scheduler (`forced`: the highest
  surviving ordinal + 1), a scale request, or a lowered maximum; never because a computation
  came out smaller. Losing workers below the minimum re-queues the job at `minReplicas`.

Only whole GPUs (`nvidia.com/gpu`) are counted; a GPU that fractional pods use is not free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import Obj
from alnair.elastic.spec import JOB_LABEL, ElasticSpec

FINISHED = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class WorkerShape:
    """What one worker needs from a node."""

    gpus: int
    node_selector: Mapping[str, str]
    tolerations: tuple[Obj, ...]
    priority: int = 0


def shape_of(spec: ElasticSpec, priority: int = 0) -> WorkerShape:
    pod = spec.template.get("spec") or {}
    return WorkerShape(
        gpus=spec.gpus_per_worker,
        node_selector=dict(pod.get("nodeSelector") or {}),
        tolerations=tuple(pod.get("tolerations") or ()),
        priority=priority,
    )


def whole_gpus(pod: Obj) -> int:
    """Whole GPUs a pod asks for (`alnair.common.resources.whole_gpus`)."""
    return r.whole_gpus(pod.get("spec") or {})


def holds_gpus(pod: Obj) -> bool:
    """Bound and not finished: the pod's GPUs are taken (a terminating pod still holds them)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (
        (pod.get("status") or {}).get("phase") not in FINISHED
    )


def _gpu_indices(pod: Obj) -> set[int]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(r.ANN_GPU_INDICES)
    if not raw:
        return set()
    return {int(x) for x in str(raw).split(",") if x.strip().isdigit()}


def _tolerated(taint: Obj, tolerations: Iterable[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_fits_shape(node: Obj, shape: WorkerShape) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in shape.node_selector.items()):
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in {"NoSchedule", "NoExecute"} and not _tolerated(
            taint, shape.tolerations
        ):
            return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def free_gpus(nodes: Iterable[Obj], pods: Iterable[Obj], shape: WorkerShape) -> dict[str, int]:
    """Whole GPUs free on every node a worker of `shape` may use."""
    return _free_per_node([n for n in nodes if node_fits_shape(n, shape)], pods)


def _free_per_node(nodes: Iterable[Obj], pods: Iterable[Obj]) -> dict[str, int]:
    """Whole GPUs free on each of `nodes`."""
    allocatable: dict[str, int] = {}
    for node in nodes:
        gpus = ((node.get("status") or {}).get("allocatable") or {}).get(r.GPU, "0")
        allocatable[node["metadata"]["name"]] = int(str(gpus))
    whole: dict[str, int] = dict.fromkeys(allocatable, 0)
    shared: dict[str, set[int]] = {n: set() for n in allocatable}
    for pod in pods:
        where = str((pod.get("spec") or {}).get("nodeName") or "")
        if where not in allocatable or not holds_gpus(pod):
            continue
        n = whole_gpus(pod)
        if n:
            whole[where] += n
        else:
            shared[where] |= _gpu_indices(pod)
    return {n: max(0, allocatable[n] - whole[n] - len(shared[n])) for n in allocatable}


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A pod waiting for a node, as demand reads it."""

    job: tuple[str | None, str | None]
    priority: int
    gpus: int
    selector: tuple[tuple[str, str], ...]


def _waiting(pods: Iterable[Obj]) -> list[_Waiting]:
    """The pods that wait for a node and ask for whole GPUs."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in FINISHED:
            continue
        gpus = whole_gpus(pod)
        if gpus:
            job = (meta.get("namespace"), (meta.get("labels") or {}).get(JOB_LABEL))
            selector = tuple(sorted((spec.get("nodeSelector") or {}).items()))
            out.append(_Waiting(job, int(spec.get("priority") or 0), gpus, selector))
    return out


def _demand(
    waiting: Iterable[_Waiting], job: tuple[str, str], priority: int, nodes: list[Obj] | None
) -> int:
    """GPUs the `waiting` pods of other jobs with priority >= `priority` ask for, counting
    only pods whose nodeSelector matches one of `nodes` when given (a pod pinned elsewhere
    competes for none of this job's GPUs); each distinct selector is matched once."""
    labels = (
        None if nodes is None else [(n.get("metadata") or {}).get("labels") or {} for n in nodes]
    )
    matches: dict[tuple[tuple[str, str], ...], bool] = {}
    total = 0
    for w in waiting:
        if w.job == job or w.priority < priority:
            continue
        if labels is not None:
            ok = matches.get(w.selector)
            if ok is None:
                ok = matches[w.selector] = any(
                    all(have.get(k) == v for k, v in w.selector) for have in labels
                )
            if not ok:
                continue
        total += w.gpus
    return total


def pending_demand_gpus(
    pods: Iterable[Obj], job: tuple[str, str], priority: int, nodes: list[Obj] | None = None
) -> int:
    """GPUs that pending pods of other jobs with priority >= `priority` wait for, counting
    only pods that may run on `nodes` (the job's eligible nodes) when given."""
    return _demand(_waiting(pods), job, priority, nodes)


@dataclass(frozen=True)
class Capacity:
    running: int
    """The job's workers bound now (not terminating)."""
    free_slots: int
    """Worker-sized holes in free GPUs on eligible nodes."""
    demand_slots: int
    """Holes that pending pods of equal or higher priority wait for."""

    @property
    def workers(self) -> int:
        return self.running + max(0, self.free_slots - self.demand_slots)


class ClusterView:
    """What sizing reads of the cluster, computed once from the nodes and pods and then
    shared by every pass until one of them changes: the whole GPUs free on each node and the
    pods waiting for one. One pod event wakes every job that could grow; without this each
    of their passes walked every node and pod again (the live demo's controller spent most
    of its CPU there, and lost its Lease under load)."""

    def __init__(self, nodes: Iterable[Obj], pods: Iterable[Obj]) -> None:
        self.nodes = list(nodes)
        pods = list(pods)
        self.free = _free_per_node(self.nodes, pods)
        self.waiting = _waiting(pods)
        self._eligible: dict[tuple[Any, ...], list[Obj]] = {}

    def eligible(self, shape: WorkerShape) -> list[Obj]:
        """The nodes a worker of `shape` may use."""
        key = (tuple(sorted(shape.node_selector.items())), repr(shape.tolerations))
        found = self._eligible.get(key)
        if found is None:
            found = self._eligible[key] = [n for n in self.nodes if node_fits_shape(n, shape)]
        return found

    def capacity(self, shape: WorkerShape, job: tuple[str, str], running: int) -> Capacity:
        eligible = self.eligible(shape)
        free = (self.free.get(n["metadata"]["name"], 0) for n in eligible)
        slots = sum(g // shape.gpus for g in free) if shape.gpus else 0
        demand = _demand(self.waiting, job, shape.priority, eligible)
        return Capacity(running, slots, math.ceil(demand / shape.gpus) if shape.gpus else 0)


def capacity(
    shape: WorkerShape,
    nodes: Iterable[Obj],
    pods: list[Obj],
    job: tuple[str, str],
    running: int,
) -> Capacity:
    return ClusterView(nodes, pods).capacity(shape, job, running)


@dataclass(frozen=True)
class Decision:
    target: int
    reason: str
    defer_s: float | None = None
    """Set when a grow waits for the cooldown: ask again after this many seconds."""
    clamped: str = ""
    """Why a scale request got a different size than it asked for."""


def decide(
    spec: ElasticSpec,
    *,
    current: int | None,
    running: int,
    capacity_workers: int,
    now_s: float,
    last_resize_s: float | None,
    request: int | None = None,
    forced: int | None = None,
) -> Decision:
    """The StatefulSet's replicas for `spec` now (see the module docstring)."""
    lo, hi = spec.min_replicas, spec.max_replicas
    if spec.suspend:
        return Decision(0, "suspended")
    if current is not None and forced is not None and forced < current:
        if forced < lo:
            return Decision(
                lo,
                f"{current - forced} worker(s) taken, below the minimum {lo}: "
                "the whole job was evicted and waits for its minimum (not a failure)",
            )
        size = spec.largest_size_at_most(forced) or lo
        return Decision(size, f"{current - forced} surplus worker(s) taken by the scheduler")
    if current is not None and current > 0 and (current > hi or current not in spec.sizes):
        size = spec.largest_size_at_most(min(current, hi)) or lo
        return Decision(size, f"spec changed: {current} is not an allowed size <= {hi}")
    if request is not None and current is not None and request < current:
        size = spec.largest_size_at_most(max(request, lo)) or lo
        clamped = "" if size == request else f"asked {request}, allowed size {size}"
        return Decision(size, f"scale request: shrink to {size}", clamped=clamped)
    ceiling = min(hi, capacity_workers)
    if request is not None:
        ceiling = min(ceiling, request)
    best = spec.largest_size_at_most(ceiling)
    if current is None or current == 0:
        if best is None:
            why = f"waiting for the minimum: {capacity_workers} worker(s) fit, need {lo}"
            return Decision(lo, why)
        return Decision(best, f"start at {best}: {capacity_workers} worker(s) fit")
    clamped = "" if request is None or best == request else f"asked {request}, room for {best}"
    if best is None or best <= current:
        return Decision(
            current, "no room to grow" if current < hi else "at maxReplicas", clamped=clamped
        )
    if running == 0:
        return Decision(best, f"start at {best}: {capacity_workers} worker(s) fit", clamped=clamped)
    if last_resize_s is not None and now_s - last_resize_s < spec.cooldown_s:
        wait = last_resize_s + spec.cooldown_s - now_s
        return Decision(current, f"grow to {best} waits {wait:.1f}s for the cooldown", defer_s=wait)
    return Decision(best, f"grow to {best}: {capacity_workers} worker(s) fit", clamped=clamped)


def node_facts(node: Obj | None) -> Any:
    """What of a node can change the GPUs a job may grow onto (allocatable GPUs, cordon,
    taints, readiness, labels): a node event that changes none of it wakes nothing."""
    if node is None:
        return None
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    ready = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return (
        (status.get("allocatable") or {}).get("nvidia.com/gpu"),
        spec.get("unschedulable"),
        repr(spec.get("taints")),
        ready,
        repr(sorted((node["metadata"].get("labels") or {}).items())),
    )
