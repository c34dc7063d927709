"""Fair sharing by history (rule 8 of `alnair`): decayed usage per queue (`history.py`), the
order it gives, and the `fair_share` wait reason."""

from __future__ import annotations

import math

import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.queueing import (
    ClusterQueueSpec,
    FlavorQuota,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    RuntimeEstimate,
    queue_policy,
)
from alnair.scheduler.queueing.history import UsageHistory

H = 3600.0


def test_usage_accrues_at_the_gpus_held_and_halves_each_half_life() -> None:
    history = UsageHistory(H)
    assert history.advance(0.0) == {}
    history.hold({"a": 4, "b": 0})
    after = history.advance(H)
    assert after == {"a": pytest.approx(4 * 0.5 * H / math.log(2))}  # integral of 4*2^(-t/h)
    history.hold({})
    assert history.advance(2 * H)["a"] == pytest.approx(after["a"] / 2)
    assert history.advance(200 * H) == {}  # forgotten
    with pytest.raises(InvalidValueError, match="half_life_s"):
        UsageHistory(0)


def _snapshot(usage: dict[str, float], weights: tuple[float, float] = (1.0, 1.0)) -> QueueSnapshot:
    quota = {"v100": FlavorQuota(8)}
    runtime = {"v100": RuntimeEstimate.exact(1000.0)}
    return QueueSnapshot(
        now_s=100.0,
        pending=[
            JobSpec(id="a1", queue="a", gpus=8, arrival_s=0.0, runtime=runtime),
            JobSpec(id="b1", queue="b", gpus=8, arrival_s=50.0, runtime=dict(runtime)),
        ],
        running=[],
        queues={
            "a": ClusterQueueSpec("a", quota, cohort="c", weight=weights[0]),
            "b": ClusterQueueSpec("b", quota, cohort="c", weight=weights[1]),
        },
        capacity={"v100": GpuPool(total=8, free=8, memory_mib=16384.0)},
        usage=usage,
    )


def test_the_queue_that_used_less_goes_first_and_the_other_is_told_why() -> None:
    heavy = {"a": 8 * 3600.0}  # a held the whole cluster for an hour, b nothing
    fair = queue_policy("alnair", fair_share=1.0).decide(_snapshot(heavy))
    assert [x.job_id for x in fair.admissions] == ["b1"]
    assert fair.waiting["a1"].kind == "fair_share"
    assert "queue a used more of the cluster recently" in fair.waiting["a1"].message
    # off: arrival decides between equal runtimes; the same history changes nothing
    plain = queue_policy("alnair").decide(_snapshot(heavy))
    assert [x.job_id for x in plain.admissions] == ["a1"]
    assert plain.waiting["b1"].kind != "fair_share"


def test_weight_scales_the_share() -> None:
    # a used twice b's GPU-seconds with twice b's weight: equal shares, arrival decides
    usage = {"a": 2 * 3600.0, "b": 3600.0}
    decided = queue_policy("alnair", fair_share=1.0).decide(_snapshot(usage, (2.0, 1.0)))
    assert [x.job_id for x in decided.admissions] == ["a1"]


def test_in_the_simulator_a_late_team_waits_less_behind_a_team_that_ran_all_day() -> None:
    """Teams a and b own no GPUs: both borrow from one lender's pool (so quota-first reclaim
    does not decide between them). Team a runs the whole cluster alone, then keeps a
    backlog; team b arrives later with the same jobs. Without history a's earlier arrivals
    go first; with it, b's do, and b waits less."""
    from alnair.scheduler.jobsim.engine import simulate
    from alnair.scheduler.jobsim.workload import Cluster, SimJob

    cluster = Cluster.parse("v100=8")
    runtime = {"v100": 1000.0}

    def job(jid: str, team: str, at: float) -> SimJob:
        return SimJob(jid, "resnet", 4, at, team, runtime,
                      {"v100": RuntimeEstimate.exact(1000.0)}, 1000.0, 1000.0)  # fmt: skip

    jobs = [job(f"a{i}", "a", 0.0) for i in range(12)]
    jobs += [job(f"b{i}", "b", 2500.0 + i) for i in range(4)]
    queues = {
        name: ClusterQueueSpec(name, {"v100": FlavorQuota(nominal)}, cohort="c")
        for name, nominal in (("a", 0), ("b", 0), ("lender", 8))
    }

    def b_wait(**fair: float) -> float:
        result = simulate(
            queue_policy("alnair", **fair), jobs, cluster, queues,
            usage_half_life_s=6 * H if fair else None,
        )  # fmt: skip
        waits = [o.wait_s for o in result.jobs if o.team == "b"]
        return sum(waits) / len(waits)

    assert b_wait(fair_share=1.0) < b_wait()
