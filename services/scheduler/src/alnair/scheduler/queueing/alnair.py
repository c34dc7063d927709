"""`alnair`: the queueing policy that orders, places and protects jobs by predicted runtime.

What it does that the baselines do not, each for a failure the peers' issue trackers report:

1. Order: shortest predicted runtime first (on the job's best GPU type), which minimises
   average completion time; jobs that fit in their queue's nominal quota go before jobs that
   would borrow, so lending never costs the lender its turn.
2. GPU type by predicted completion: of the types with room, the fastest; a faster type that
   is busy is waited for when its predicted completion (predicted release of GPUs + runtime)
   beats the free type's by `patience` (heterogeneity-aware, as Gavel's policies are).
3. Bounded waits: a job that has waited `max_wait_s` goes to the front and, if its queue's
   quota holds it back, keeps that quota (later jobs of the queue start only if predicted to
   end before the quota frees); if GPUs hold it back, it
   gets a reservation on the GPU type where it is predicted to complete first, at the time
   enough GPUs are predicted to be free there (EASY backfilling). Jobs behind it may use that
   type only if the *upper bound* of their predicted runtime ends before the reservation, or
   if they fit in the GPUs the reservation leaves over. So an 8-GPU job is not overtaken
   forever by a stream of small ones (Volcano #3095, KAI #1969).
4. Memory safety: a type whose GPU memory is below the job's predicted peak is never chosen.
5. Reclaim: an owner within its nominal quota that is blocked by jobs borrowing its lent
   quota preempts the cheapest borrowers (least restart cost, latest started), unless the
   GPUs are predicted to free up by themselves sooner than the restarts would cost.
6. Shortest remaining time (`preempt`): a job that still cannot start displaces running jobs
   predicted to need longer than it, by more than their restart cost, on the GPU type where
   it is predicted to finish first. Swapping the two saves the longer job's remaining time
   less the shorter one's and the restart, so the exchange is made only when that is
   positive, and only when the GPUs are not predicted to free by themselves within the
   restart cost. Never preempted: a job preempted `max_preemptions` times already, a job of
   unknown runtime, a job that has waited past `max_wait_s` (aging bounds the wait of the
   long jobs SRPT defers), another queue's job within its nominal quota (a borrower of
   another queue may be displaced, as in Kueue's `reclaimWithinCohort`), and GPUs reserved
   for an aged job. The decision is a plain `Preemption` (the dispatcher suspends the Job,
   the simulator checkpoints it), so this is what Gavel's rounds do, made only where the
   prediction says it pays.
"""

from __future__ import annotations

from dataclasses import dataclass

from alnair.scheduler.queueing.baselines import best_runtime_s
from alnair.scheduler.queueing.model import (
    Decisions,
    JobSpec,
    Preemption,
    QueueSnapshot,
    Reservation,
    RunningJob,
    WaitReason,
)
from alnair.scheduler.queueing.plan import Options, Plan, fits_memory
from alnair.scheduler.queueing.quota import QuotaCheck

INF = float("inf")


@dataclass(slots=True)
class _Shadow:
    """A reservation on one GPU type: GPUs are promised at `start_s`; `extra` are spare then."""

    job_id: str
    start_s: float
    extra: int


def _earliest_free_s(
    now_s: float, free: int, releases: list[tuple[float, int]], gpus: int
) -> float:
    """When `gpus` GPUs are predicted free, given `free` now and predicted (end, gpus) releases."""
    if free >= gpus:
        return now_s
    for end_s, count in sorted(releases):
        free += count
        if free >= gpus:
            return end_s
    return INF


def _free_at(free: int, releases: list[tuple[float, int]], at_s: float) -> int:
    return free + sum(count for end_s, count in releases if end_s <= at_s)


