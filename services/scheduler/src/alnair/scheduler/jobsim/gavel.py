"""Gavel's FIFO as Gavel's simulator runs it, for the fidelity check of the round physics.

The Gavel-compatible mode of the job simulator (`engine.simulate(round_s=...)`) claims to
replay a trace with Gavel's physics. The check is to run one decision rule in both
simulators and compare: this module is Gavel's `fifo` (its `FIFOPolicy` in base mode and its
round mechanism, github.com/stanford-futuredata/gavel at c4fa400), reproduced from reading
them, so that `make bench-queue` can set it beside Gavel's own `fifo` on every trace. It is
a simulator policy only; the product's `fifo` is `queueing/baselines.py`.

What Gavel's FIFO does, which is not what its docstring says:
- **The GPU type.** It draws an index at random among the types with room for the job, but
  then allocates the job to the variable left over from the loop that built that list: the
  *last* of the available types in sorted order (`k80 < p100 < v100`), so V100 while any
  V100 is free, whether or not the job fits there. A type's free count can go below zero;
  when it reaches exactly zero the type removed from the list is the one at the drawn index.
  So jobs beyond a type's capacity are allocated to it.
- **Allocations are sticky.** Base mode keeps each job's type until it completes; a
  completed job's type is offered first to the head of the queue, if it fits the count left
  at that point of the pass over the allocations (in job order).
- **Time-slicing.** Each round the mechanism runs, per type, the jobs allocated to it in
  order of priority `allocation / (time received / time the type ran)` (1e9 x allocation
  for a job not run yet), ties broken by the deficit (time owed since the last reset),
  skipping jobs that do not fit the workers left. Over-allocated types are shared round by
  round among their jobs, which is processor sharing, not first-in-first-out.
- **Allocation updates** happen when a job arrived or completed, at most every 1,920 s; each
  update resets the time received (every job starts again at half a round) and adds what
  each job was owed to its deficit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from alnair.scheduler.jobsim.engine import SimResult
from alnair.scheduler.queueing.model import Decisions, JobSpec, QueueSnapshot, WaitReason
from alnair.scheduler.queueing.plan import Plan

RESET_INTERVAL_S = 1920.0
"""Gavel's `minimum_time_between_allocation_resets` default."""
NEW_JOB_PRIORITY = 1e9


