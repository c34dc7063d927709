"""Queueing policies: quotas, borrowing, lending, memory safety, reservation, aging, reclaim.

Table-driven where a table says it best; builders keep each case to the line that matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alnair.common.errors import InvalidValueError
from alnair.scheduler.queueing import (
    QUEUE_POLICIES,
    ClusterQueueSpec,
    Decisions,
    FlavorQuota,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    QuotaLedger,
    RunningJob,
    RuntimeEstimate,
    queue_policy,
)

MEMORY = {"k80": 12 * 1024.0, "v100": 16 * 1024.0}


@dataclass
class Job:
    """Fluent builder: `Job("a").gpus(2).runs(v100=100).obj()`."""

    id: str
    queue: str = "q"
    _gpus: int = 1
    arrival: float = 0.0
    runtime: dict[str, RuntimeEstimate] = field(default_factory=dict)
    memory: float | None = None
    model: str | None = None

    def gpus(self, n: int) -> Job:
        return replace(self, _gpus=n)

    def at(self, arrival_s: float) -> Job:
        return replace(self, arrival=arrival_s)

    def on(self, queue: str) -> Job:
        return replace(self, queue=queue)

    def runs(self, upper_factor: float = 1.0, **seconds: float) -> Job:
        return replace(
            self,
            runtime={t: RuntimeEstimate(s, s * upper_factor) for t, s in seconds.items()},
        )

    def peak(self, mib: float) -> Job:
        return replace(self, memory=mib)

    def only(self, model: str) -> Job:
        return replace(self, model=model)

    def obj(self) -> JobSpec:
        runtime = self.runtime or {t: RuntimeEstimate.exact(100.0) for t in MEMORY}
        return JobSpec(
            self.id,
            self.queue,
            self._gpus,
            self.arrival,
            runtime,
            gpu_model=self.model,
            peak_memory_mib=self.memory,
            restart_cost_s=10.0,
        )


def snapshot(
    pending: Sequence[Job],
    *,
    free: Mapping[str, int],
    total: Mapping[str, int] | None = None,
    running: Sequence[RunningJob] = (),
    queues: Mapping[str, ClusterQueueSpec] | None = None,
    now: float = 0.0,
) -> QueueSnapshot:
    totals = total or free
    return QueueSnapshot(
        now_s=now,
        # Pending jobs have never run: they have waited since they arrived.
        pending=[replace(j.obj(), waited_s=max(0.0, now - j.arrival)) for j in pending],
        running=list(running),
        queues=queues or {"q": ClusterQueueSpec("q", {t: FlavorQuota(1000) for t in totals})},
        capacity={t: GpuPool(totals[t], free[t], MEMORY[t]) for t in totals},
    )


def admitted(decisions: Decisions) -> dict[str, str]:
    return {a.job_id: a.gpu_type for a in decisions.admissions}


ALL = [p.name for p in QUEUE_POLICIES]


def test_unknown_policy_and_option_are_named() -> None:
    with pytest.raises(InvalidValueError, match="nope"):
        queue_policy("nope")
    with pytest.raises(InvalidValueError, match="max_wait"):
        queue_policy("fifo", max_wait_s=3)


@pytest.mark.parametrize(
    ("make", "field_name"),
    [
        (lambda: JobSpec("j", "q", 0, 0.0), "gpus"),
        (lambda: JobSpec("j", "q", 1, -1.0), "arrival_s"),
        (lambda: RuntimeEstimate(10.0, 5.0), "upper_s"),
        (lambda: FlavorQuota(-1), "nominal"),
        (lambda: ClusterQueueSpec("q", {}, weight=0), "weight"),
        (lambda: GpuPool(4, 5, 1.0), "free"),
    ],
)
def test_bad_values_are_rejected_with_the_field_named(make: object, field_name: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        make()  # type: ignore[operator]
    assert err.value.field == field_name


@pytest.mark.parametrize("name", ALL)
def test_every_policy_admits_what_fits_and_explains_the_rest(name: str) -> None:
    jobs = [Job("small").gpus(2), Job("big").gpus(8).at(1)]
    decisions = queue_policy(name).decide(snapshot(jobs, free={"v100": 4}))
    assert admitted(decisions) == {"small": "v100"}
    assert decisions.waiting["big"].kind == "capacity"


@pytest.mark.parametrize(
    ("name", "expected_first"),
    [("fifo", "long"), ("sjf", "short"), ("alnair", "short")],
)
def test_order_of_admission(name: str, expected_first: str) -> None:
    jobs = [Job("long").runs(v100=1000).at(0), Job("short").runs(v100=10).at(1)]
    decisions = queue_policy(name).decide(snapshot(jobs, free={"v100": 1}))
    assert list(admitted(decisions)) == [expected_first]


def test_fifo_is_strict_within_a_queue_but_not_across_queues() -> None:
    queues = {q: ClusterQueueSpec(q, {"v100": FlavorQuota(8)}, cohort="c") for q in ("a", "b")}
    jobs = [
        Job("a-big").on("a").gpus(4).at(0),
        Job("a-small").on("a").at(1),
        Job("b-small").on("b").at(2),
    ]
    decisions = queue_policy("fifo").decide(snapshot(jobs, free={"v100": 2}, queues=queues))
    assert admitted(decisions) == {"b-small": "v100"}
    assert "behind a-big" in decisions.waiting["a-small"].message


# Quota table: (queue spec(s), usage before, request) -> admitted?, borrowing?
@pytest.mark.parametrize(
    ("quota_a", "quota_b", "used_b", "gpus", "ok", "borrowing"),
    [
        (FlavorQuota(4), FlavorQuota(4), 0, 4, True, False),  # within nominal
        (FlavorQuota(4), FlavorQuota(4), 0, 6, True, True),  # borrows b's idle quota
        (FlavorQuota(4, borrowing_limit=1), FlavorQuota(4), 0, 6, False, False),  # limit
        (FlavorQuota(4), FlavorQuota(4, lending_limit=1), 0, 6, False, False),  # b lends 1
        (FlavorQuota(4), FlavorQuota(4, lending_limit=2), 0, 6, True, True),  # b lends 2
        (FlavorQuota(4), FlavorQuota(4), 4, 5, False, False),  # b uses its own
        (FlavorQuota(0), FlavorQuota(4), 0, 2, True, True),  # nothing owned, all borrowed
    ],
)
def test_quota_cohort_borrowing_and_lending(
    quota_a: FlavorQuota,
    quota_b: FlavorQuota,
    used_b: int,
    gpus: int,
    ok: bool,
    borrowing: bool,
) -> None:
    queues = {
        "a": ClusterQueueSpec("a", {"v100": quota_a}, cohort="c"),
        "b": ClusterQueueSpec("b", {"v100": quota_b}, cohort="c"),
    }
    running = [RunningJob(Job("b-run").on("b").gpus(used_b).obj(), "v100", 0.0)] if used_b else []
    ledger = QuotaLedger(queues, running)
    check = ledger.check("a", "v100", gpus)
    assert (check.ok, check.borrowing) == (ok, borrowing)
    for name in ALL:
        free = 8 - used_b
        decisions = queue_policy(name, reclaim=False) if name == "alnair" else queue_policy(name)
        result = decisions.decide(
            snapshot(
                [Job("a-job").on("a").gpus(gpus)],
                free={"v100": free},
                total={"v100": 8},
                running=running,
                queues=queues,
            )
        )
        assert ("a-job" in admitted(result)) == ok, name
        if ok:
            assert result.admissions[0].borrowing == borrowing
        else:
            assert result.waiting["a-job"].kind == "quota"


def test_queue_without_cohort_never_borrows_and_unknown_queue_waits() -> None:
    queues = {"a": ClusterQueueSpec("a", {"v100": FlavorQuota(2)})}
    jobs = [Job("a-job").on("a").gpus(3), Job("lost").on("missing")]
    for name in ALL:
        result = queue_policy(name).decide(snapshot(jobs, free={"v100": 8}, queues=queues))
        assert admitted(result) == {}
        assert result.waiting["a-job"].kind == "quota"
        assert result.waiting["lost"].kind == "queue"


@pytest.mark.parametrize("name", ALL)
def test_memory_aware_policies_never_admit_an_oom(name: str) -> None:
    jobs = [Job("huge").peak(14_000).runs(k80=50, v100=100)]
    only_k80 = queue_policy(name).decide(snapshot(jobs, free={"k80": 4, "v100": 0}))
    assert admitted(only_k80) == {}
    assert only_k80.waiting["huge"].kind == "capacity"  # V100 fits, it is busy
    with_v100 = queue_policy(name).decide(snapshot(jobs, free={"k80": 4, "v100": 1}))
    assert admitted(with_v100) == {"huge": "v100"}
    too_big = queue_policy(name).decide(
        snapshot([Job("x").peak(20_000)], free={"k80": 4, "v100": 4})
    )
    assert too_big.waiting["x"].kind == "memory"


def test_memory_blind_baseline_is_what_the_benchmark_counts() -> None:
    jobs = [Job("huge").peak(14_000).runs(k80=50, v100=100)]
    decisions = queue_policy("sjf", memory_aware=False).decide(
        snapshot(jobs, free={"k80": 4, "v100": 0})
    )
    assert admitted(decisions) == {"huge": "k80"}


def test_alnair_chooses_the_gpu_type_by_predicted_completion() -> None:
    job = Job("j").runs(k80=400, v100=100)
    assert admitted(queue_policy("alnair").decide(snapshot([job], free={"k80": 1, "v100": 1}))) == {
        "j": "v100"
    }
    # V100 busy but predicted free in 10 s: waiting beats 400 s on a K80.
    busy = RunningJob(Job("r").runs(v100=20).obj(), "v100", start_s=0.0)
    decisions = queue_policy("alnair").decide(
        snapshot(
            [job], free={"k80": 1, "v100": 0}, total={"k80": 1, "v100": 1}, running=[busy], now=10
        )
    )
    assert admitted(decisions) == {}


def test_a_job_that_moves_for_free_takes_a_slow_type_now_instead_of_waiting() -> None:
    """Rules 3 and 4 hold a job for a faster type because leaving a slow one costs a restart;
    with no restart cost (Gavel's rounds) it starts on the K80 and the next plan moves it."""
    job = Job("j").runs(k80=1000, v100=100)  # 10x slower on a K80: past both caps
    # The V100 is held by a job of unknown runtime: it is never displaced (rule 7).
    busy = RunningJob(JobSpec("r", "q", 1, 0.0), "v100", start_s=0.0)
    state = snapshot([job], free={"k80": 1, "v100": 0}, total={"k80": 1, "v100": 1}, running=[busy])
    assert admitted(queue_policy("alnair").decide(state)) == {}
    free_moves = replace(state, pending=[replace(state.pending[0], restart_cost_s=0.0)])
    assert admitted(queue_policy("alnair").decide(free_moves)) == {"j": "k80"}


@pytest.mark.parametrize(
    ("short_on_k80", "expected"),
    [
        # The short job hardly slows on the K80: the long one gains 15,000 s on the V100.
        (1100.0, {"short": "k80", "long": "v100"}),
        # The short job is 2.9x slower there: shortest first, and the long job moves to the
        # V100 when the short one ends (1000 + 1000 + 9610 s beats 2900 + 10000 s).
        (2900.0, {"short": "v100", "long": "k80"}),
    ],
)
def test_fast_types_go_where_they_cut_predicted_completions_most(
    short_on_k80: float, expected: dict[str, str]
) -> None:
    jobs = [
        Job("short").runs(v100=1000, k80=short_on_k80),
        Job("long").runs(v100=10000, k80=25000),
    ]
    decisions = queue_policy("alnair").decide(snapshot(jobs, free={"k80": 1, "v100": 1}))
    assert admitted(decisions) == expected


def test_reservation_and_backfill_only_before_it() -> None:
    """An aged 5-GPU job gets a reservation at t=100, when the running job frees its 3; of the
    2 free GPUs, a job whose *upper bound* ends before then starts, one whose upper bound ends
    after it waits, though a GPU is free."""
    running = [RunningJob(Job("r").gpus(3).runs(v100=100).obj(), "v100", start_s=0.0)]
    jobs = [
        Job("big").gpus(5).at(0).runs(v100=500),
        Job("fits").at(40).runs(1.5, v100=30),  # ends by 50 + 45 = 95 < 100
        Job("late").at(41).runs(1.5, v100=40),  # upper 60 -> 110 > 100
    ]
    policy = queue_policy("alnair", max_wait_s=30)
    decisions = policy.decide(
        snapshot(jobs, free={"v100": 2}, total={"v100": 5}, running=running, now=50)
    )
    assert [(r.job_id, r.start_s) for r in decisions.reservations] == [("big", 100.0)]
    assert admitted(decisions) == {"fits": "v100"}
    assert decisions.waiting["late"].kind == "reservation"
    for admission in decisions.admissions:
        spec = next(j.obj() for j in jobs if j.id == admission.job_id)
        assert 50 + spec.runtime["v100"].upper_s <= decisions.reservations[0].start_s


def test_aging_bounds_a_big_jobs_wait_under_a_stream_of_small_ones() -> None:
    """Without aging SJF lets short jobs overtake the 2-GPU job forever; with it, the big job
    starts once the GPUs free, however many short jobs keep arriving."""
    now, running_end = 0.0, 0.0
    started: dict[str, float] = {}
    for policy in (queue_policy("sjf"), queue_policy("alnair", max_wait_s=100)):
        now = 0.0
        running: list[RunningJob] = []
        pending = [Job("big").gpus(2).at(0).runs(v100=50)]
        for step in range(40):
            pending.append(Job(f"s{step}").at(now).runs(v100=15))
            running = [r for r in running if r.expected_end_s(now) > now]
            free = 2 - sum(r.gpus for r in running)
            snap = snapshot(
                pending, free={"v100": free}, total={"v100": 2}, running=running, now=now
            )
            decisions = policy.decide(snap)
            for admission in decisions.admissions:
                job = next(j for j in pending if j.id == admission.job_id)
                pending.remove(job)
                running.append(RunningJob(job.obj(), "v100", now))
                if job.id == "big":
                    started[policy.name] = now
            # Each step a short job ends and another arrives: the GPUs are never both free
            # unless the policy holds them.
            running_end = min((r.expected_end_s(now) for r in running), default=now + 10)
            now = max(now + 10, running_end)
    assert "sjf" not in started
    assert started["alnair"] <= 100 + 2 * 15 + 10


def test_owner_reclaims_borrowed_quota_counting_restart_cost() -> None:
    queues = {q: ClusterQueueSpec(q, {"v100": FlavorQuota(2)}, cohort="c") for q in ("a", "b")}
    # b borrows a's two GPUs with long jobs; a's job needs them back.
    borrowers = [
        RunningJob(Job(f"b{i}").on("b").runs(v100=10_000).obj(), "v100", 0.0, borrowing=i >= 2)
        for i in range(4)
    ]
    owner = Job("a-job").on("a").gpus(2).runs(v100=100).at(5)
    decisions = queue_policy("alnair").decide(
        snapshot(
            [owner], free={"v100": 0}, total={"v100": 4}, running=borrowers, queues=queues, now=5
        )
    )
    assert admitted(decisions) == {}
    assert len(decisions.preemptions) == 2
    assert {p.for_job_id for p in decisions.preemptions} == {"a-job"}
    assert all(p.job_id.startswith("b") for p in decisions.preemptions)
    # The borrowers end in 20 s: waiting costs less than two restarts of 10 s each... per GPU.
    ending = [
        replace(r, job=replace(r.job, runtime={"v100": RuntimeEstimate.exact(12)}))
        for r in borrowers
    ]
    cheap_wait = queue_policy("alnair").decide(
        snapshot([owner], free={"v100": 0}, total={"v100": 4}, running=ending, queues=queues, now=5)
    )
    assert cheap_wait.preemptions == ()
    # Baselines never preempt.
    for name in ("fifo", "sjf", "drf"):
        base = queue_policy(name).decide(
            snapshot([owner], free={"v100": 0}, total={"v100": 4}, running=borrowers, queues=queues)
        )
        assert base.preemptions == ()


def _running(
    job: Job, *, start: float = 0.0, preempted: int = 0, waited: float = 0.0, **kw: bool
) -> RunningJob:
    spec = replace(job.obj(), preemptions=preempted, waited_s=waited)
    return RunningJob(spec, "v100", start, **kw)


def test_alnair_preempts_a_longer_job_for_a_shorter_one_counting_restart_cost() -> None:
    """Rule 6 (shortest remaining time): the short job displaces the job with the longest
    remaining time, only where that exceeds its own runtime plus the victim's restart cost."""
    short = Job("short").runs(v100=100).at(50)
    running = [
        _running(Job("long").runs(v100=10_000)),
        _running(Job("longer").runs(v100=20_000)),
    ]
    snap = snapshot([short], free={"v100": 0}, total={"v100": 2}, running=running, now=50)
    decisions = queue_policy("alnair").decide(snap)
    assert [(p.job_id, p.for_job_id) for p in decisions.preemptions] == [("longer", "short")]
    assert admitted(decisions) == {}
    assert decisions.waiting["short"].kind == "capacity"
    # Once the victim has stopped, the short job takes its GPU.
    after = snapshot([short], free={"v100": 1}, total={"v100": 2}, running=running[:1], now=50)
    assert admitted(queue_policy("alnair").decide(after)) == {"short": "v100"}
    # Victims whose remaining time (105 and 106 s from now) is within the short job's runtime
    # plus their restart cost (100 + 10 s) are not worth it: swapping saves less than the
    # restart costs.
    near = [_running(Job(f"n{i}").runs(v100=115 + i)) for i in range(2)]
    snap = snapshot([short], free={"v100": 0}, total={"v100": 2}, running=near, now=10)
    assert queue_policy("alnair").decide(snap).preemptions == ()
    # Without the option, alnair never preempts for order.
    snap = snapshot([short], free={"v100": 0}, total={"v100": 2}, running=running, now=50)
    assert queue_policy("alnair", preempt=False).decide(snap).preemptions == ()


@pytest.mark.parametrize(
    ("victim", "why"),
    [
        (_running(Job("v").runs(v100=10_000), preempted=10), "preempted max_preemptions times"),
        (_running(Job("v").runs(v100=10_000).at(0), waited=1500), "waited past max_wait_s"),
        (RunningJob(JobSpec("v", "q", 1, 0.0, restart_cost_s=10.0), "v100", 0.0), "unknown"),
        (_running(Job("v").on("other").runs(v100=10_000)), "another queue within nominal"),
        (_running(Job("v").runs(v100=10_000)), ""),  # the control: unprotected, preempted
    ],
)
def test_alnair_never_preempts_protected_jobs(victim: RunningJob, why: str) -> None:
    queues = {q: ClusterQueueSpec(q, {"v100": FlavorQuota(1)}, cohort="c") for q in ("q", "other")}
    # The aged case: max_wait_s 1000, and the victim had waited 1500 s when it started.
    now = 2000.0 if "max_wait" in why else 500.0
    short = Job("short").runs(v100=100).at(now)
    snap = snapshot(
        [short], free={"v100": 0}, total={"v100": 1}, running=[victim], queues=queues, now=now
    )
    decisions = queue_policy("alnair", max_wait_s=1000, reclaim=False).decide(snap)
    assert [p.job_id for p in decisions.preemptions] == ([] if why else ["v"]), why


def test_alnair_preempts_another_queues_borrower_but_not_when_gpus_free_within_restart() -> None:
    queues = {q: ClusterQueueSpec(q, {"v100": FlavorQuota(1)}, cohort="c") for q in ("q", "other")}
    borrower = _running(Job("b").on("other").runs(v100=10_000), borrowing=True)
    owner_job = _running(Job("o").on("other").runs(v100=10_000))
    short = Job("short").runs(v100=100).at(5)
    snap = snapshot(
        [short],
        free={"v100": 0},
        total={"v100": 2},
        running=[owner_job, borrower],
        queues=queues,
        now=5,
    )
    decisions = queue_policy("alnair", reclaim=False).decide(snap)
    assert [p.job_id for p in decisions.preemptions] == ["b"]
    # A GPU predicted free in 5 s (below the victim's 10 s restart cost): wait instead.
    ending = _running(Job("o").on("other").runs(v100=10))
    snap = snapshot(
        [short],
        free={"v100": 0},
        total={"v100": 2},
        running=[ending, borrower],
        queues=queues,
        now=5,
    )
    assert queue_policy("alnair", reclaim=False).decide(snap).preemptions == ()


def test_drf_admits_the_queue_furthest_below_its_share_first() -> None:
    queues = {q: ClusterQueueSpec(q, {"v100": FlavorQuota(4)}, cohort="c") for q in ("a", "b")}
    running = [RunningJob(Job("a-run").on("a").gpus(2).obj(), "v100", 0.0)]
    jobs = [Job("a-next").on("a").at(0), Job("b-next").on("b").at(5)]
    decisions = queue_policy("drf").decide(
        snapshot(jobs, free={"v100": 1}, total={"v100": 3}, running=running, queues=queues)
    )
    assert admitted(decisions) == {"b-next": "v100"}


# Properties: whatever the snapshot, no policy over-commits a GPU type or exceeds a quota,
# every pending job is either admitted or given a reason, and memory-aware policies admit no
# job whose predicted peak exceeds its GPU type's memory.
TYPES = ("k80", "v100")


@st.composite
def snapshots(draw: st.DrawFn) -> QueueSnapshot:
    total = {t: draw(st.integers(0, 8)) for t in TYPES}
    queues: dict[str, ClusterQueueSpec] = {}
    for name in ("a", "b", "c"):
        quota = {
            t: FlavorQuota(
                draw(st.integers(0, 6)),
                draw(st.none() | st.integers(0, 4)),
                draw(st.none() | st.integers(0, 4)),
            )
            for t in TYPES
        }
        queues[name] = ClusterQueueSpec(name, quota, cohort=draw(st.sampled_from([None, "c"])))
    running: list[RunningJob] = []
    ledger = QuotaLedger(queues)
    used = dict.fromkeys(TYPES, 0)
    for index in range(draw(st.integers(0, 5))):
        gpu_type = draw(st.sampled_from(TYPES))
        queue = draw(st.sampled_from(list(queues)))
        gpus = draw(st.integers(1, 4))
        if used[gpu_type] + gpus > total[gpu_type] or not ledger.check(queue, gpu_type, gpus).ok:
            continue
        ledger.take(queue, gpu_type, gpus)
        used[gpu_type] += gpus
        job = Job(f"r{index}").on(queue).gpus(gpus).runs(k80=draw(st.floats(1, 500)), v100=50)
        running.append(RunningJob(job.obj(), gpu_type, 0.0))
    pending = [
        Job(f"p{index}")
        .on(draw(st.sampled_from(["a", "b", "c", "ghost"])))
        .gpus(draw(st.integers(1, 6)))
        .at(draw(st.floats(0, 100)))
        .runs(draw(st.floats(1, 2)), k80=draw(st.floats(1, 400)), v100=draw(st.floats(1, 200)))
        .peak(draw(st.floats(0, 20_000)))
        for index in range(draw(st.integers(0, 12)))
    ]
    now = draw(st.floats(100, 1000))
    return QueueSnapshot(
        now_s=now,
        pending=[replace(j.obj(), waited_s=now - j.arrival) for j in pending],
        running=running,
        queues=queues,
        capacity={t: GpuPool(total[t], total[t] - used[t], MEMORY[t]) for t in TYPES},
    )


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.sampled_from(ALL))
def test_no_policy_overcommits_exceeds_quota_or_admits_an_oom(
    snap: QueueSnapshot, name: str
) -> None:
    decisions = queue_policy(name).decide(snap)
    jobs = {j.id: j for j in snap.pending}
    preempted = {p.job_id for p in decisions.preemptions}
    survivors = [r for r in snap.running if r.job.id not in preempted]
    ledger = QuotaLedger(snap.queues, survivors)
    free = {t: pool.free for t, pool in snap.capacity.items()}
    for admission in decisions.admissions:
        job = jobs[admission.job_id]
        assert admission.gpus == job.gpus
        free[admission.gpu_type] -= job.gpus
        assert free[admission.gpu_type] >= 0, "over-committed"
        assert job.peak_memory_mib is not None
        assert job.peak_memory_mib <= snap.capacity[admission.gpu_type].memory_mib
        ledger.take(job.queue, admission.gpu_type, job.gpus)
    assert ledger.over_quota() == []
    assert set(decisions.waiting) | {a.job_id for a in decisions.admissions} == set(jobs)
    assert not set(decisions.waiting) & {a.job_id for a in decisions.admissions}


