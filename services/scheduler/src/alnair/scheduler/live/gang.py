"""The live side of gang scheduling: PodGroups from the watch, members waiting at Permit,
their timers and the PodGroup's status.

The decisions are the `Coscheduling` plugin's (PreFilter: the missing members fit together now;
Permit: wait until `minMember` are placed) and run the same in the simulator. This keeps what
only a live cluster has: the `GangBook` kept from PodGroup events, the queue entries of members
that wait at Permit (assumed in the cache, so the gang's count includes them), the
`scheduleTimeoutSeconds` timers that withdraw them, and the status written to the PodGroup.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from alnair.common.kube import Obj
from alnair.scheduler.cluster.books import DEFAULT_TIMEOUT_S, GangBook, GangSpec
from alnair.scheduler.cluster.pods import LivePod
from alnair.scheduler.framework import ScheduleResult
from alnair.scheduler.live.queue import QueuedPod

Waiting = tuple[QueuedPod, LivePod, ScheduleResult]


@dataclass
class GangState:
    waiting: dict[str, Waiting] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    succeeded: set[str] = field(default_factory=set)
    """Members that ran to completion (uids: an event seen twice counts once)."""
    failed: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None
    first_wait: float | None = None
    last_status: dict[str, object] = field(default_factory=dict)


def group_spec(pg: Obj) -> GangSpec:
    spec = pg.get("spec") or {}
    return GangSpec(
        min_member=max(int(spec.get("minMember") or 1), 1),
        timeout_s=float(spec.get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_S),
    )


class GangManager:
    def __init__(self, book: GangBook) -> None:
        self.book = book
        self.groups = book.specs
        """Gang -> its spec (the book's dict: what the plugins read on the snapshot)."""
        self.state: dict[str, GangState] = {}

    def upsert_group(self, pg: Obj) -> None:
        meta = pg["metadata"]
        self.groups[f"{meta['namespace']}/{meta['name']}"] = group_spec(pg)

    def delete_group(self, key: str) -> None:
        self.groups.pop(key, None)
        self._drop_if_idle(key)

    def _drop_if_idle(self, gang: str) -> None:
        # Bounded: a gang whose group is gone and that holds no member keeps no state. One
        # with members still waiting keeps it until their permit times out or they go.
        st = self.state.get(gang)
        if st is not None and gang not in self.groups and not st.bound and not st.waiting:
            if st.timer is not None:
                st.timer.cancel()
            del self.state[gang]

    def st(self, gang: str) -> GangState:
        return self.state.setdefault(gang, GangState())

    def add_waiting(self, entry: QueuedPod, pod: LivePod, result: ScheduleResult) -> None:
        """Permit said WAIT: `pod` is assumed and waits for its gang."""
        assert pod.gang is not None
        st = self.st(pod.gang)
        st.waiting[pod.key] = (entry, pod, result)
        if st.first_wait is None:
            st.first_wait = datetime.now(UTC).timestamp()

    def take_waiting(self, gang: str) -> list[Waiting]:
        st = self.st(gang)
        out = list(st.waiting.values())
        st.waiting.clear()
        st.first_wait = None
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        return out

    def mark_bound(self, gang: str, uid: str) -> None:
        self.st(gang).bound.add(uid)

    def member_gone(self, gang: str, uid: str, phase: str | None = None) -> None:
        """A member left: deleted, or ended (`phase` Succeeded or Failed, which the group's
        status counts)."""
        st = self.st(gang) if phase in ("Succeeded", "Failed") else self.state.get(gang)
        if st is not None:
            st.bound.discard(uid)
            st.waiting.pop(uid, None)
            if phase == "Succeeded":
                st.succeeded.add(uid)
            elif phase == "Failed":
                st.failed.add(uid)
            self._drop_if_idle(gang)

    def status_patch(self, gang: str, running: int) -> dict[str, object]:
        spec = self.groups.get(gang)
        st = self.st(gang)
        succeeded, failed = len(st.succeeded), len(st.failed)
        scheduled = len(st.bound) + succeeded + failed  # the ended ones were scheduled too
        minimum = spec.min_member if spec else 1
        if scheduled >= minimum:
            phase = "Running" if running >= minimum else "Scheduled"
            if succeeded >= minimum and running == 0:
                phase = "Finished"
        elif st.waiting:
            phase = "Scheduling"
        else:
            phase = "Pending"
        if failed and running + succeeded < minimum and scheduled:
            phase = "Failed"
        status: dict[str, object] = {
            "phase": phase,
            "scheduled": scheduled,
            "running": running,
            "succeeded": succeeded,
            "failed": failed,
        }
        return status
