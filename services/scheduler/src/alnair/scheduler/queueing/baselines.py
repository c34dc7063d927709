"""The baseline queueing policies: `fifo`, `sjf` and `drf`, as the peers run them.

- `fifo`: arrival order, strict within a queue (a queue's head that cannot start blocks the
  jobs behind it, as Kueue's StrictFIFO and Gavel's FIFO do); the GPU type is drawn at random
  among those with room, as Gavel's FIFO does (seeded by job id, so decisions stay pure).
- `sjf`: shortest predicted runtime first (the job's best GPU type), not strict: a job that
  cannot start lets shorter-or-longer jobs behind it start; the fastest type with room.
- `drf`: dominant-resource fairness across queues: the queue whose weighted dominant share of
  the GPU pools is lowest admits its next job (FIFO within a queue), one job at a time, until
  no queue can admit; the fastest type with room.

All three enforce quotas through the shared ledger and never preempt (Kueue's default
`reclaimWithinCohort: Never`). `memory_aware=False` makes them blind to predicted GPU memory,
as Kueue, Volcano and Gavel are; the benchmark runs them that way to count the OOMs it causes.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from alnair.scheduler.queueing.model import Decisions, JobSpec, QueueSnapshot, WaitReason
from alnair.scheduler.queueing.plan import Options, Plan
from alnair.scheduler.queueing.quota import QuotaCheck


def best_runtime_s(job: JobSpec, types: Sequence[str]) -> float:
    """The job's shortest predicted runtime over `types` (inf when none is predicted)."""
    known = [job.runtime[t].expected_s for t in types if t in job.runtime]
    return min(known, default=float("inf"))


def fastest(job: JobSpec, choices: list[tuple[str, QuotaCheck]]) -> tuple[str, QuotaCheck]:
    """The choice with the shortest predicted runtime (first on ties and unknowns)."""
    return min(
        choices,
        key=lambda c: job.runtime[c[0]].expected_s if c[0] in job.runtime else float("inf"),
    )


def _blocked_by(head: JobSpec, reason: WaitReason) -> WaitReason:
    return WaitReason(reason.kind, f"behind {head.id} in queue {head.queue}: {reason.message}")


@dataclass(frozen=True)
class Fifo:
    name: str = "fifo"
    memory_aware: bool = True
    seed: int = 0

    def _pick(self, job: JobSpec, options: Options) -> tuple[str, QuotaCheck]:
        index = zlib.crc32(f"{self.seed}:{job.id}".encode()) % len(options.now)
        return options.now[index]

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        plan = Plan(snapshot, memory_aware=self.memory_aware)
        blocked: dict[str, tuple[JobSpec, WaitReason]] = {}
        for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.arrival_s, j.id)):
            if job.queue in blocked:
                head, reason = blocked[job.queue]
                plan.wait(job, _blocked_by(head, reason))
                continue
            options = plan.options(job)
            if options.reason is not None:
                plan.wait(job, options.reason)
                blocked[job.queue] = (job, options.reason)
                continue
            gpu_type, check = self._pick(job, options)
            plan.admit(job, gpu_type, check)
        return plan.decisions()


@dataclass(frozen=True)
class Sjf:
    name: str = "sjf"
    memory_aware: bool = True

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        plan = Plan(snapshot, memory_aware=self.memory_aware)
        types = list(snapshot.capacity)
        order = sorted(
            snapshot.pending,
            key=lambda j: (
                -j.priority,
                best_runtime_s(j, j.allowed_types(types)),
                j.arrival_s,
                j.id,
            ),
        )
        for job in order:
            options = plan.options(job)
            if options.reason is not None:
                plan.wait(job, options.reason)
                continue
            gpu_type, check = fastest(job, options.now)
            plan.admit(job, gpu_type, check)
        return plan.decisions()


@dataclass(frozen=True)
class Drf:
    name: str = "drf"
    memory_aware: bool = True

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        plan = Plan(snapshot, memory_aware=self.memory_aware)
        totals = {t: pool.total for t, pool in snapshot.capacity.items()}
        usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for run in snapshot.running:
            usage[run.job.queue][run.gpu_type] += run.gpus
        by_queue: dict[str, list[JobSpec]] = defaultdict(list)
        for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.arrival_s, j.id)):
            by_queue[job.queue].append(job)

        def share(queue: str) -> float:
            weight = snapshot.queues[queue].weight if queue in snapshot.queues else 1.0
            used = usage[queue]
            dominant = max((used[t] / totals[t] for t in totals if totals[t] > 0), default=0.0)
            return dominant / weight

        heads = dict.fromkeys(by_queue, 0)
        while heads:
            queue = min(heads, key=lambda q: (share(q), q))
            jobs = by_queue[queue]
            job = jobs[heads[queue]]
            options = plan.options(job)
            if options.reason is not None:
                # The queue's head cannot start: the queue admits nothing more this round.
                plan.wait(job, options.reason)
                for later in jobs[heads[queue] + 1 :]:
                    plan.wait(later, _blocked_by(job, options.reason))
                del heads[queue]
                continue
            gpu_type, check = fastest(job, options.now)
            plan.admit(job, gpu_type, check)
            usage[queue][gpu_type] += job.gpus
            heads[queue] += 1
            if heads[queue] == len(jobs):
                del heads[queue]
        return plan.decisions()
