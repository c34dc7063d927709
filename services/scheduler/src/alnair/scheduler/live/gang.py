"""Gang scheduling: all of a PodGroup's `minMember` pods bind, or none of them does.

PreFilter (`check`): the PodGroup must exist, and the members still to be placed must fit
together right now, on a copy of the snapshot, each placed by the same framework (members that
are not created yet are assumed to look like this one). A gang that does not fit reserves
nothing, so two gangs wanting the same GPUs never hold half each: the first whole one wins, the
other waits unschedulable until an event frees room.

Permit: a member that fits is reserved (assumed in the cache) and waits. When reserved plus
bound members reach `minMember`, every waiting member is bound. If that does not happen within
`scheduleTimeoutSeconds` (members missing, or one that stopped fitting), every reservation of the
gang is released at once, each member gets an Event, and they retry after a backoff.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from alnair.common.kube import Obj
from alnair.scheduler.framework import Framework
from alnair.scheduler.framework.status import Status, unschedulable
from alnair.scheduler.live.pods import LivePod
from alnair.scheduler.live.queue import QueuedPod
from alnair.scheduler.snapshot import ClusterSnapshot, Placement

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class GroupSpec:
    min_member: int
    timeout_s: float
    obj: Obj


@dataclass
class GangState:
    waiting: dict[str, tuple[QueuedPod, LivePod, Placement]] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None
    first_wait: float | None = None
    last_status: dict[str, object] = field(default_factory=dict)


def group_spec(pg: Obj) -> GroupSpec:
    spec = pg.get("spec") or {}
    return GroupSpec(
        min_member=max(int(spec.get("minMember") or 1), 1),
        timeout_s=float(spec.get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_S),
        obj=pg,
    )


class GangManager:
    def __init__(self) -> None:
        self.groups: dict[str, GroupSpec] = {}
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

    def min_members(self) -> dict[str, int]:
        return {k: g.min_member for k, g in self.groups.items()}

    def check(
        self,
        pod: LivePod,
        siblings: list[LivePod],
        snapshot: ClusterSnapshot,
        framework: Framework,
        rng: np.random.Generator,
    ) -> Status:
        """PreFilter: can the rest of the gang, this pod included, be placed together now?"""
        assert pod.gang is not None
        spec = self.groups.get(pod.gang)
        if spec is None:
            return unschedulable(f"PodGroup {pod.gang} not found", "Coscheduling")
        st = self.st(pod.gang)
        needed = spec.min_member - len(st.bound) - len(st.waiting)
        if needed <= 0:
            return Status()  # the gang is complete: extra members schedule on their own
        others = [s for s in siblings if s.key != pod.key][: needed - 1]
        trial = [pod, *others]
        clones = needed - len(trial)
        trial.extend([pod] * clones)
        copy = snapshot.copy()
        for i, member in enumerate(trial):
            result = framework.schedule(member, copy, rng)
            if result.placement is None:
                return unschedulable(
                    f"gang {pod.gang} needs {needed} more member(s) placed together; "
                    f"only {i} fit now ({result.message()})",
                    "Coscheduling",
                )
            probe = member if i < len(trial) - clones else clone_member(member, i)
            copy.assume(probe, result.placement)
        return Status()

    def add_waiting(self, entry: QueuedPod, pod: LivePod, placement: Placement) -> bool:
        """Permit: reserve `pod`; True when the gang is now complete and may bind."""
        assert pod.gang is not None
        spec = self.groups[pod.gang]
        st = self.st(pod.gang)
        st.waiting[pod.key] = (entry, pod, placement)
        if st.first_wait is None:
            st.first_wait = datetime.now(UTC).timestamp()
        return len(st.waiting) + len(st.bound) >= spec.min_member

    def take_waiting(self, gang: str) -> list[tuple[QueuedPod, LivePod, Placement]]:
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

    def member_gone(self, gang: str, uid: str) -> None:
        st = self.state.get(gang)
        if st is not None:
            st.bound.discard(uid)
            st.waiting.pop(uid, None)
            self._drop_if_idle(gang)

    def status_patch(
        self, gang: str, running: int, succeeded: int, failed: int
    ) -> dict[str, object]:
        spec = self.groups.get(gang)
        st = self.st(gang)
        scheduled = len(st.bound)
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


def clone_member(pod: LivePod, i: int) -> LivePod:
    """A stand-in for a gang member not created yet (what-if placement)."""
    return LivePod(
        name=f"{pod.name}~virtual-{i}",
        namespace=pod.namespace,
        uid=f"{pod.key}~virtual-{i}",
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli,
        gpu_models=pod.gpu_models,
        priority=pod.priority,
        gang=pod.gang,
        tolerations=pod.tolerations,
        node_selector=pod.node_selector,
        created=pod.created,
    )