@dataclass
class GavelFifo:
    """Gavel's FIFO policy (base mode) and round mechanism; see the module docstring."""

    name: str = "gavel-fifo"
    seed: int = 0
    round_s: float = 360.0
    reset_interval_s: float = RESET_INTERVAL_S
    _rng: random.Random = field(init=False, repr=False)
    _allocation: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _scale: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _job_time: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _worker_time: dict[str, float] = field(
        default_factory=lambda: defaultdict(float), init=False, repr=False
    )
    _deficit: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _known: set[str] = field(default_factory=set, init=False, repr=False)
    _ran: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _last_now: float | None = field(default=None, init=False, repr=False)
    _last_reset: float = field(default=0.0, init=False, repr=False)
    _dirty: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        """One round: every active job is pending in the round physics (running is empty)."""
        now = snapshot.now_s
        jobs = {j.id: j for j in snapshot.pending}
        types = sorted(snapshot.capacity)
        if self._last_now is not None:  # what last round's jobs ran (those still here)
            elapsed = now - self._last_now
            for job_id, gpu_type in self._ran.items():
                if job_id in jobs:
                    self._job_time[job_id] += elapsed
                    self._worker_time[gpu_type] += elapsed
        self._last_now = now
        for job_id in set(jobs) - self._known:  # Gavel's add_job
            self._job_time[job_id] = self.round_s / 2.0
            self._deficit[job_id] = 0.0
            self._scale[job_id] = jobs[job_id].gpus
            self._dirty = True
        gone = self._known - set(jobs)
        if gone:
            self._dirty = True
        for job_id in gone:
            self._job_time.pop(job_id, None)
            self._deficit.pop(job_id, None)
        self._known = set(jobs)
        # Gavel's test: the interval elapsed, or no reset yet at a time after 0.
        due = self._last_reset == 0.0 or now - self._last_reset >= self.reset_interval_s
        if self._dirty and due:
            self._reset(now)
            self._allocate(jobs, snapshot)
            self._dirty = False
        return self._mechanism(snapshot, jobs, types)

    def _reset(self, now: float) -> None:
        elapsed = now - self._last_reset
        self._worker_time.clear()
        for job_id in self._known:
            allocated = self._allocation.get(job_id)
            if allocated is not None:
                received = self._job_time[job_id] - self.round_s / 2.0
                self._deficit[job_id] += elapsed - received
            self._job_time[job_id] = self.round_s / 2.0
            if allocated is not None:
                self._worker_time[allocated] += self.round_s / 2.0
        self._last_reset = now

    def _allocate(self, jobs: dict[str, JobSpec], snapshot: QueueSnapshot) -> None:
        available = {t: pool.total for t, pool in snapshot.capacity.items()}
        queue = sorted(j for j in jobs if j not in self._allocation)
        for job_id in sorted(self._allocation):
            gpu_type = self._allocation[job_id]
            if job_id in jobs:
                available[gpu_type] -= self._scale[job_id]
                continue
            if queue:  # a completed job's type goes to the queue's head if it fits
                head = queue[0]
                if self._scale[head] <= available[gpu_type] and gpu_type in jobs[head].runtime:
                    queue.pop(0)
                    self._allocation[head] = gpu_type
                    available[gpu_type] -= self._scale[head]
            del self._allocation[job_id]
            self._scale.pop(job_id, None)
        open_types = sorted(t for t, n in available.items() if n > 0)
        while queue and open_types:
            job_id = queue.pop(0)
            scale = self._scale[job_id]
            fitting = [i for i, t in enumerate(open_types) if available[t] >= scale]
            if not fitting:
                break
            drawn = self._rng.randrange(len(fitting))
            gpu_type = open_types[-1]  # Gavel's leftover loop variable, not the drawn type
            if gpu_type in jobs[job_id].runtime:
                self._allocation[job_id] = gpu_type
                available[gpu_type] -= scale
                if available[gpu_type] == 0:
                    open_types.pop(fitting[drawn])

    def _mechanism(
        self, snapshot: QueueSnapshot, jobs: dict[str, JobSpec], types: list[str]
    ) -> Decisions:
        plan = Plan(snapshot, memory_aware=False)
        self._ran = {}
        for gpu_type in types:
            left = snapshot.capacity[gpu_type].total
            mine = [j for j, t in self._allocation.items() if t == gpu_type and j in jobs]
            worked = self._worker_time[gpu_type]

            def priority(job_id: str, worked: float = worked) -> tuple[float, float]:
                fraction = self._job_time[job_id] / worked if worked > 0 else 0.0
                value = 1.0 / fraction if fraction > 0 else NEW_JOB_PRIORITY
                return (value, self._deficit[job_id])

            # Gavel sorts (priority, deficit) descending, stable on its dict's order (job id).
            for job_id in sorted(sorted(mine), key=priority, reverse=True):
                scale = self._scale[job_id]
                if scale > left:
                    continue
                options = plan.options(jobs[job_id])
                check = next((c for t, c in options.now if t == gpu_type), None)
                if check is None:
                    continue
                plan.admit(jobs[job_id], gpu_type, check)
                self._ran[job_id] = gpu_type
                left -= scale
        for job_id, job in jobs.items():
            if job_id not in self._ran:
                plan.wait(job, WaitReason("capacity", "time-sliced: not run this round"))
        return plan.decisions()


def same_jobs_avg_jct(
    result: SimResult, gavel_jct: Mapping[int, float]
) -> tuple[float, float, int]:
    """Our average JCT and Gavel's over the jobs both completed, and how many: Gavel numbers
    jobs in trace order from 0 and leaves failed ones out; ours are `job-<line>`."""
    ours = {int(o.id.split("-")[1]) - 1: o.end_s - o.arrival_s for o in result.jobs}
    common = set(gavel_jct) & set(ours)
    mine = sum(ours[j] for j in common) / len(common)
    theirs = sum(gavel_jct[j] for j in common) / len(common)
    return mine, theirs, len(common)
