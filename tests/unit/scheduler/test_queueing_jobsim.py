"""The job simulator: the shipped trace loads, replays end to end, and its figures add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alnair.common.errors import ConfigError, InvalidValueError
from alnair.scheduler.jobsim.cli import main
from alnair.scheduler.jobsim.engine import simulate
from alnair.scheduler.jobsim.workload import (
    GPU_MEMORY_MIB,
    Cluster,
    load_jobs,
    team_queues,
)
from alnair.scheduler.queueing import queue_policy

CLUSTER = Cluster.parse("k80=4,p100=4,v100=4")


def test_trace_loads_with_runtimes_teams_and_predictions() -> None:
    jobs = load_jobs(CLUSTER, predictions="predicted", limit=200)
    assert len(jobs) == 200
    first = jobs[0]
    # Transformer bs128 on 1 GPU, 95121 steps: runtime = steps / measured steps/s.
    assert first.job_type == "Transformer (batch size 128)"
    assert first.gpus == 1
    assert set(first.true_runtime_s) == {"k80", "p100", "v100"}
    assert first.true_runtime_s["v100"] < first.true_runtime_s["k80"]
    assert {j.team for j in jobs} == {"team-a", "team-b", "team-c", "team-d"}
    errors = [
        abs(e.expected_s / j.true_runtime_s[t] - 1) for j in jobs for t, e in j.predicted.items()
    ]
    assert 0.08 < sum(errors) / len(errors) < 0.18  # about 13% MAPE
    oracle = load_jobs(CLUSTER, limit=5)
    assert all(e.expected_s == j.true_runtime_s[t] for j in oracle for t, e in j.predicted.items())


def test_cluster_and_trace_errors_name_the_bad_value(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="a100"):
        Cluster.parse("a100=4")
    assert Cluster.parse("4:2:1").gpus == {"k80": 1, "p100": 2, "v100": 4}
    bad = tmp_path / "bad.trace"
    bad.write_text("ResNet-18 (batch size 16)\tcmd\t-n\t1\t100\n")
    with pytest.raises(ConfigError, match="7 tab-separated"):
        load_jobs(CLUSTER, trace=bad)


@pytest.mark.parametrize(
    ("name", "memory_aware"), [("fifo", False), ("sjf", False), ("alnair", True)]
)
def test_replay_runs_every_job_and_its_figures_add_up(name: str, memory_aware: bool) -> None:
    jobs = load_jobs(CLUSTER, limit=120)
    options = {} if name == "alnair" else {"memory_aware": memory_aware}
    result = simulate(queue_policy(name, **options), jobs, CLUSTER, team_queues(CLUSTER))
    assert len(result.jobs) == len(jobs)
    metrics = result.metrics()
    assert metrics["avg_jct_s"] >= metrics["avg_wait_s"] >= 0
    assert metrics["p99_jct_s"] >= metrics["avg_jct_s"]
    assert 0 < metrics["utilization"] <= 1
    for outcome in result.jobs:
        source = next(j for j in jobs if j.id == outcome.id)
        # No job completes faster than its fastest type allows.
        assert outcome.end_s - outcome.arrival_s >= min(source.true_runtime_s.values()) - 1e-6
    shares = result.team_shares()
    assert abs(sum(v["share"] for v in shares.values()) - 1) < 1e-3
    assert abs(sum(v["entitlement"] for v in shares.values()) - 1) < 1e-3
    if memory_aware:
        assert metrics["oom"] == 0


def test_memory_blind_fifo_ooms_where_alnair_does_not() -> None:
    # ResNet-50 at batch size 128 (14.5 GiB) only: a K80 device has 12 GiB.
    jobs = [j for j in load_jobs(CLUSTER) if j.job_type == "ResNet-50 (batch size 128)"][:20]
    assert all(j.true_peak_mib > GPU_MEMORY_MIB["k80"] for j in jobs)
    blind = simulate(queue_policy("fifo", memory_aware=False), jobs, CLUSTER, team_queues(CLUSTER))
    safe = simulate(queue_policy("alnair"), jobs, CLUSTER, team_queues(CLUSTER))
    assert blind.oom > 0
    assert safe.oom == 0
    assert len(blind.jobs) == len(safe.jobs) == len(jobs)  # OOMed jobs rerun pinned to a V100/P100


def test_cli_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", "drf", "--cluster", "k80=16,p100=16,v100=16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"]["drf"]["jobs"] == 1181
    assert set(out["policies"]["drf"]["teams"]) == {"team-a", "team-b", "team-c", "team-d"}
    assert main(["--policy", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_preemptive_alnair_bounds_preemptions_and_beats_its_non_preemptive_self() -> None:
    """On 300 jobs of the trace, saturated: shortest remaining time preempts, never a job
    more than `max_preemptions` times (runs = first run + restarts; reclaim, which rule 7
    exempts, is off for that count), and lowers the average JCT against the same policy
    without preemption."""
    jobs = load_jobs(CLUSTER, limit=300)
    queues = team_queues(CLUSTER)
    preemptive = simulate(queue_policy("alnair", max_preemptions=2), jobs, CLUSTER, queues)
    plain = simulate(queue_policy("alnair", preempt=False), jobs, CLUSTER, queues)
    assert preemptive.preemptions > plain.preemptions
    bounded = simulate(
        queue_policy("alnair", max_preemptions=2, reclaim=False), jobs, CLUSTER, queues
    )
    assert max(j.runs for j in bounded.jobs) <= 1 + 2
    assert preemptive.metrics()["avg_jct_s"] < plain.metrics()["avg_jct_s"]
    assert preemptive.oom == 0
    # The noise seed varies the prediction errors only: same teams, other runtimes believed.
    one = load_jobs(CLUSTER, predictions="predicted", limit=50, noise_seed=2)
    two = load_jobs(CLUSTER, predictions="predicted", limit=50, noise_seed=3)
    assert [j.team for j in one] == [j.team for j in two]
    assert [j.predicted for j in one] != [j.predicted for j in two]
