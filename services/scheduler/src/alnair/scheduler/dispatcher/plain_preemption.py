"""Preemption for quota over other resources than GPUs (CPU, memory: Kueue's queues), by the
queue's own `spec.preemption` rules, as Kueue applies them.

A workload that does not fit its queue's quota may take quota back:
- within its queue (`withinClusterQueue`): from admitted workloads of lower priority
  (`LowerPriority`), or also of equal priority admitted later (`LowerOrNewerEqualPriority`);
- from queues of its cohort that borrow (`reclaimWithinCohort`): any of their workloads
  (`Any`) or those of lower priority (`LowerPriority`), only while what it asks fits its
  queue's own nominal quota (quota it is owed, never a borrower taking from a borrower), and
  only while their queue still borrows once those chosen before are gone (never below what
  it is owed itself: otherwise two queues would take quota back from each other forever).

Candidates are tried borrowers first, then lowest priority, then the most recently admitted
(then created), until the workload fits; then each chosen one that is not needed after all is
put back, so the fewest are preempted. Workloads already told to stop (evicted, still holding their
reservation until whatever runs them stops them) are counted as gone: while those alone make
room, nothing more is preempted and the workload waits for them. The GPU models' preemption
is the policy's (`queueing`); this is the second gate, for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alnair.scheduler.dispatcher.parsing import Workload
from alnair.scheduler.queueing.model import PreemptionRules
from alnair.scheduler.queueing.resources import Amounts, Assignment, ResourceLedger


@dataclass(frozen=True, slots=True)
class Charge:
    """An admitted workload's usage: its queue, the flavors it is counted in, what it asks."""

    queue: str
    wl: Workload
    assignment: Assignment
    asked: Amounts
    admitted_s: float
    created_s: float
    stopping: bool = False
    """Told to stop already (evicted), its reservation not yet given back."""


def _release(ledger: ResourceLedger, charges: list[Charge]) -> None:
    for c in charges:
        ledger.release(c.queue, c.assignment, c.asked)


def _take(ledger: ResourceLedger, charges: list[Charge]) -> None:
    for c in charges:
        ledger.take(c.queue, c.assignment, c.asked)


def victims(
    wl: Workload,
    queue: str,
    asked: Amounts,
    ledger: ResourceLedger,
    charges: list[Charge],
    *,
    rules: PreemptionRules,
    cohort_of: Callable[[str], str | None],
    priority: Callable[[Workload], int],
    created_s: float,
) -> list[Charge] | None:
    """What to preempt so that `wl` fits `queue`: [] when the workloads already stopping make
    room (it waits for them), None when nothing its rules allow would. The ledger is left as
    it was."""
    stopping = [c for c in charges if c.stopping]
    _release(ledger, stopping)
    try:
        if not isinstance(ledger.assign(queue, asked), str):
            return []
        prio = priority(wl)
        cohort = cohort_of(queue)
        owed = ledger.within_nominal(queue, asked)
        candidates: list[tuple[tuple[int, int, float, float], Charge]] = []
        for c in charges:
            if c.stopping or c.wl.key == wl.key:
                continue
            theirs = priority(c.wl)
            if c.queue == queue:
                within = rules.within_queue
                if (within == "LowerPriority" and theirs < prio) or (
                    within == "LowerOrNewerEqualPriority"
                    and (theirs < prio or (theirs == prio and c.created_s > created_s))
                ):
                    candidates.append(((1, theirs, -c.admitted_s, -c.created_s), c))
            elif (
                cohort is not None
                and cohort_of(c.queue) == cohort
                and owed
                and (rules.reclaim == "Any" or (rules.reclaim == "LowerPriority" and theirs < prio))
                and ledger.borrowing(c.queue, c.assignment)
            ):
                candidates.append(((0, theirs, -c.admitted_s, -c.created_s), c))
        candidates.sort(key=lambda t: t[0])
        chosen: list[Charge] = []
        for _, c in candidates:
            if c.queue != queue and not ledger.borrowing(c.queue, c.assignment):
                continue  # its queue no longer borrows (after those chosen): nothing owed there
            ledger.release(c.queue, c.assignment, c.asked)
            chosen.append(c)
            if not isinstance(ledger.assign(queue, asked), str):
                break
        else:
            _take(ledger, chosen)
            return None
        # The fewest: each one not needed after all goes back (the last one was).
        for c in reversed(chosen[:-1]):
            ledger.take(c.queue, c.assignment, c.asked)
            if isinstance(ledger.assign(queue, asked), str):
                ledger.release(c.queue, c.assignment, c.asked)
            else:
                chosen.remove(c)
        _take(ledger, chosen)
        return chosen
    finally:
        _take(ledger, stopping)
