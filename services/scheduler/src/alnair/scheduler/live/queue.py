"""The scheduling queue: priority order, backoff, and an unschedulable pool drained by events.

Three places a pending pod can be (as upstream's PriorityQueue):
- active: a heap ordered by priority (high first), then by gang (members of one PodGroup stay
  together, oldest group first, so two gangs never interleave their reservations), then age;
- backoff: failed recently; a timer per pod (its own deadline, not a polling loop) returns it to
  active after 1 s, doubling per attempt up to `max_backoff_s`;
- unschedulable: nothing fits now. Only an event that can make it fit moves it back: a pod
  finishing or deleted, a node added or freed of a taint, a GPU healthy again, a job completed;
  a pod placed (or relabelled) moves back only the pods whose required pod affinity or hard
  topology spread constraints count it.

If such an event arrives while a pod is in its scheduling cycle, the pod goes to backoff instead
of the unschedulable pool (the `move_seq` check), so no wake-up is lost.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from alnair.common.kube import Obj
from alnair.scheduler.cluster.pods import LivePod


@dataclass
class QueuedPod:
    uid: str
    obj: Obj
    request: LivePod | None
    attempts: int = 0
    added: float = field(default_factory=time.time)
    last_message: str = ""
    popped_seq: int = 0

    @property
    def key(self) -> str:
        meta = self.obj["metadata"]
        return f"{meta.get('namespace', 'default')}/{meta['name']}"

    def sort_key(self, gang_ts: dict[str, float]) -> tuple[Any, ...]:
        req = self.request
        prio = req.priority if req else 0
        created = req.created if req else self.added
        gang = req.gang if req else None
        group_ts = gang_ts.get(gang, created) if gang else created
        return (-prio, group_ts, gang or "", created, self.key)


class SchedulingQueue:
    def __init__(self, initial_backoff_s: float = 1.0, max_backoff_s: float = 10.0) -> None:
        self.pods: dict[str, QueuedPod] = {}
        self._heap: list[tuple[tuple[Any, ...], int, str]] = []
        self._in_heap: set[str] = set()
        self._backoff: dict[str, asyncio.TimerHandle] = {}
        self.unschedulable: set[str] = set()
        self.in_flight: set[str] = set()
        self.gang_ts: dict[str, float] = {}
        self.gated: dict[str, QueuedPod] = {}
        """Pods held back by `schedulingGates`: shown, never popped (see `hold_gated`)."""
        self._counting: set[str] = set()
        """Queued pods whose required pod affinity or hard spread constraints placed pods can
        satisfy (`LivePod.counts_placements`; see `move_to_active`)."""
        self.move_seq = 0
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s

    def __len__(self) -> int:
        return len(self.pods)

    def depth(self) -> dict[str, int]:
        return {
            "active": len(self._in_heap),
            "backoff": len(self._backoff),
            "unschedulable": len(self.unschedulable),
            "in_flight": len(self.in_flight),
            "gated": len(self.gated),
        }

    # --- producers -------------------------------------------------------------------------

    def add(self, uid: str, obj: Obj, request: LivePod | None, *, changed: bool = True) -> None:
        """A pending pod appeared or changed: (re)consider it now.

        `changed=False` (only its status moved, e.g. our own condition write) refreshes the
        stored object without cutting its backoff short.
        """
        self.gated.pop(uid, None)
        entry = self.pods.get(uid)
        fresh = entry is None
        if entry is None:
            entry = QueuedPod(uid=uid, obj=obj, request=request)
            self.pods[uid] = entry
        else:
            entry.obj, entry.request = obj, request
        if request is not None and request.counts_placements:
            self._counting.add(uid)
        else:
            self._counting.discard(uid)
        if not fresh and not changed:
            return
        if uid in self.in_flight:
            return
        if uid in self.unschedulable:
            self.unschedulable.discard(uid)
        timer = self._backoff.pop(uid, None)
        if timer is not None:
            timer.cancel()
        self._activate(entry)

    def hold_gated(self, uid: str, obj: Obj, gates: list[str]) -> None:
        """A pod with scheduling gates: out of the queue proper, listed until they are gone."""
        self.remove(uid)
        self.gated[uid] = QueuedPod(
            uid=uid, obj=obj, request=None, last_message=f"waiting for gates: {', '.join(gates)}"
        )

    def hold_invalid(self, uid: str, obj: Obj, message: str) -> None:
        """A pod whose request cannot be read: listed with the reason, parked until it
        changes (its next update comes through `add`)."""
        self.remove(uid)
        self.pods[uid] = QueuedPod(uid=uid, obj=obj, request=None, last_message=message)
        self.unschedulable.add(uid)

    def group_created(self, gang: str, ts: float | None) -> None:
        """A gang's creation time, which orders its members together (None forgets it)."""
        if ts is None:
            self.gang_ts.pop(gang, None)
        else:
            self.gang_ts[gang] = ts

    def binding(self, uid: str) -> None:
        """The pod's binding cycle started: events leave it alone until `done` or `backoff`."""
        self.in_flight.add(uid)

    def remove(self, uid: str) -> None:
        self.gated.pop(uid, None)
        self.pods.pop(uid, None)
        self._counting.discard(uid)
        self.unschedulable.discard(uid)
        self._in_heap.discard(uid)
        timer = self._backoff.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def move_all_to_active(self, keep: Callable[[str], bool] | None = None) -> int:
        """A cluster event that can make pods fit: give every unschedulable pod another try
        (but those `keep` says the event cannot help)."""
        self.move_seq += 1
        moved = 0
        for uid in list(self.unschedulable):
            if keep is not None and keep(uid):
                continue
            self.unschedulable.discard(uid)
            entry = self.pods.get(uid)
            if entry is not None:
                self._activate(entry)
                moved += 1
        return moved

    def move_to_active(self, wakes: Callable[[LivePod], bool]) -> int:
        """An event that can help only some pods (a pod placed that others' affinity or spread
        constraints count): give the unschedulable pods `wakes` accepts another try."""
        if not self._counting:
            return 0  # the common case: no queued pod counts other pods

        def helped(uid: str) -> bool:
            entry = self.pods.get(uid)
            return entry is not None and entry.request is not None and wakes(entry.request)

        chosen = [uid for uid in self._counting & self.unschedulable if helped(uid)]
        if any(helped(uid) for uid in self._counting & self.in_flight):
            self.move_seq += 1  # a pod it helps is in its cycle now: it backs off, not parks
        for uid in chosen:
            self.unschedulable.discard(uid)
            self._activate(self.pods[uid])
        return len(chosen)

    # --- consumer ------------------------------------------------------------------------

    async def pop(self) -> QueuedPod:
        while True:
            while self._heap:
                _key, _seq, uid = heapq.heappop(self._heap)
                if uid not in self._in_heap:
                    continue  # stale heap entry
                self._in_heap.discard(uid)
                entry = self.pods.get(uid)
                if entry is None:
                    continue
                entry.attempts += 1
                entry.popped_seq = self.move_seq
                self.in_flight.add(uid)
                return entry
            self._wake.clear()
            await self._wake.wait()

    def done(self, uid: str) -> None:
        """The pod was bound (or will never be scheduled by us)."""
        self.in_flight.discard(uid)
        self.remove(uid)

    def backoff(self, entry: QueuedPod) -> None:
        """Try again later (bind failed, gang released, transient error)."""
        self.in_flight.discard(entry.uid)
        if entry.uid not in self.pods:
            return
        delay = min(self.initial_backoff_s * 2 ** max(entry.attempts - 1, 0), self.max_backoff_s)
        loop = asyncio.get_running_loop()
        old = self._backoff.pop(entry.uid, None)
        if old is not None:
            old.cancel()
        self._backoff[entry.uid] = loop.call_later(delay, self._backoff_done, entry.uid)

    def unschedulable_now(self, entry: QueuedPod) -> None:
        """Nothing fits: park until an event may change that (or back off if one came)."""
        self.in_flight.discard(entry.uid)
        if entry.uid not in self.pods:
            return
        if self.move_seq != entry.popped_seq:
            self.backoff(entry)
            return
        self.unschedulable.add(entry.uid)

    def requeue(self, uid: str) -> None:
        """A parked pod must try again (what it waited for will not come): back off, then
        active. A pod already active, backing off or in its cycle is left as it is."""
        entry = self.pods.get(uid)
        if entry is None or uid not in self.unschedulable:
            return
        self.unschedulable.discard(uid)
        self.backoff(entry)

    def release(self, entry: QueuedPod) -> None:
        """Hand a pod back without counting an attempt (e.g. it waits in a gang)."""
        self.in_flight.discard(entry.uid)

    # --- internals -----------------------------------------------------------------------

    def _backoff_done(self, uid: str) -> None:
        self._backoff.pop(uid, None)
        entry = self.pods.get(uid)
        if entry is not None and uid not in self.in_flight:
            self._activate(entry)

    def _activate(self, entry: QueuedPod) -> None:
        self._in_heap.add(entry.uid)
        heapq.heappush(self._heap, (entry.sort_key(self.gang_ts), next(self._seq), entry.uid))
        self._wake.set()

    def snapshot(self) -> list[dict[str, Any]]:
        """The queue as the `/v1/queue` API shows it, in scheduling order."""
        rows: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        for entry in self.gated.values():
            priority = int((entry.obj.get("spec") or {}).get("priority") or 0)
            # (1, ...): after every pod that can be scheduled
            rows.append(((1, entry.key), _row(entry, "gated", priority, None)))
        for uid, entry in self.pods.items():
            req = entry.request
            row = _row(
                entry, self._state(uid), req.priority if req else 0, req.gang if req else None
            )
            rows.append(((0, *entry.sort_key(self.gang_ts)), row))
        rows.sort(key=lambda r: r[0])
        return [row for _key, row in rows]

    def _state(self, uid: str) -> str:
        if uid in self.in_flight:
            return "in_flight"
        if uid in self._in_heap:
            return "active"
        if uid in self._backoff:
            return "backoff"
        if uid in self.unschedulable:
            return "unschedulable"
        return "waiting"


def _row(entry: QueuedPod, state: str, priority: int, gang: str | None) -> dict[str, Any]:
    return {
        "pod": entry.key,
        "uid": entry.uid,
        "state": state,
        "priority": priority,
        "gang": gang,
        "attempts": entry.attempts,
        "message": entry.last_message,
    }
