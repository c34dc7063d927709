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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alnair.common import resources as r
from alnair.scheduler.live.pods import LivePod
from alnair.scheduler.snapshot import ClusterSnapshot, PodRequest

REASON = "reserved for a starving pod"


@dataclass(frozen=True, slots=True)
class Holder:
    """The pod a node is reserved for."""

    uid: str
    key: str
    """`<namespace>/<name>`, for messages."""
    priority: int
    created: float
    gang: str | None = None
    since: float = 0.0
    """When the reservation was made (epoch seconds)."""

    def outranks(self, other: Holder) -> bool:
        """Higher priority, or the same priority and created earlier."""
        if self.priority != other.priority:
            return self.priority > other.priority
        return self.created < other.created

    def admits(self, pod: PodRequest) -> bool:
        """May `pod` use the node despite this reservation?"""
        if pod.key == self.uid:
            return True
        if not isinstance(pod, LivePod):
            return False
        if self.gang is not None and pod.gang == self.gang:
            return True
        if pod.priority != self.priority:
            return pod.priority > self.priority
        return bool(pod.created) and pod.created <= self.created


class Reservations:
    """Node name -> holder; shared (by reference) with every live snapshot."""

    def __init__(self) -> None:
        self.by_node: dict[str, Holder] = {}
        self._node_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.by_node)

    def node_of(self, uid: str) -> str | None:
        return self._node_of.get(uid)

    def reserve(self, node: str, holder: Holder) -> Holder | bool:
        """Reserve `node` for `holder`. True when the node was free; the previous holder when
        `holder` outranks it and takes the node over (so a reservation always ends with the
        most senior starving pod); False when `holder` already holds a node or the node is
        held by a pod at least as senior."""
        if holder.uid in self._node_of:
            return False
        previous = self.by_node.get(node)
        if previous is not None:
            if not holder.outranks(previous):
                return False
            self._node_of.pop(previous.uid, None)
        self.by_node[node] = holder
        self._node_of[holder.uid] = node
        return previous if previous is not None else True

    def release(self, uid: str) -> str | None:
        """End `uid`'s reservation; the node it held, if any."""
        node = self._node_of.pop(uid, None)
        if node is not None:
            self.by_node.pop(node, None)
        return node

    def drop_node(self, node: str) -> Holder | None:
        holder = self.by_node.pop(node, None)
        if holder is not None:
            self._node_of.pop(holder.uid, None)
        return holder

    def describe(self) -> dict[str, str]:
        return {node: h.key for node, h in sorted(self.by_node.items())}


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
