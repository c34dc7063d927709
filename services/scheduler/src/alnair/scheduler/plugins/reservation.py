"""Starvation guard: a pod that has waited too long reserves the node closest to fitting it.

Without it, a pod asking for many GPUs (or a gang) can wait forever behind a stream of small
pods: each GPU that frees is taken by the next small pod before the large one ever fits. After
`starvation_after_s` of waiting, the pod (each gang member for itself) reserves one node: the
node where it would fit now, else the one that could hold it and has the most GPU capacity
free already; a pod that outranks the holder of a node (higher priority, or as high and
older) takes the reservation over, so it ends with the most senior starving pod. While the
reservation holds, the `NodeReservation` filter keeps off that node
every pod that does not outrank the holder (lower priority, or equal priority and younger);
the node drains as its pods finish, and the holder lands as soon as it fits (on that node or
any other). The reservation ends when the holder is placed, deleted or finished, or the node
goes away. At most `max_reserved_nodes` nodes are reserved at once, one per pod.

The `NodeReservation` plugin is the framework side: PostFilter makes the reservation (after
preemption found nothing), Filter keeps others off, Reserve ends the holder's reservation when
it is placed and Unreserve gives it back if the binding fails. A preemptor's nominated node is
held the same way (`hold`), as upstream keeps a nominated pod's room. The `Reservations` object
is its owner's (the live cache, or a simulation) and travels on the snapshot; the clock is
injected, so a simulation runs on its own time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from alnair.common import resources as r
from alnair.scheduler.cluster.books import Holder, Reservations
from alnair.scheduler.cluster.requests import IntArray, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import (
    CycleState,
    Filtered,
    NodeVerdicts,
    Nomination,
    PostFilterResult,
)
from alnair.scheduler.framework.status import SKIP, SUCCESS, Status, unschedulable
from alnair.scheduler.plugins.fit import for_lack_of_room

log = logging.getLogger(__name__)

REASON = "reserved for a starving pod"


def closest_node(pod: PodRequest, snapshot: ClusterSnapshot, candidates: list[int]) -> int | None:
    """Among nodes that failed only for room, the one that could ever hold `pod` and is
    closest to it now: most GPU capacity free for the request's shape, lowest index on ties."""
    best: tuple[int, int] | None = None
    chosen: int | None = None
    for n in sorted(candidates):
        count = int(snapshot.gpu_count[n])
        if (
            count < pod.num_gpu
            or int(snapshot.cpu_cap[n]) < pod.cpu_milli
            or int(snapshot.mem_cap[n]) < pod.memory_mib
        ):
            continue
        free = snapshot.gpu_free[n, :count]
        if pod.num_gpu and pod.gpu_milli < r.MILLI_PER_GPU:
            closeness = int(free.max()) if count else 0
        else:
            closeness = int(np.count_nonzero(free == r.MILLI_PER_GPU))
        rank = (closeness, int(free.sum()))
        if best is None or rank > best:
            best, chosen = rank, n
    return chosen


def holder_of(pod: PodRequest, since: float) -> Holder:
    return Holder(
        uid=pod.key,
        key=f"{pod.namespace}/{pod.name}",
        priority=pod.priority,
        created=pod.created,
        gang=pod.gang,
        since=since,
    )


def hold(reservations: Reservations, pod: PodRequest, node: str, now: float) -> None:
    """Keep the room being freed for a preemptor: pods that do not outrank it stay off the
    node until it lands (upstream keeps a nominated pod's room the same way)."""
    if reservations.node_of(pod.key) not in (None, node):
        reservations.release(pod.key)
    if reservations.node_of(pod.key) is None:
        reservations.reserve(node, holder_of(pod, now))


_RELEASED = "NodeReservation/released"


class NodeReservation:
    """Filter, PostFilter, Reserve: the framework side of `Reservations` (module docstring)."""

    NAME: ClassVar[str] = "NodeReservation"

    def __init__(
        self,
        starvation_after_s: float = 0.0,
        max_reserved_nodes: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.starvation_after_s = starvation_after_s
        self.max_reserved_nodes = max_reserved_nodes
        self.clock = clock

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        held = snapshot.reservations
        return SUCCESS if held is not None and len(held) else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        assert snapshot.reservations is not None  # PreFilter skips otherwise
        refused = np.zeros(len(snapshot.names), dtype=np.bool_)
        for name, holder in snapshot.reservations.by_node.items():
            if name in snapshot._index and not holder.admits(pod):
                refused[snapshot.node_index(name)] = True
        blocked = refused[nodes]
        return NodeVerdicts(passed=~blocked, failures=((REASON, blocked),))

    def post_filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, filtered: Filtered
    ) -> PostFilterResult:
        """Reserve a node for a pod that has waited past `starvation_after_s`."""
        nothing = PostFilterResult(unschedulable("no node reserved"))
        held = snapshot.reservations
        after = self.starvation_after_s
        now = self.clock()
        waited = now - pod.created if pod.created else 0.0
        if (
            held is None
            or after <= 0
            or waited < after
            or held.node_of(pod.key) is not None
            or len(held) >= self.max_reserved_nodes
        ):
            return nothing
        node: int | None
        if filtered.by_reason:
            node = closest_node(pod, snapshot, filtered.nodes_where(for_lack_of_room))
        else:  # PreFilter refused the pod as a whole (its gang): where would it go alone?
            if state.handle is None:
                return nothing
            alone = state.handle.schedule(pod, snapshot, state.rng, explain=True)
            if alone.placement is not None:
                node = alone.placement.node
            else:
                lacking = [n for n, why in alone.node_reasons.items() if for_lack_of_room(why)]
                node = closest_node(pod, snapshot, lacking)
        if node is None:
            return nothing
        name = snapshot.names[node]
        taken = held.reserve(name, holder_of(pod, now))
        if taken is False:
            return nothing
        if isinstance(taken, Holder):
            log.info("reservation taken over", extra={"node": name, "from": taken.key})
        return PostFilterResult(
            unschedulable("node reserved"),
            Nomination(
                node_name=name,
                message=f"Pending for {waited:.0f} s: node {name} is reserved for this pod; "
                "pods that do not outrank it stay off the node until this pod is placed.",
            ),
        )

    def reserve(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> Status:
        """The holder is placed: its reservation ends (kept in the state for Unreserve)."""
        held = snapshot.reservations
        if held is not None:
            node = held.node_of(pod.key)
            if node is not None:
                state.data[_RELEASED] = (node, held.by_node[node])
                held.release(pod.key)
        return SUCCESS

    def unreserve(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> None:
        released = state.data.pop(_RELEASED, None)
        held = snapshot.reservations
        if held is not None and isinstance(released, tuple):
            node, holder = released
            if node in snapshot._index:
                held.reserve(node, holder)
