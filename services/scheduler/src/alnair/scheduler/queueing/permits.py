"""The cluster queues' preemption rules (Kueue's `spec.preemption`) over a policy's decision.

A policy proposes preemptions by its own rules; a queue's `PreemptionRules` may only take
some away, never add one (Kueue's settings say what a queue *may* preempt; its scheduler, like
ours, preempts only when a pending job needs the room). A preemption names its victim and the
job it makes room for: the taker's queue's rules decide, as in Kueue:

- the victim in the taker's own queue: `within_queue` (Never; LowerPriority: a lower priority
  only; LowerOrNewerEqualPriority: also an equal priority that arrived later; Policy: as the
  policy proposes);
- the victim another queue's borrower: `reclaim` (Never; LowerPriority; Any);
- the victim another queue's job within its quota: `borrow_within_cohort` (Never;
  LowerPriority).

A job moved to a faster type (a preemption made for itself) is the policy's own and always
stays. A taker whose preemption is refused keeps waiting, its reason naming the rule.
"""

from __future__ import annotations

from dataclasses import replace

from alnair.scheduler.queueing.model import (
    Decisions,
    JobSpec,
    Preemption,
    PreemptionRules,
    QueueSnapshot,
    RunningJob,
    WaitReason,
)

KUEUE_FIELDS = {
    "within_queue": "withinClusterQueue",
    "reclaim": "reclaimWithinCohort",
    "borrow_within_cohort": "borrowWithinCohort.policy",
}
"""Each rule's field in Kueue's `spec.preemption`, for the reasons given."""


def _allowed(rule: str, victim: JobSpec, taker: JobSpec) -> bool:
    if rule in ("Policy", "Any"):
        return True
    if rule == "LowerPriority":
        return victim.priority < taker.priority
    if rule == "LowerOrNewerEqualPriority":
        return victim.priority < taker.priority or (
            victim.priority == taker.priority and victim.arrival_s > taker.arrival_s
        )
    return False  # Never


def refused(pre: Preemption, snapshot: QueueSnapshot) -> str | None:
    """Why the taker's queue may not ask for this preemption, or None when it may."""
    if pre.for_job_id == pre.job_id:
        return None
    victim: RunningJob | None = next((r for r in snapshot.running if r.job.id == pre.job_id), None)
    taker = next((j for j in snapshot.pending if j.id == pre.for_job_id), None)
    if taker is None:
        taker = next((r.job for r in snapshot.running if r.job.id == pre.for_job_id), None)
    if victim is None or taker is None:
        return None
    queue = snapshot.queues.get(taker.queue)
    if queue is None:
        return None
    if victim.job.queue == taker.queue:
        name = "within_queue"
    elif victim.borrowing:
        name = "reclaim"
    else:
        name = "borrow_within_cohort"
    rule = getattr(queue.preemption, name)
    if _allowed(rule, victim.job, taker):
        return None
    return (
        f"ClusterQueue {queue.name}'s preemption.{KUEUE_FIELDS[name]} is {rule}: it may not "
        f"preempt {victim.job.id} (priority {victim.job.priority}, this job's {taker.priority})"
    )


def within_rules(decisions: Decisions, snapshot: QueueSnapshot) -> Decisions:
    """The decision less the preemptions the takers' queues may not ask for; each such taker
    waits with the rule as its reason."""
    if not decisions.preemptions or all(
        q.preemption == PreemptionRules() for q in snapshot.queues.values()
    ):
        return decisions
    kept: list[Preemption] = []
    waiting = dict(decisions.waiting)
    for pre in decisions.preemptions:
        why = refused(pre, snapshot)
        if why is None:
            kept.append(pre)
        elif pre.for_job_id in waiting:  # (a pending taker; one admitted elsewhere has room)
            waiting[pre.for_job_id] = WaitReason("capacity", f"needs GPUs others hold; {why}")
    if len(kept) == len(decisions.preemptions):
        return decisions
    return replace(decisions, preemptions=tuple(kept), waiting=waiting)