@pytest.mark.parametrize(("total", "free"), [(4, 2), (2, 0)])
def test_an_owner_reclaims_lent_quota_whether_or_not_gpus_are_free(total: int, free: int) -> None:
    """A borrower holds all the cohort can lend; the lender's job needs its nominal back. The
    borrower is preempted whether the node has free GPUs or not: the lender is short of
    quota, which free GPUs do not give it (found with a StatefulSet on a 4-GPU node)."""
    queues = {
        "serve": ClusterQueueSpec("serve", {"V": FlavorQuota(0, 2)}, cohort="c"),
        "lender": ClusterQueueSpec("lender", {"V": FlavorQuota(2, 0)}, cohort="c"),
    }
    borrower = RunningJob(
        JobSpec("ns/db", "serve", 2, 0.0, waited_s=1.0), "V", 10.0, borrowing=True
    )
    snapshot = QueueSnapshot(
        now_s=100.0, pending=[JobSpec("ns/l1", "lender", 2, 99.0)], running=[borrower],
        queues=queues, capacity={"V": GpuPool(total, free, 32768.0)},
    )  # fmt: skip
    decisions = queue_policy("alnair").decide(snapshot)
    assert [p.job_id for p in decisions.preemptions] == ["ns/db"]
    assert decisions.waiting["ns/l1"].kind == "capacity"


@pytest.mark.parametrize(("restart_s", "moves"), [(10.0, True), (300.0, False)])
def test_a_move_that_the_restart_and_lost_progress_outweigh_is_skipped_and_said(
    restart_s: float, moves: bool
) -> None:
    """Issue 27: a running job moves to a faster type only when the predicted gain beats the
    restart cost plus the work since its last checkpoint (the dispatcher adds that to
    `restart_cost_s`); a move skipped for it is explained."""
    job = replace(Job("slow").runs(k80=1000, v100=300).obj(), restart_cost_s=restart_s)
    run = RunningJob(job, "k80", start_s=0.0)
    decisions = queue_policy("alnair").decide(
        snapshot(
            [], free={"k80": 0, "v100": 1}, total={"k80": 1, "v100": 1}, running=[run], now=500.0
        )
    )
    assert [p.job_id for p in decisions.preemptions] == (["slow"] if moves else [])
    if moves:
        assert "slow" not in decisions.notes
    else:
        note = decisions.notes["slow"]
        assert note.startswith("stays on k80: a move to v100 would leave 450 s"), note
        assert "(300 s) included, against 500 s here" in note