@dataclass(frozen=True)
class Alnair:
    name: str = "alnair"
    max_wait_s: float = 4 * 3600.0
    """A job waiting longer than this goes to the front and gets a reservation."""
    patience: float = 0.8
    """Wait for a busy faster type when its predicted completion is below this fraction of
    the best free type's (1.0 waits whenever busy is predicted better; 0 never waits)."""
    reclaim: bool = True
    response_ratio: bool = False
    """Order by predicted runtime over (1 + w * waited / runtime) instead of runtime alone."""
    response_weight: float = 1.0
    """Preempt borrowers when an owner within its nominal quota needs its GPUs back."""
    preempt: bool = True
    """Shortest remaining predicted time: a waiting job preempts running jobs predicted to
    need longer than it by more than their restart cost (rule 6 above)."""
    max_preemptions: int = 2
    """A job preempted this many times is not preempted again (rule 6)."""

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        plan = Plan(snapshot, memory_aware=True)
        now = snapshot.now_s
        types = plan.types
        releases: dict[str, list[tuple[float, int]]] = {t: [] for t in types}
        for run in snapshot.running:
            if run.gpu_type in releases:
                releases[run.gpu_type].append((run.expected_end_s(now), run.gpus))
        shadows: dict[str, _Shadow] = {}

        def safe_types(job: JobSpec) -> list[str]:
            return [
                t
                for t in job.allowed_types(types)
                if fits_memory(job, snapshot.capacity[t].memory_mib)
            ]

        def within_nominal(job: JobSpec) -> bool:
            return any(
                plan.ledger.check(job.queue, t, job.gpus).within_nominal for t in safe_types(job)
            )

        aged = sorted(
            (j for j in snapshot.pending if now - j.arrival_s >= self.max_wait_s),
            key=lambda j: (j.arrival_s, j.id),
        )
        aged_ids = {j.id for j in aged}

        def urgency(job: JobSpec) -> float:
            # Shortest predicted runtime first; with `response_ratio`, the runtime is divided by
            # how long the job has waited relative to it (highest response ratio next), so a
            # long job's turn comes without a hard wait bound.
            runtime = best_runtime_s(job, safe_types(job))
            if not self.response_ratio or runtime == INF:
                return runtime
            waited = max(0.0, now - job.arrival_s)
            return runtime / (1.0 + self.response_weight * waited / runtime)

        rest = sorted(
            (j for j in snapshot.pending if j.id not in aged_ids),
            key=lambda j: (not within_nominal(j), urgency(j), j.arrival_s),
        )

        # An aged job its own queue's quota holds back keeps that quota: later jobs of the same
        # queue start only if predicted (upper bound) to end before the quota frees for it.
        held: dict[str, tuple[str, float]] = {}
        # An owner within its nominal quota that cannot start claims its fastest type back:
        # borrowers may use that type only if predicted (upper bound) to end before the owner
        # could start. Jobs sorted as within quota that would borrow after all are deferred
        # behind every job that stays within quota, so lending never costs the lender its turn.
        claims: dict[str, tuple[str, float]] = {}
        order = aged + rest
        deferred: set[str] = set()
        position = 0
        while position < len(order):
            job = order[position]
            position += 1
            options = plan.options(job)
            startable: list[tuple[str, QuotaCheck, bool]] = []
            holder = held.get(job.queue)
            if holder is not None:
                upper = min(
                    (e.upper_s for t, e in job.runtime.items() if t in dict(options.now)),
                    default=INF,
                )
                if not (upper < INF and now + upper <= holder[1]):
                    plan.wait(
                        job,
                        WaitReason(
                            "reservation",
                            f"queue {job.queue}'s quota is reserved for {holder[0]}, which has "
                            "waited longest; this job is not predicted to end before it starts",
                        ),
                    )
                    continue
            for gpu_type, check in options.now:
                claim = claims.get(gpu_type)
                if check.borrowing and claim is not None:
                    estimate = job.runtime.get(gpu_type)
                    if estimate is None or now + estimate.upper_s > claim[1]:
                        continue
                shadow = shadows.get(gpu_type)
                if shadow is None:
                    startable.append((gpu_type, check, False))
                    continue
                estimate = job.runtime.get(gpu_type)
                upper = estimate.upper_s if estimate is not None else INF
                # Backfill only what is predicted to end before the reservation: a job of
                # unknown runtime cannot be, even when the reservation's start is unknown too.
                if upper < INF and now + upper <= shadow.start_s:
                    startable.append((gpu_type, check, False))
                elif job.gpus <= shadow.extra:
                    startable.append((gpu_type, check, True))
            choice = self._choose(job, startable, options, plan, releases)
            if choice is not None:
                gpu_type, check, uses_extra = choice
                if check.borrowing and job.id not in deferred:
                    deferred.add(job.id)
                    order.append(job)
                    continue
                plan.admit(job, gpu_type, check)
                if uses_extra:
                    shadows[gpu_type].extra -= job.gpus
                runtime = job.runtime.get(gpu_type)
                releases[gpu_type].append(
                    (now + (runtime.expected_s if runtime else INF), job.gpus)
                )
                continue
            if job.id in aged_ids and options.allowed:
                reserved = self._reserve(job, options, plan, releases, shadows)
                if reserved is not None:
                    plan.reservations.append(reserved)
                    plan.wait(
                        job,
                        WaitReason(
                            "capacity",
                            f"reserved {job.gpus} {reserved.gpu_type} GPUs from "
                            f"t={reserved.start_s:.0f}s",
                        ),
                    )
                    continue
            if (
                job.id in aged_ids
                and not options.allowed
                and options.reason is not None
                and options.reason.kind == "quota"
                and job.queue not in held
            ):
                ends = [
                    run.expected_end_s(now)
                    for run in snapshot.running
                    if run.job.queue == job.queue
                ]
                held[job.queue] = (job.id, max(ends, default=now))
            target = self._reclaim_target(job, options, safe_types(job))
            if target is not None and target not in claims:
                claims[target] = (
                    job.id,
                    _earliest_free_s(now, plan.free[target], releases[target], job.gpus),
                )
            if target is not None and self._reclaim(job, target, plan, releases):
                # Nobody else may take the reclaimed GPUs before the owner does.
                shadows[target] = _Shadow(job.id, now, 0)
                plan.wait(job, WaitReason("quota", f"reclaiming lent {target} GPUs from borrowers"))
                continue
            if options.reason is not None:
                plan.wait(job, options.reason)
            elif not startable:
                reserver = next((shadows[t].job_id for t, _ in options.now if t in shadows), "")
                plan.wait(
                    job,
                    WaitReason(
                        "reservation",
                        f"would delay the reservation of {reserver}; predicted to end too late",
                    ),
                )
            else:
                plan.wait(job, WaitReason("capacity", "waiting for a faster GPU type"))
        if self.preempt:
            # Who may be preempted at all, longest remaining first per type (a few dozen runs
            # per type, against hundreds of waiting jobs at a burst: computed once).
            victims: dict[str, list[tuple[float, RunningJob]]] = {t: [] for t in types}
            for run in snapshot.running:
                remaining = run.expected_end_s(now) - now
                if (
                    run.gpu_type in victims
                    and remaining < INF
                    and run.job.preemptions < self.max_preemptions
                    and now - run.job.arrival_s < self.max_wait_s
                ):
                    victims[run.gpu_type].append((remaining, run))
            for listed in victims.values():
                listed.sort(key=lambda v: (-v[0], v[1].job.id))
            for job in order:
                reason = plan.waiting.get(job.id)
                if reason is not None and reason.kind in ("capacity", "quota"):
                    self._displace(job, plan, releases, shadows, safe_types(job), victims)
        return plan.decisions()

    def _displace(
        self,
        job: JobSpec,
        plan: Plan,
        releases: dict[str, list[tuple[float, int]]],
        shadows: dict[str, _Shadow],
        safe: list[str],
        eligible: dict[str, list[tuple[float, RunningJob]]],
    ) -> bool:
        """Rule 6: preempt running jobs predicted to need longer than `job` (plus restart).
        `eligible`: per type, the runs rule 6 allows to preempt, longest remaining first."""
        now = plan.snapshot.now_s
        taken = {p.job_id for p in plan.preemptions}
        known = sorted(
            (job.runtime[t].expected_s, t) for t in safe if t in job.runtime and t not in shadows
        )
        for runtime, gpu_type in known:
            listed = eligible[gpu_type]
            if not listed or listed[0][0] <= runtime:
                continue
            victims: list[tuple[float, RunningJob]] = []
            for remaining, run in listed:
                if remaining <= runtime:
                    break
                if run.job.id in taken or remaining <= runtime + run.job.restart_cost_s:
                    continue
                if run.job.queue != job.queue and not run.borrowing:
                    continue
                victims.append((remaining, run))
            # Longest remaining first (as listed): each exchange then saves the most.
            chosen: list[RunningJob] = []
            freed = 0
            for _, run in victims:
                if (
                    plan.free[gpu_type] + freed >= job.gpus
                    and plan.ledger.check(job.queue, gpu_type, job.gpus).ok
                ):
                    break
                plan.ledger.release(run.job.queue, gpu_type, run.gpus)
                chosen.append(run)
                freed += run.gpus
            enough = (
                plan.free[gpu_type] + freed >= job.gpus
                and plan.ledger.check(job.queue, gpu_type, job.gpus).ok
            )
            cost = max((run.job.restart_cost_s for run in chosen), default=0.0)
            natural = _earliest_free_s(now, plan.free[gpu_type], releases[gpu_type], job.gpus)
            if not chosen or not enough or natural - now <= cost:
                for run in chosen:
                    plan.ledger.take(run.job.queue, gpu_type, run.gpus)
                continue
            # The freed GPUs are pledged to `job`: nobody else in this decision counts on them.
            plan.ledger.take(job.queue, gpu_type, job.gpus)
            plan.free[gpu_type] += freed - job.gpus
            for run in chosen:
                plan.preemptions.append(
                    Preemption(
                        run.job.id,
                        f"{job.id} is predicted to finish in {runtime:.0f}s on {gpu_type}, "
                        f"before this job's remaining {run.expected_end_s(now) - now:.0f}s",
                        job.id,
                    )
                )
            plan.wait(job, WaitReason("capacity", f"preempting longer jobs on {gpu_type}"))
            return True
        return False

    def _choose(
        self,
        job: JobSpec,
        startable: list[tuple[str, QuotaCheck, bool]],
        options: Options,
        plan: Plan,
        releases: dict[str, list[tuple[float, int]]],
    ) -> tuple[str, QuotaCheck, bool] | None:
        if not startable:
            return None

        def runtime(gpu_type: str) -> float:
            estimate = job.runtime.get(gpu_type)
            return estimate.expected_s if estimate is not None else INF

        best = min(startable, key=lambda c: runtime(c[0]))
        best_now = runtime(best[0])
        if self.patience <= 0 or best_now == INF:
            return best
        now = plan.snapshot.now_s
        startable_types = {c[0] for c in startable}
        for gpu_type, _ in options.allowed:
            if gpu_type in startable_types:
                continue
            start = _earliest_free_s(now, plan.free[gpu_type], releases[gpu_type], job.gpus)
            if start - now + runtime(gpu_type) < self.patience * best_now:
                return None
        return best

    def _reserve(
        self,
        job: JobSpec,
        options: Options,
        plan: Plan,
        releases: dict[str, list[tuple[float, int]]],
        shadows: dict[str, _Shadow],
    ) -> Reservation | None:
        now = plan.snapshot.now_s
        best: tuple[float, str, float] | None = None
        for gpu_type, _ in options.allowed:
            if gpu_type in shadows:
                continue
            start = _earliest_free_s(now, plan.free[gpu_type], releases[gpu_type], job.gpus)
            estimate = job.runtime.get(gpu_type)
            end = start + (estimate.expected_s if estimate is not None else 0.0)
            if best is None or (end, start) < (best[0], best[2]):
                best = (end, gpu_type, start)
        if best is None:
            return None
        # A start of INF (the holders' runtimes are unknown) still reserves: the GPUs freed on
        # that type go to this job first, whenever that is.
        _, gpu_type, start = best
        spare = _free_at(plan.free[gpu_type], releases[gpu_type], start) - job.gpus
        shadows[gpu_type] = _Shadow(job.id, start, max(0, spare))
        return Reservation(job.id, gpu_type, start)

    def _reclaim_target(self, job: JobSpec, options: Options, safe: list[str]) -> str | None:
        """The type to reclaim for `job`: its fastest safe type, if that one is reclaimable.
        Reclaiming a slower type would be undone at once by the wait for the faster one."""
        if not self.reclaim or not options.reclaimable or not safe:
            return None
        fastest = min(
            safe,
            key=lambda t: job.runtime[t].expected_s if t in job.runtime else INF,
        )
        return fastest if fastest in options.reclaimable else None

    def _reclaim(
        self,
        job: JobSpec,
        gpu_type: str,
        plan: Plan,
        releases: dict[str, list[tuple[float, int]]],
    ) -> bool:
        snapshot = plan.snapshot
        now = snapshot.now_s
        queue = snapshot.queues.get(job.queue)
        if queue is None or queue.cohort is None:
            return False
        victims: list[RunningJob] = sorted(
            (
                run
                for run in snapshot.running
                if run.gpu_type == gpu_type
                and run.job.queue != job.queue
                and run.job.queue in snapshot.queues
                and snapshot.queues[run.job.queue].cohort == queue.cohort
                and plan.ledger.borrowed(run.job.queue, gpu_type) > 0
                and run.job.id not in {p.job_id for p in plan.preemptions}
            ),
            # Runs above their queue's nominal quota first (an elastic job's surplus before
            # its guaranteed minimum), then the cheapest to restart, the latest started.
            key=lambda r: (not r.borrowing, r.job.restart_cost_s, -r.start_s, r.job.id),
        )
        chosen: list[RunningJob] = []
        freed = 0
        for victim in victims:
            if plan.ledger.borrowed(victim.job.queue, gpu_type) <= 0:
                continue
            plan.ledger.release(victim.job.queue, gpu_type, victim.gpus)
            chosen.append(victim)
            freed += victim.gpus
            room = plan.free[gpu_type] + freed >= job.gpus
            if room and plan.ledger.check(job.queue, gpu_type, job.gpus).ok:
                break
        enough = (
            plan.free[gpu_type] + freed >= job.gpus
            and plan.ledger.check(job.queue, gpu_type, job.gpus).ok
        )
        natural_wait = (
            _earliest_free_s(now, plan.free[gpu_type], releases[gpu_type], job.gpus) - now
        )
        cost = sum(v.job.restart_cost_s * v.gpus for v in chosen)
        if not enough or cost >= natural_wait * job.gpus:
            for victim in chosen:
                plan.ledger.take(victim.job.queue, gpu_type, victim.gpus)
            return False
        for victim in chosen:
            plan.preemptions.append(
                Preemption(
                    victim.job.id,
                    f"queue {job.queue} reclaims {gpu_type} GPUs lent to {victim.job.queue}",
                    job.id,
                )
            )
        return True
