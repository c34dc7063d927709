"""Coscheduling: all of a PodGroup's `minMember` pods bind, or none of them does.

PreFilter: the PodGroup must exist, and the members still to be placed must fit together right
now, on a copy of the snapshot, each placed by the same framework (members that are not
created yet are assumed to look like this one). A gang that does not fit reserves nothing, so
two gangs wanting the same GPUs never hold half each: the first whole one wins, the other
waits unschedulable until an event frees room (or DefaultPreemption makes room for it).

Permit: a member that fits waits (WAIT, with the group's `scheduleTimeoutSeconds`) until
placed members reach `minMember`; the member that completes the quorum gets SUCCESS, and its
caller releases the waiting ones. The caller keeps waiting members assumed in its snapshot,
so `ClusterSnapshot.gang_placed` counts them; when the timeout passes first, it withdraws every
waiting member of the gang (forget and Unreserve) and they retry after a backoff.

The `GangBook` holds the groups and tells which members are still pending; its owner (the
live binder from PodGroup and pod watches, or a simulation from its trace) keeps it current,
and it travels on the snapshot.
"""

from __future__ import annotations

from typing import ClassVar

from alnair.scheduler.cluster.requests import Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState
from alnair.scheduler.framework.status import SKIP, SUCCESS, Code, Status, unschedulable

NAME = "Coscheduling"


def clone_member(pod: PodRequest, i: int) -> PodRequest:
    """A stand-in for a gang member not created yet (what-if placement)."""
    return PodRequest(
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


class Coscheduling:
    NAME: ClassVar[str] = NAME

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        """Can the rest of the gang, this pod included, be placed together now?"""
        if pod.gang is None or state.what_if:
            return SKIP
        book = snapshot.gangs
        spec = book.specs.get(pod.gang) if book is not None else None
        if book is None or spec is None:
            return unschedulable(f"PodGroup {pod.gang} not found")
        needed = spec.min_member - snapshot.gang_placed.get(pod.gang, 0)
        if needed <= 0 or state.handle is None:
            return SUCCESS  # the gang is complete: extra members schedule on their own
        others = [s for s in book.pending(pod.gang) if s.key != pod.key][: needed - 1]
        trial = [pod, *others]
        clones = needed - len(trial)
        trial.extend([pod] * clones)
        copy = snapshot.copy()
        for i, member in enumerate(trial):
            result = state.handle.schedule(member, copy, state.rng, what_if=True)
            if result.placement is None:
                return unschedulable(
                    f"gang {pod.gang} needs {needed} more member(s) placed together; "
                    f"only {i} fit now ({result.message()})"
                )
            probe = member if i < len(trial) - clones else clone_member(member, i)
            copy.assume(probe, result.placement)
        return SUCCESS

    def permit(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, placement: Placement
    ) -> Status:
        """SUCCESS when this member completes the quorum (or has no gang), else WAIT."""
        book = snapshot.gangs
        if pod.gang is None or book is None or pod.gang not in book.specs:
            return SUCCESS
        spec = book.specs[pod.gang]
        placed = snapshot.gang_placed.get(pod.gang, 0) + (pod.key not in snapshot.placed)
        if placed >= spec.min_member:
            return SUCCESS
        return Status(
            Code.WAIT,
            f"waiting for gang {pod.gang}: {placed}/{spec.min_member} members placed",
            timeout_s=spec.timeout_s,
        )
