"""`alnair`: an aged job its queue's quota holds back keeps that quota against later jobs."""

from __future__ import annotations

from dataclasses import replace

from alnair.scheduler.queueing import (
    ClusterQueueSpec,
    FlavorQuota,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    RunningJob,
    RuntimeEstimate,
    queue_policy,
)


def snapshot(small: JobSpec, now: float = 100.0) -> QueueSnapshot:
    queue = ClusterQueueSpec("q", {"V100": FlavorQuota(8)})
    running = RunningJob(
        JobSpec("s2", "q", 4, 0.0, {"V100": RuntimeEstimate.exact(200)}), "V100", 0
    )
    big = JobSpec("big", "q", 8, 10.0, waited_s=now - 10.0)
    small = replace(small, waited_s=now - small.arrival_s)
    return QueueSnapshot(now, [big, small], [running], {"q": queue}, {"V100": GpuPool(8, 4, 32768)})


def test_a_later_job_of_unknown_length_does_not_take_the_held_quota() -> None:
    decisions = queue_policy("alnair", max_wait_s=60).decide(snapshot(JobSpec("s3", "q", 4, 90.0)))
    assert not decisions.admissions
    assert decisions.waiting["s3"].kind == "reservation"
    assert "big" in decisions.waiting["s3"].message


def test_a_later_job_predicted_to_end_before_the_quota_frees_is_backfilled() -> None:
    short = JobSpec("s3", "q", 4, 90.0, {"V100": RuntimeEstimate(50, 80)})
    long = JobSpec("s3", "q", 4, 90.0, {"V100": RuntimeEstimate(50, 150)})
    policy = queue_policy("alnair", max_wait_s=60)
    assert [a.job_id for a in policy.decide(snapshot(short)).admissions] == ["s3"]
    assert not policy.decide(snapshot(long)).admissions  # its upper bound ends after t=200


def test_before_the_wait_bound_nothing_is_held() -> None:
    decisions = queue_policy("alnair", max_wait_s=3600).decide(
        snapshot(JobSpec("s3", "q", 4, 90.0))
    )
    assert [a.job_id for a in decisions.admissions] == ["s3"]


def test_reclaim_takes_a_borrowing_run_before_an_in_quota_one_of_the_same_job() -> None:
    queues = {
        "e": ClusterQueueSpec("e", {"V100": FlavorQuota(4, borrowing_limit=4)}, cohort="c"),
        "o": ClusterQueueSpec("o", {"V100": FlavorQuota(4, borrowing_limit=4)}, cohort="c"),
    }
    base = JobSpec("ej", "e", 2, 0.0)
    running = [
        RunningJob(base, "V100", 0.0),
        RunningJob(JobSpec("ej#surplus", "e", 6, 0.0), "V100", 0.0, borrowing=True),
    ]
    snap = QueueSnapshot(10.0, [JobSpec("lender", "o", 4, 5.0)], running, queues,
                         {"V100": GpuPool(8, 0, 32768)})  # fmt: skip
    decisions = queue_policy("alnair").decide(snap)
    assert [p.job_id for p in decisions.preemptions] == ["ej#surplus"]
