"""Gangs, priorities and preemption through the framework's extension points, on a simulator
snapshot (no live cluster): Coscheduling's PreFilter/Permit, DefaultPreemption's PostFilter,
and the Gavel trace replayed as gangs with `alnair simulate --gangs`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.books import GangBook, GangSpec
from alnair.scheduler.cluster.requests import NodeSpec, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.status import Code
from alnair.scheduler.plugins.registry import framework
from alnair.scheduler.simulator import cli
from alnair.scheduler.simulator.gangs import GangReplayConfig, replay_gangs


def gpu_pod(name: str, *, gang: str | None = None, priority: int = 0) -> PodRequest:
    return PodRequest(
        name=name,
        uid=name,
        cpu_milli=1000,
        memory_mib=1024,
        num_gpu=1,
        gpu_milli=1000,
        gang=gang,
        priority=priority,
    )


def two_nodes() -> ClusterSnapshot:
    return ClusterSnapshot.build(
        [NodeSpec(f"n{i}", cpu_milli=32000, memory_mib=65536, gpu_count=2) for i in range(2)]
    )


def test_a_gang_waits_at_permit_until_its_quorum_is_placed() -> None:
    snap = two_nodes()
    members = [gpu_pod(f"m{i}", gang="ns/g") for i in range(3)]
    book = GangBook(pending=lambda gang: [m for m in members if m.key not in snap.placed])
    book.specs["ns/g"] = GangSpec(min_member=3, timeout_s=30.0)
    snap.gangs = book
    fw = framework("FGD", members)
    rng = np.random.default_rng(0)
    codes = []
    for member in members:
        result = fw.schedule(member, snap, rng)
        assert result.placement is not None
        codes.append(result.status.code)
        snap.assume(member, result.placement)
    assert codes == [Code.WAIT, Code.WAIT, Code.SUCCESS]
    assert snap.gang_placed["ns/g"] == 3
    first = fw.schedule(gpu_pod("late", gang="ns/g"), snap, rng)
    assert first.status.code is Code.SUCCESS  # the gang is complete: extras go alone


def test_a_gang_that_cannot_fit_whole_is_refused_at_prefilter_and_reserves_nothing() -> None:
    snap = two_nodes()
    members = [gpu_pod(f"m{i}", gang="ns/big") for i in range(5)]
    book = GangBook(pending=lambda gang: members)
    book.specs["ns/big"] = GangSpec(min_member=5)
    snap.gangs = book
    result = framework("alnair", members).schedule(members[0], snap, np.random.default_rng(0))
    assert result.placement is None and result.pre_filtered
    assert "gang ns/big needs 5 more member(s) placed together; only 4 fit now" in (
        result.message()
    )
    assert not snap.placed
    missing = gpu_pod("orphan", gang="ns/none")
    refused = framework("alnair", [missing]).schedule(missing, snap, np.random.default_rng(0))
    assert refused.message() == "PodGroup ns/none not found"


def test_postfilter_nominates_lower_priority_victims_on_a_simulator_snapshot() -> None:
    snap = two_nodes()
    fw = framework("FGD", [gpu_pod("x")])
    rng = np.random.default_rng(0)
    for i in range(4):
        low = gpu_pod(f"low{i}", priority=i % 2)
        snap.assume(low, fw.schedule(low, snap, rng).placement)  # type: ignore[arg-type]
    urgent = gpu_pod("urgent", priority=10)
    result = fw.schedule(urgent, snap, rng)
    assert result.placement is None
    assert result.nomination is not None
    assert len(result.nomination.victims) == 1
    # The lowest priority goes first.
    assert snap.placed[result.nomination.victims[0]][0].priority == 0
    # A pod without priority preempts nobody.
    assert fw.schedule(gpu_pod("plain"), snap, rng).nomination is None


def test_gavel_trace_replays_with_gangs_whole_and_high_priority_preempting() -> None:
    small = "k80=12,p100=12,v100=12"  # small enough that jobs compete for GPUs
    out = replay_gangs(GangReplayConfig(policy="alnair", seed=42, jobs=80, cluster=small)).to_json()
    assert out["jobs_finished"] == out["jobs"] == 80
    assert out["gangs"] > 0 and out["gangs_placed_whole"] == out["gangs"]
    assert out["partial_gangs_seen"] == 0
    assert out["preemptions"] > 0 and out["jobs_preempted"] > 0
    assert out["queue_wait_s"]["high"]["mean"] <= out["queue_wait_s"]["low"]["mean"]
    calm = replay_gangs(
        GangReplayConfig(policy="alnair", seed=42, jobs=80, cluster=small, high_priority_share=0.0)
    ).to_json()
    assert calm["preemptions"] == 0 and "high" not in calm["jct_s"]
    assert calm["gangs_placed_whole"] == calm["gang_starts"] == calm["gangs"]


def test_simulate_gangs_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--gangs", "30", "--policy", "FGD", "--seed", "7"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "FGD" and out["seed"] == 7 and out["jobs"] == 30
    assert out["partial_gangs_seen"] == 0
    with pytest.raises(InvalidValueError, match="jobs"):
        GangReplayConfig(jobs=0)
