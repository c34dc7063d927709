"""The books the placement plugins read and write and their owners keep current: gangs,
nominations and reservations. They travel on the snapshot, so they sit on the floor below the
plugins; the rules that use them (Coscheduling, DefaultPreemption, NodeReservation) are in
`alnair.scheduler.plugins`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from alnair.scheduler.cluster.requests import PodRequest

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class GangSpec:
    min_member: int
    timeout_s: float = DEFAULT_TIMEOUT_S


def _none_pending(_gang: str) -> list[PodRequest]:
    return []


class GangBook:
    """Gang -> its spec, and a view of its members not yet placed."""

    def __init__(self, pending: Callable[[str], list[PodRequest]] = _none_pending) -> None:
        self.specs: dict[str, GangSpec] = {}
        self.pending = pending
        """Members of a gang that wait to be scheduled (not placed), in queue order."""

    def min_members(self) -> dict[str, int]:
        return {gang: spec.min_member for gang, spec in self.specs.items()}


@dataclass(frozen=True, slots=True)
class Nominated:
    """A preemptor waiting on its nominated node for its victims to go."""

    pod: PodRequest
    node: str
    victims: frozenset[str]


class Nominations:
    """Nominated preemptors and the victims being deleted (the live cache's; see the module
    docstring). Every entry has a removal path: a preemptor's when it is placed, gone, nominated
    elsewhere or cleared after a failed delete; a victim's when its deletion is seen."""

    def __init__(self) -> None:
        self.by_pod: dict[str, Nominated] = {}
        self._by_node: dict[str, dict[str, Nominated]] = {}
        self.leaving: dict[str, str] = {}
        """Victim uid -> the preemptor (pod key, or gang) it is deleted for."""

    def __len__(self) -> int:
        return len(self.by_pod)

    def nominate(self, pod: PodRequest, node: str, victims: Iterable[str] = ()) -> None:
        """`pod` waits on `node`; `victims` are deleted for it (added to those in flight)."""
        going = frozenset(victims)
        previous = self.clear(pod.key)
        if previous is not None and previous.node == node:
            going |= previous.victims
        entry = Nominated(pod, node, going)
        self.by_pod[pod.key] = entry
        self._by_node.setdefault(node, {})[pod.key] = entry
        self.evicting(going, pod.key)

    def evicting(self, victims: Iterable[str], by: str) -> None:
        """`victims` are being deleted (for a gang: no node is nominated)."""
        for uid in victims:
            self.leaving[uid] = by

    def clear(self, key: str) -> Nominated | None:
        """End `key`'s nomination (its victims still leave: their deletes were sent)."""
        entry = self.by_pod.pop(key, None)
        if entry is not None:
            on_node = self._by_node.get(entry.node)
            if on_node is not None:
                on_node.pop(key, None)
                if not on_node:
                    del self._by_node[entry.node]
        return entry

    def stays(self, uid: str) -> None:
        """`uid`'s delete failed: it is not leaving after all."""
        self.leaving.pop(uid, None)

    def gone(self, uid: str) -> None:
        """A pod was deleted or finished: as a victim, as a preemptor."""
        self.leaving.pop(uid, None)
        self.clear(uid)

    def on_node(self, node: str) -> Iterable[Nominated]:
        return self._by_node.get(node, {}).values()

    def nodes(self) -> Iterable[str]:
        return self._by_node.keys()

    def promised(self, pod: PodRequest, node: str) -> list[PodRequest]:
        """What is promised on `node` to pods `pod` must leave room for: nominated pods of
        higher or equal priority (upstream's rule), other than `pod` itself."""
        return [
            x.pod
            for x in self._by_node.get(node, {}).values()
            if x.pod.key != pod.key and x.pod.priority >= pod.priority
        ]


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
        if self.gang is not None and pod.gang == self.gang:
            return True
        if pod.priority != self.priority:
            return pod.priority > self.priority
        return bool(pod.created) and pod.created <= self.created


class Reservations:
    """Node name -> holder; shared (by reference) with every live snapshot."""

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self.by_node: dict[str, Holder] = {}
        self._node_of: dict[str, str] = {}
        self.on_change = on_change
        """Told of every change, with True when a node was given up (waiting pods may fit)."""

    def _changed(self, released: bool) -> None:
        if self.on_change is not None:
            self.on_change(released)

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
        self._changed(False)
        return previous if previous is not None else True

    def release(self, uid: str) -> str | None:
        """End `uid`'s reservation; the node it held, if any."""
        node = self._node_of.pop(uid, None)
        if node is not None:
            self.by_node.pop(node, None)
            self._changed(True)
        return node

    def drop_node(self, node: str) -> Holder | None:
        holder = self.by_node.pop(node, None)
        if holder is not None:
            self._node_of.pop(holder.uid, None)
            self._changed(False)
        return holder

    def describe(self) -> dict[str, str]:
        return {node: h.key for node, h in sorted(self.by_node.items())}
