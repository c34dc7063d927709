"""`alnair`: the queueing policy that orders, places and protects jobs by predicted runtime.

Each decision re-plans the whole cluster: running and waiting jobs together are placed from
empty GPUs in one order, and a running job the plan leaves out is preempted (suspended, its
progress kept as from a checkpoint). The rules, each for a failure the peers' trackers report
or the Gavel comparison showed:

1. Order: shortest predicted remaining time first, less a credit for time already spent
   waiting (`wait_credit` seconds per second waited): `remaining - wait_credit * waited`. A
   running job's remaining time is reduced by its restart cost, so a waiting job displaces it
   only when swapping the two saves more than the restart. The credit is the wait bound of
   the ordering: after waiting `W` a job is ahead of every job predicted to need more than
   `remaining - wait_credit * W`, so no job waits forever behind a stream of short ones
   (Volcano #3095, YuniKorn-1185).
2. Quota first (Kueue's reclaim): GPUs within each queue's nominal quota are planned before
   any borrowing, so an owner takes its lent quota back from borrowers (`reclaim`), and a
   running job admitted within its queue's nominal quota is never displaced by another queue.
3. GPU type by predicted runtime (heterogeneity-aware): the fastest type with room, but never
   one predicted more than `max_slowdown` times slower than the job's fastest type while the
   job could wait for a better one; a running job moves to a faster type when that at least
   halves its remaining time (`migrate_gain`), restart included.
4. Fill: GPUs still idle once everyone is planned go to waiting jobs on types up to
   `fill_slowdown` times slower, when their better types are not predicted to free within the
   restart cost. Such a filler is the first to make room (it is planned last, and moves to a
   better type as one frees). Gavel's rounds use slow GPUs this way, by time-slicing.
5. Bounded waits, hard (opt-in: `max_wait_s` is off by default, the credit of rule 1 bounds
   waits): a job that has waited `max_wait_s` goes ahead of every waiting job
   (and of running jobs predicted to need longer). If its queue's quota holds it back, it
   keeps that quota: later jobs of the queue start only if their *upper bound* ends before
   the quota frees. If GPUs hold it back (jobs that may not be preempted), it gets a
   reservation on the type where it completes first, at the predicted time enough GPUs free
   (EASY backfilling: later jobs use that type only when their upper bound ends before the
   reservation or they fit in what it leaves spare). So an 8-GPU gang is not overtaken
   forever (KAI #1969).
6. Memory safety: a type whose GPU memory is below the job's predicted peak is never planned.
7. Never preempted: a job of unknown runtime (except by reclaim: an owner takes back lent
   quota whatever the borrower runs), a job already preempted `max_preemptions` times, a job
   that had waited past `max_wait_s` when it started, another queue's job within its nominal
   quota. Nothing is preempted when the GPUs the plan needs are predicted to free by
   themselves within the victims' restart cost. With `preempt=False` no running job moves
   (the multi-cluster hub, which never preempts across clusters).

The decision is plain `Preemption`s and `Admission`s: the dispatcher suspends and unsuspends
Jobs, the simulator checkpoints and restarts them. GPUs of preempted jobs are admitted in the
next decision, once they have stopped (the `Decisions` contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from alnair.scheduler.queueing.baselines import best_runtime_s
from alnair.scheduler.queueing.model import (
    Decisions,
    JobSpec,
    Preemption,
    PreemptionRules,
    QueueSnapshot,
    Reservation,
    RunningJob,
    WaitReason,
    gpu_type_of,
)
from alnair.scheduler.queueing.permits import refused
from alnair.scheduler.queueing.plan import Plan, fits_memory
from alnair.scheduler.queueing.quota import QuotaCheck, QuotaLedger

INF = float("inf")
SWAP_POOL = 12
"""Rule 9: jobs per type tried for swaps in one pass (bounds a decision's cost)."""
SWAP_PASSES = 3
SWAP_MIN_GAIN_S = 1.0
"""A swap must cut the pair's predicted completions by at least this (no churn on ties)."""


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


@dataclass(slots=True)
class _Item:
    """One job in the plan: waiting (`run` is None) or running."""

    job: JobSpec
    run: RunningJob | None
    remaining_s: float
    """Predicted remaining time on its fastest safe type (INF when unknown)."""
    key: float
    pinned: bool
    """A running job no other job may displace (rule 7); reclaim may still take a borrower."""
    aged: bool = False
    penalty: float = 0.0
    """Rule 8: seconds its queue's history adds to its key (in `key` already, when finite)."""
    safe: list[str] = field(default_factory=list)
    """Types the job may use: its constraint, memory, a known runtime where any is known."""


def _by_key(item: _Item) -> tuple[float, float, float, str]:
    return (item.key, item.penalty, item.job.arrival_s, item.job.id)


@dataclass(slots=True)
class _Shadow:
    """A reservation on one GPU type: GPUs promised at `start_s`; `extra` are spare then."""

    job_id: str
    start_s: float
    extra: int


class _Replan:
    """The working state of one decision: a virtual cluster filled in the policy's order."""

    def __init__(self, policy: Alnair, snapshot: QueueSnapshot) -> None:
        self.policy = policy
        self.snapshot = snapshot
        self.now = snapshot.now_s
        self.types = list(snapshot.capacity)
        self.free = {t: pool.total for t, pool in snapshot.capacity.items()}
        """The plan's GPUs: all of them, filled as jobs are planned."""
        self.real_free = {t: pool.free for t, pool in snapshot.capacity.items()}
        """The cluster's free GPUs now: where predicted starts are counted from."""
        self.ledger = QuotaLedger(snapshot.queues)
        self.chosen: dict[str, tuple[str, QuotaCheck]] = {}
        self.protected: dict[tuple[str, str], int] = {}
        """(type, queue) -> GPUs of that queue's within-nominal runs not yet planned: no other
        queue's job may be planned onto them."""
        self.releases: dict[str, list[tuple[float, int]]] = {t: [] for t in self.types}
        self.shadows: dict[str, _Shadow] = {}
        self.held: dict[str, tuple[str, float]] = {}
        self.blocked: dict[str, WaitReason] = {}
        self.reservations: list[Reservation] = []
        self.penalty = self._penalties(policy, snapshot)
        self.skipped_moves: dict[str, tuple[float, str]] = {}
        """Running job -> (predicted time left after the best move not taken, why)."""
        for run in snapshot.running:
            if run.gpu_type in self.releases:
                self.releases[run.gpu_type].append((run.expected_end_s(self.now), run.gpus))
            if not run.borrowing and run.gpu_type in self.free:
                key = (run.gpu_type, run.job.queue)
                self.protected[key] = self.protected.get(key, 0) + run.gpus

    @staticmethod
    def _penalties(policy: Alnair, snapshot: QueueSnapshot) -> dict[str, float]:
        """Rule 8: per queue, `fair_share` times the cluster-seconds its history per weight
        exceeds the least-served queue's (0 for all without history or with it off)."""
        if not policy.fair_share or not snapshot.usage:
            return {}
        total = sum(pool.total for pool in snapshot.capacity.values()) or 1
        shares = {
            name: snapshot.usage.get(name, 0.0) / spec.weight
            for name, spec in snapshot.queues.items()
        }
        floor = min(shares.values(), default=0.0)
        return {q: policy.fair_share * (s - floor) / total for q, s in shares.items()}

    def start_s(self, gpu_type: str, gpus: int) -> float:
        """When `gpus` GPUs of the type are predicted free, from now and the runs' ends."""
        return _earliest_free_s(self.now, self.real_free[gpu_type], self.releases[gpu_type], gpus)

    def upper_s(self, job: JobSpec, gpu_type: str) -> float:
        estimate = job.runtime.get(gpu_type)
        return estimate.upper_s if estimate is not None else INF

    def runtime(self, job: JobSpec, gpu_type: str) -> float:
        estimate = job.runtime.get(gpu_type)
        return estimate.expected_s if estimate is not None else INF

    def room(self, item: _Item, gpu_type: str) -> int:
        """Free GPUs of the type for the item, less what protected runs hold: every other
        queue's, and for a running borrower its own queue's too (a queue's waiting jobs may
        displace its own runs, a borrower never displaces a run within the quota)."""
        borrower = item.run is not None and item.run.borrowing
        held = sum(
            gpus
            for (t, queue), gpus in self.protected.items()
            if t == gpu_type and (queue != item.job.queue or borrower)
        )
        return self.free[gpu_type] - held

    def candidates(self, item: _Item, slowdown: float) -> list[tuple[float, str]]:
        """(predicted remaining runtime, type) the item may be planned on."""
        job = item.job
        fastest = best_runtime_s(job, item.safe)

        def within(t: str) -> bool:
            return fastest == INF or self.runtime(job, t) <= slowdown * fastest

        if item.run is None:
            found = [(self.runtime(job, t), t) for t in item.safe if within(t)]
            if len(found) < len(item.safe) and fastest < INF and not self.policy.preempt:
                # Without preemption (no fill, rule 4) a slower type is still taken when it
                # is predicted to finish sooner than waiting for the faster ones (their
                # predicted release, then the runtime): the job cannot move later.
                wait = self.completion_by_waiting(item, [t for _, t in found])
                found += [
                    (self.runtime(job, t), t)
                    for t in item.safe
                    if not within(t) and self.now + self.runtime(job, t) < wait
                ]
            return found
        current = item.run.gpu_type
        left = item.run.expected_end_s(self.now) - self.now
        out: list[tuple[float, str]] = []
        if within(current) or item.pinned or not self.policy.preempt:
            out.append((left, current))
        if not item.pinned and self.policy.preempt and left < INF:
            fraction = left / self.runtime(job, current)
            for t in item.safe:
                if t == current or not within(t):
                    continue
                moved = fraction * self.runtime(job, t) + job.restart_cost_s
                if moved <= self.policy.migrate_gain * left:
                    out.append((moved, t))
                elif moved - job.restart_cost_s < left:
                    self._skipped(job, current, t, left, moved)
        return out

    def _skipped(self, job: JobSpec, current: str, to: str, left: float, moved: float) -> None:
        """Remember the most promising move that was faster there but not worth a restart."""
        best = self.skipped_moves.get(job.id)
        if best is not None and best[0] <= moved:
            return
        self.skipped_moves[job.id] = (
            moved,
            f"stays on {current}: a move to {to} would leave {moved:.0f} s, the restart and "
            f"the work since its last checkpoint ({job.restart_cost_s:.0f} s) included, against "
            f"{left:.0f} s here; a move must cut that to {self.policy.migrate_gain:.0%}",
        )

    def _ends_by(self, upper_s: float, at_s: float) -> bool:
        """A job started now is predicted (upper bound) to end by `at_s`; a job of unknown
        runtime never is, even when `at_s` is unknown (INF) too."""
        return upper_s < INF and self.now + upper_s <= at_s

    def completion_by_waiting(self, item: _Item, types: list[str]) -> float:
        """The earliest predicted completion on `types` when started as GPUs free there."""
        return min(
            (self.start_s(t, item.job.gpus) + self.runtime(item.job, t) for t in types),
            default=INF,
        )

    def place(self, item: _Item, *, slowdown: float, nominal_only: bool) -> bool:
        job = item.job
        holder = self.held.get(job.queue)
        options: list[tuple[float, str, QuotaCheck]] = []
        for runtime, gpu_type in self.candidates(item, slowdown):
            if self.room(item, gpu_type) < job.gpus:
                continue
            check = self.ledger.check(job.queue, gpu_type, job.gpus)
            if not check.ok or (nominal_only and not check.within_nominal):
                continue
            if item.run is None:
                upper = self.upper_s(job, gpu_type)
                if (
                    holder is not None
                    and holder[0] != job.id
                    and not self._ends_by(upper, holder[1])
                ):
                    self.blocked[job.id] = WaitReason(
                        "reservation",
                        f"queue {job.queue}'s quota is reserved for {holder[0]}, which has "
                        "waited longest; this job is not predicted to end before it starts",
                    )
                    continue
                shadow = self.shadows.get(gpu_type)
                if (
                    shadow is not None
                    and shadow.job_id != job.id
                    and not (self._ends_by(upper, shadow.start_s) or job.gpus <= shadow.extra)
                ):
                    self.blocked[job.id] = WaitReason(
                        "reservation",
                        f"would delay the reservation of {shadow.job_id}; "
                        "predicted to end too late",
                    )
                    continue
            options.append((runtime, gpu_type, check))
        if not options:
            return False
        _, gpu_type, check = min(options, key=lambda o: o[0])
        shadow = self.shadows.get(gpu_type)
        if (
            item.run is None
            and shadow is not None
            and shadow.job_id != job.id
            and not self._ends_by(self.upper_s(job, gpu_type), shadow.start_s)
        ):
            shadow.extra -= job.gpus  # it runs past the reservation: it uses the spare GPUs
        self.free[gpu_type] -= job.gpus
        self.ledger.take(job.queue, gpu_type, job.gpus)
        self.chosen[job.id] = (gpu_type, check)
        self.blocked.pop(job.id, None)
        # The queue's own job (waiting, or a run within the quota) uses the room its protected
        # runs hold.
        key = (gpu_type, job.queue)
        if key in self.protected and not (item.run is not None and item.run.borrowing):
            self.protected[key] = max(0, self.protected[key] - job.gpus)
        return True

    def assign_types(
        self, order: list[_Item], cap: Callable[[_Item], float], migrate_gain: float
    ) -> None:
        """Rule 9: fast types go where they cut the predicted completions the most.

        Placing in key order gives each job the fastest type left, so the shortest jobs take
        the fastest GPUs, though a short job may gain little there and a long one much. So
        the plan then tries swapping the slots of two jobs it starts, of one queue and one GPU
        count, planned on two types, and keeps a swap when it lowers the pair's predicted
        completions (`pair_s`: the one that ends first frees its GPUs and the other moves
        there when a move would pay, rule 3's gain, any gain when moves are free). So
        shortest-first stays wherever the short job's slowdown elsewhere is large, and a fast
        GPU goes to a long job where the short one hardly needs it. Running jobs move by rule
        3 alone (moving them here too doubled the preemptions per job for mixed gains), and a
        type under a reservation is left alone. A swap trades whole slots (type and quota
        check) within one queue, so GPUs, quotas and reservations stay as planned. The
        `SWAP_POOL` jobs most likely to gain on each side are tried, for a bounded cost."""
        groups: dict[tuple[str, int], list[_Item]] = {}
        for item in order:  # jobs this plan starts: a running job moves by rule 3 only
            if item.run is None and item.job.id in self.chosen and item.job.queue not in self.held:
                groups.setdefault((item.job.queue, item.job.gpus), []).append(item)
        types = [t for t in self.types if t not in self.shadows]
        work: dict[tuple[str, str], float] = {}

        def work_s(item: _Item, gpu_type: str) -> float:
            """Predicted time to finish on `gpu_type` without a restart (INF: may not go)."""
            key = (item.job.id, gpu_type)
            if key not in work:
                work[key] = self._work_s(item, gpu_type, cap(item))
            return work[key]

        def pair_s(x: _Item, tx: str, y: _Item, ty: str) -> float:
            cx, cy = work_s(x, tx), work_s(y, ty)
            if cx > cy:
                x, tx, y, ty, cx, cy = y, ty, x, tx, cy, cx
            if cx == INF or cy <= cx:  # (cy == cx: both end together)
                return cx + cy
            # When x ends, y moves to x's GPUs if a move would (rule 3's gain; any gain
            # when moves are free).
            left = cy - cx
            moved = y.job.restart_cost_s + left / cy * work_s(y, tx)
            gain = 1.0 if y.job.restart_cost_s <= 0 else migrate_gain
            return cx + (cx + moved if moved <= gain * left else cy)

        for members in groups.values():
            if len(members) < 2:
                continue
            for _ in range(SWAP_PASSES):
                changed = False
                for index, first in enumerate(types):
                    for second in types[index + 1 :]:
                        changed |= self._swap(members, first, second, work_s, pair_s)
                if not changed:
                    break

    def _work_s(self, item: _Item, gpu_type: str, cap: float) -> float:
        job = item.job
        if gpu_type not in item.safe or job.gpu_model not in (None, gpu_type):
            return INF
        fastest = best_runtime_s(job, item.safe)
        runtime = self.runtime(job, gpu_type)
        if fastest == INF or runtime > cap * fastest:
            return INF
        return runtime

    def _swap(
        self,
        members: list[_Item],
        first: str,
        second: str,
        work_s: Callable[[_Item, str], float],
        pair_s: Callable[[_Item, str, _Item, str], float],
    ) -> bool:
        """One pass of pairwise swaps between the group's slots on `first` and `second`."""

        def on(gpu_type: str, other: str) -> list[_Item]:
            # Those that lose least by leaving `gpu_type` for `other` first.
            here = [
                i
                for i in members
                if self.chosen[i.job.id][0] == gpu_type and work_s(i, other) < INF
            ]
            here.sort(key=lambda i: (work_s(i, other) - work_s(i, gpu_type), i.job.id))
            return here[:SWAP_POOL]

        changed = False
        for x in on(first, second):
            for y in on(second, first):
                if self.chosen[x.job.id][0] != first or self.chosen[y.job.id][0] != second:
                    continue
                if pair_s(x, second, y, first) < pair_s(x, first, y, second) - SWAP_MIN_GAIN_S:
                    self.chosen[x.job.id], self.chosen[y.job.id] = (
                        self.chosen[y.job.id],
                        self.chosen[x.job.id],
                    )
                    changed = True
        return changed

    def hold(self, item: _Item) -> None:
        """Rule 5 for an aged job that could not be planned: keep its queue's quota, or
        reserve GPUs on the type where it is predicted to complete first."""
        job = item.job
        if job.id in {r.job_id for r in self.reservations}:
            return
        quota_bound = all(not self.ledger.check(job.queue, t, job.gpus).ok for t in item.safe)
        if not quota_bound and any(self.room(item, t) >= job.gpus for t in item.safe):
            return  # GPUs and quota are there: what held it back passes later in the plan
        if quota_bound:
            if job.queue not in self.held:
                ends = [
                    run.expected_end_s(self.now)
                    for run in self.snapshot.running
                    if run.job.queue == job.queue
                ]
                self.held[job.queue] = (job.id, max(ends, default=self.now))
            return
        best: tuple[float, float, str] | None = None
        for gpu_type in item.safe:
            if gpu_type in self.shadows:
                continue
            start = self.start_s(gpu_type, job.gpus)
            runtime = self.runtime(job, gpu_type)
            end = start + (runtime if runtime < INF else 0.0)
            if best is None or (end, start) < (best[0], best[1]):
                best = (end, start, gpu_type)
        if best is None:
            return
        # A start of INF (the holders' runtimes are unknown) still reserves: the GPUs freed on
        # that type go to this job first, whenever that is.
        _, start, gpu_type = best
        spare = _free_at(self.real_free[gpu_type], self.releases[gpu_type], start) - job.gpus
        self.shadows[gpu_type] = _Shadow(job.id, start, max(0, spare))
        self.reservations.append(Reservation(job.id, gpu_type, start))


@dataclass(frozen=True)
class Alnair:
    name: str = "alnair"
    max_wait_s: float = INF
    """Rule 5: a job that has waited this long goes first, keeps its quota or reserves GPUs.
    Off by default: on every trace measured the wait credit bounded waits as well or better,
    and under overload (every job waiting past any bound) the rule turns the queue into
    first-come-first-served with idle reserved GPUs (issue 28's note: 4 h cost the Philly
    trace 77% of average JCT, 7 days 38%)."""
    wait_credit: float = 0.3
    """Rule 1: seconds of predicted runtime forgiven per second already waited."""
    max_slowdown: float = 3.0
    """Rule 3: never plan a job on a type predicted more than this many times slower than its
    fastest type, while it could wait for a better one."""
    fill_slowdown: float = 6.0
    """Rule 4: idle GPUs go to waiting jobs up to this slowdown (0 turns filling off; so does
    `preempt=False`, since a filler must be able to make room)."""
    migrate_gain: float = 0.5
    """Rule 3: a running job moves to a faster type when that cuts its remaining time, restart
    included, to at most this fraction."""
    reclaim: bool = True
    """Rule 2: owners within their nominal quota are planned before borrowers."""
    preempt: bool = True
    """Whether the plan may preempt running jobs at all (rules 1, 3, 4)."""
    max_preemptions: int = 10
    """Rule 7: a job preempted this many times is not preempted again."""
    fair_share: float = 0.0
    """Rule 8, fair sharing by history: a job's key grows by this factor times the seconds of
    the whole cluster its queue used (its decayed history per weight, `QueueSnapshot.usage`)
    beyond the least-served queue; so a queue that ran more recently yields to one that ran
    less, by as much as it ran more. 0 turns it off (and the snapshot needs a history)."""

    def decide(self, snapshot: QueueSnapshot) -> Decisions:
        plan = _Replan(self, snapshot)
        items = [self._item(plan, job) for job in snapshot.pending]
        items += [self._running(plan, run) for run in snapshot.running if run.gpu_type in plan.free]
        order = self._order(items)
        # With reclaim, a first pass plans only what fits within each queue's nominal quota.
        for nominal_only in (True, False) if self.reclaim else (False,):
            for item in order:
                if item.job.id in plan.chosen:
                    continue
                placed = plan.place(
                    item,
                    slowdown=self._slowdown(item, self.max_slowdown),
                    nominal_only=nominal_only,
                )
                if not placed and item.aged:
                    plan.hold(item)
        if self.fill_slowdown > 0 and self.preempt:  # a filler must be able to make room
            for item in order:
                if item.job.id not in plan.chosen and self._may_fill(plan, item):
                    slowdown = self._slowdown(item, self.fill_slowdown)
                    plan.place(item, slowdown=slowdown, nominal_only=False)
        plan.assign_types(
            order, lambda item: self._slowdown(item, self.max_slowdown), self.migrate_gain
        )
        return self._decisions(plan, order)

    def _slowdown(self, item: _Item, cap: float) -> float:
        """Rules 3 and 4 keep a job off slow types because it cannot leave them for free; a
        job that moves at no cost (restart cost 0, as in Gavel's rounds, and a policy that
        may move jobs) takes any type, and the next plan moves it to a faster one as one
        frees."""
        return INF if self.preempt and item.job.restart_cost_s <= 0 else cap

    def _item(self, plan: _Replan, job: JobSpec) -> _Item:
        safe = self._safe(plan, job)
        remaining = best_runtime_s(job, safe)
        key = remaining - self.wait_credit * job.waited_s if remaining < INF else INF
        aged = job.waited_s >= self.max_wait_s
        penalty = plan.penalty.get(job.queue, 0.0)
        return _Item(job, None, remaining, key + penalty, pinned=False, aged=aged, safe=safe,
                     penalty=penalty)  # fmt: skip

    def _running(self, plan: _Replan, run: RunningJob) -> _Item:
        job = run.job
        safe = self._safe(plan, job)
        left = run.expected_end_s(plan.now) - plan.now
        remaining = left
        if left < INF and run.gpu_type in job.runtime:
            fraction = left / plan.runtime(job, run.gpu_type)
            moved = [fraction * plan.runtime(job, t) + job.restart_cost_s for t in safe]
            remaining = min([left, *moved])
        pinned = (
            not self.preempt
            or left == INF
            or job.preemptions >= self.max_preemptions
            or job.waited_s >= self.max_wait_s
        )
        penalty = plan.penalty.get(job.queue, 0.0)
        key = remaining - job.restart_cost_s - self.wait_credit * job.waited_s + penalty
        return _Item(job, run, remaining, key if left < INF else INF, pinned=pinned, safe=safe,
                     penalty=penalty)  # fmt: skip

    def _safe(self, plan: _Replan, job: JobSpec) -> list[str]:
        allowed = [
            t
            for t in job.allowed_types(plan.types)
            if fits_memory(job, plan.snapshot.capacity[t].memory_mib)
        ]
        known = [t for t in allowed if t in job.runtime]
        return known or allowed

    def _order(self, items: list[_Item]) -> list[_Item]:
        """Higher priorities first (Kueue's order: a lower priority's run, pinned or not, is
        planned after a higher priority's waiting job, which may then displace it as the
        queue's preemption rules allow); within one priority, `_tier`'s order."""
        first: list[_Item] = []
        if not self.preempt:  # nothing may be displaced: every run keeps its place first
            first = [i for i in items if i.run is not None]
            items = [i for i in items if i.run is None]
        tiers: dict[int, list[_Item]] = {}
        for item in items:
            tiers.setdefault(item.job.priority, []).append(item)
        return first + [i for p in sorted(tiers, reverse=True) for i in self._tier(tiers[p])]

    def _tier(self, items: list[_Item]) -> list[_Item]:
        """Pinned runs, then runs predicted to end before the aged jobs need them, then aged
        jobs (longest waiting first), then everyone else by key."""
        pinned = [i for i in items if i.pinned and i.run is not None]
        rest = [i for i in items if not (i.pinned and i.run is not None)]
        aged = sorted((i for i in rest if i.aged), key=lambda i: (-i.job.waited_s, i.job.id))
        if not aged:
            return pinned + sorted(rest, key=_by_key)
        bar = min(i.key for i in aged)
        ahead = [i for i in rest if i.run is not None and i.key < bar]
        ahead_ids = {i.job.id for i in ahead} | {i.job.id for i in aged}
        others = [i for i in rest if i.job.id not in ahead_ids]
        return pinned + sorted(ahead, key=_by_key) + aged + sorted(others, key=_by_key)

    def _may_fill(self, plan: _Replan, item: _Item) -> bool:
        """Rule 4: a job waits for its better types when they free within the restart cost."""
        if item.remaining_s == INF or item.job.id in plan.blocked:
            return False
        if item.run is not None:
            return not item.pinned
        good = [
            t
            for t in item.safe
            if plan.runtime(item.job, t) <= self.max_slowdown * item.remaining_s
        ]
        natural = min((plan.start_s(t, item.job.gpus) for t in good), default=INF)
        return natural - plan.now > item.job.restart_cost_s

    def _decisions(self, plan: _Replan, order: list[_Item]) -> Decisions:
        snapshot, now = plan.snapshot, plan.now
        # Runs the plan leaves out, or plans elsewhere (a move), make room for waiting jobs.
        dropped: dict[str, list[_Item]] = {}
        for item in order:
            run = item.run
            if run is None or (item.pinned and item.job.id in plan.chosen):
                continue
            chosen = plan.chosen.get(item.job.id)
            if chosen is None or chosen[0] != run.gpu_type:
                dropped.setdefault(run.gpu_type, []).append(item)
        takers: dict[str, list[_Item]] = {}
        for item in order:
            chosen = plan.chosen.get(item.job.id)
            if item.run is None and chosen is not None:
                takers.setdefault(chosen[0], []).append(item)
        real = Plan(snapshot, memory_aware=True)
        ruled = any(q.preemption != PreemptionRules() for q in snapshot.queues.values())
        preemptions: list[Preemption] = []
        waiting_on: dict[str, str] = {}
        for gpu_type, victims in dropped.items():
            first = takers.get(gpu_type, [])
            moved = [i for i in victims if i.job.id in plan.chosen]
            out = [i for i in victims if i.job.id not in plan.chosen]
            if out and first:
                natural = plan.start_s(gpu_type, sum(i.job.gpus for i in first))
                short = [
                    i for i in first
                    if not real.ledger.check(i.job.queue, gpu_type, i.job.gpus).ok
                ]  # fmt: skip
                if short:
                    # Short of quota (an owner reclaiming what it lent), not only of GPUs:
                    # free GPUs do not let them start; quota frees no sooner than a run of
                    # their cohort ends.
                    natural = max(natural, self._quota_frees_s(snapshot, short, gpu_type))
                if natural - now <= max(i.job.restart_cost_s for i in out):
                    out = []  # the GPUs free by themselves sooner than a restart costs
            else:
                out = []  # nobody waits for these GPUs: no reason to stop the job
            for victim in moved + out:
                target = plan.chosen.get(victim.job.id)
                if target is not None:
                    reason = f"moves to {target[0]}, predicted to finish sooner there"
                    for_job = victim.job.id
                else:
                    assert victim.run is not None
                    left = victim.run.expected_end_s(now) - now
                    # The first taker whose queue's preemption rules allow it (permits.py).
                    for_job = next(
                        (
                            t.job.id
                            for t in first
                            if not ruled
                            or refused(Preemption(victim.job.id, "", t.job.id), snapshot) is None
                        ),
                        first[0].job.id,
                    )
                    reason = (
                        f"{for_job} is predicted to finish sooner on {gpu_type} than this "
                        f"job's remaining {left:.0f}s"
                    )
                preemptions.append(Preemption(victim.job.id, reason, for_job))
            if out:
                for taker in first:
                    waiting_on[taker.job.id] = gpu_type
        waiting: dict[str, WaitReason] = {}
        for item in order:
            job = item.job
            if item.run is not None:
                continue
            chosen = plan.chosen.get(job.id)
            if chosen is not None:
                gpu_type = chosen[0]
                check = real.ledger.check(job.queue, gpu_type, job.gpus)
                if real.free[gpu_type] >= job.gpus and check.ok:
                    real.admit(job, gpu_type, check)
                    continue
                if job.id in waiting_on:
                    waiting[job.id] = WaitReason(
                        "capacity", f"preempting longer jobs on {gpu_type}"
                    )
                    continue
            waiting[job.id] = self._reason(plan, real, item)
            if item.penalty > 0 and waiting[job.id].kind == "capacity":
                waiting[job.id] = self._fair_share(plan, order, item) or waiting[job.id]
        stopped = {p.job_id for p in preemptions}
        return Decisions(
            admissions=tuple(real.admissions),
            preemptions=tuple(preemptions),
            reservations=tuple(plan.reservations),
            waiting=waiting,
            notes={j: why for j, (_, why) in plan.skipped_moves.items() if j not in stopped},
        )

    @staticmethod
    def _quota_frees_s(snapshot: QueueSnapshot, takers: list[_Item], gpu_type: str) -> float:
        """The earliest predicted end of a run of `gpu_type` in the takers' queues or their
        cohorts: before it, the quota they lack cannot free by itself."""
        queues = snapshot.queues
        cohorts = {queues[i.job.queue].cohort for i in takers if i.job.queue in queues}
        names = {i.job.queue for i in takers}
        return min(
            (
                run.expected_end_s(snapshot.now_s)
                for run in snapshot.running
                if gpu_type_of(run.gpu_type) == gpu_type_of(gpu_type)
                and run.job.queue in queues
                and (run.job.queue in names or queues[run.job.queue].cohort in cohorts - {None})
            ),
            default=INF,
        )

    @staticmethod
    def _fair_share(plan: _Replan, order: list[_Item], item: _Item) -> WaitReason | None:
        """Rule 8's reason, when a job of a less-served queue that would have come after
        this one without the history was planned instead."""

        def raw(i: _Item) -> tuple[float, float]:
            return (i.key - i.penalty if i.key < INF else INF, i.job.arrival_s)

        for other in order:
            if (
                other.job.queue != item.job.queue
                and other.job.id in plan.chosen
                and other.penalty < item.penalty
                and raw(other) > raw(item)
            ):
                return WaitReason(
                    "fair_share",
                    f"queue {item.job.queue} used more of the cluster recently (per weight) "
                    f"than queue {other.job.queue}, whose {other.job.id} goes first",
                )
        return None

    def _reason(self, plan: _Replan, real: Plan, item: _Item) -> WaitReason:
        job = item.job
        reservation = next((r for r in plan.reservations if r.job_id == job.id), None)
        if reservation is not None:
            return WaitReason(
                "capacity",
                f"reserved {job.gpus} {reservation.gpu_type} GPUs from "
                f"t={reservation.start_s:.0f}s",
            )
        if job.id in plan.blocked:
            return plan.blocked[job.id]
        options = real.options(job)
        if options.reason is not None:
            return options.reason
        return WaitReason(
            "capacity",
            "waiting for a faster GPU type or behind jobs predicted to finish sooner",
        )
