"""Cluster choice by predicted completion (wait + transfer + runtime), and the hub's snapshot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.multicluster.scoring import (
    Artifact,
    WorkerView,
    earliest_start_s,
    hub_snapshot,
    pool_key,
    score,
    split_key,
    transfer,
    unplaceable,
)
from alnair.scheduler.queueing import (
    ClusterQueueSpec,
    FlavorQuota,
    GpuPool,
    JobSpec,
    RunningJob,
    RuntimeEstimate,
    queue_policy,
)

GIB = 1024.0
IMAGE = Artifact("image:train:1", 6000.0)
DATA = Artifact("data:imagenet", 144000.0)


def view(name: str, mbps: float, pools: dict[str, tuple[int, int]], **kw: object) -> WorkerView:
    return WorkerView(
        name=name,
        bandwidth_mbps=mbps,
        pools={t: GpuPool(total, free, 16 * GIB) for t, (total, free) in pools.items()},
        **kw,  # type: ignore[arg-type]
    )


def job(gpus: int = 1, **runtime: float) -> JobSpec:
    return JobSpec(
        id="ns/j",
        queue="q",
        gpus=gpus,
        arrival_s=0.0,
        runtime={t: RuntimeEstimate(r, r * 1.2) for t, r in runtime.items()},
    )


def test_transfer_counts_only_what_the_cluster_lacks() -> None:
    fresh = view("a", 1000.0, {"v100": (8, 8)})
    cached = view("b", 1000.0, {"v100": (8, 8)}, artifacts=frozenset({DATA.name}))
    # 150 000 MB * 8 bit / 1000 Mbit/s = 1200 s
    assert transfer([IMAGE, DATA], fresh).seconds == pytest.approx(1200.0)
    assert transfer([IMAGE, DATA], fresh).megabytes == pytest.approx(150000.0)
    assert transfer([IMAGE, DATA], cached).seconds == pytest.approx(48.0)
    assert transfer([IMAGE, DATA], cached).missing == (IMAGE.name,)


def test_earliest_start_walks_the_predicted_releases() -> None:
    assert earliest_start_s(100.0, 4, [], 4) == 100.0
    assert earliest_start_s(100.0, 2, [(500.0, 1), (300.0, 2)], 4) == 300.0
    assert earliest_start_s(100.0, 0, [(500.0, 1)], 4) == float("inf")


def test_score_orders_by_wait_plus_transfer_plus_runtime() -> None:
    """Fast GPUs behind a slow link lose to slower GPUs that already hold the data; a busy
    cluster's wait is counted from its running jobs' predicted ends."""
    views = [
        view("far", 100.0, {"v100": (8, 8)}),  # 150 GB at 100 Mbit/s: 12 000 s
        view("near", 10000.0, {"p100": (8, 8)}, artifacts=frozenset({IMAGE.name, DATA.name})),
        view("busy", 10000.0, {"v100": (8, 0)}, releases={"v100": [(5000.0, 8)]}),
    ]
    options = score(job(4, v100=3000.0, p100=6000.0), [IMAGE, DATA], views, now_s=0.0)
    table = {o.cluster: o for o in options}
    assert table["far"].completion_s == pytest.approx(12000.0 + 3000.0)
    assert table["near"].completion_s == pytest.approx(6000.0)
    assert table["busy"].wait_s == pytest.approx(5000.0)
    assert table["busy"].completion_s == pytest.approx(5000.0 + 120.0 + 3000.0)
    assert [o.cluster for o in options] == ["near", "busy", "far"]


def test_unreachable_clusters_are_not_scored_but_too_large_names_the_largest_pool() -> None:
    views = [
        view("a", 1000.0, {"v100": (8, 8)}, reachable=False),
        view("b", 1000.0, {"k80": (4, 4)}),
    ]
    assert [o.cluster for o in score(job(2, v100=1.0, k80=2.0), [], views, 0.0)] == ["b"]
    assert unplaceable(job(8, v100=1.0), views) is None  # a (unreachable) could hold it
    reason = unplaceable(job(16, v100=1.0), views)
    assert reason is not None and "16 GPUs" in reason and "8 (a/v100)" in reason
    big = JobSpec("ns/m", "q", 1, 0.0, peak_memory_mib=40 * GIB)
    assert "exceeds every GPU type's memory" in (unplaceable(big, views) or "")
    assert unplaceable(job(1), []) == "no worker cluster is registered"


def test_keys_are_checked() -> None:
    assert split_key(pool_key("east", "V100")) == ("east", "V100")
    with pytest.raises(InvalidValueError, match="cluster"):
        pool_key("a/b", "V100")
    with pytest.raises(InvalidValueError, match="key"):
        split_key("V100")
    with pytest.raises(InvalidValueError, match="bandwidth_mbps"):
        view("x", 0.0, {})
    with pytest.raises(InvalidValueError, match="size_mb"):
        Artifact("x", -1.0)


def test_hub_snapshot_lets_the_alnair_policy_pick_the_lowest_predicted_completion() -> None:
    """The same numbers `score` gives decide where the `alnair` policy admits the job; quota is
    per GPU type across clusters."""
    views = [
        view("far", 100.0, {"v100": (8, 8)}),
        view("near", 10000.0, {"p100": (8, 8)}, artifacts=frozenset({IMAGE.name, DATA.name})),
    ]
    queues = {"q": ClusterQueueSpec("q", {"v100": FlavorQuota(8), "p100": FlavorQuota(8)})}
    pending = [(job(4, v100=3000.0, p100=6000.0), [IMAGE, DATA])]
    snapshot = hub_snapshot(0.0, pending, [], queues, views)
    assert set(snapshot.capacity) == {"far/v100", "near/p100"}
    assert snapshot.pending[0].runtime["far/v100"].expected_s == pytest.approx(15000.0)
    decisions = queue_policy("alnair").decide(snapshot)
    best = score(pending[0][0], pending[0][1], views, 0.0)[0]
    assert [a.gpu_type for a in decisions.admissions] == [best.key] == ["near/p100"]

    # With the data already on the far cluster too, its V100s win.
    views[0] = view("far", 100.0, {"v100": (8, 8)}, artifacts=frozenset({IMAGE.name, DATA.name}))
    decisions = queue_policy("alnair").decide(hub_snapshot(0.0, pending, [], queues, views))
    assert [a.gpu_type for a in decisions.admissions] == ["far/v100"]

    # Quota per type spans clusters: 8 V100 are used on "far", none left for "near2".
    views.append(view("near2", 10000.0, {"v100": (8, 8)}))
    running = [RunningJob(JobSpec("ns/r", "q", 8, 0.0), "far/v100", 0.0)]
    pinned = replace(job(4, v100=10.0), gpu_model="v100")
    snapshot = hub_snapshot(0.0, [(pinned, [])], running, queues, views)
    decisions = queue_policy("alnair").decide(snapshot)
    assert not decisions.admissions
    assert decisions.waiting["ns/j"].kind == "quota"


def test_a_constraint_names_the_gpu_type_on_any_cluster() -> None:
    pinned = JobSpec("ns/p", "q", 1, 0.0, gpu_model="v100")
    assert pinned.allowed_types(["a/k80", "a/v100", "b/v100", "v100"]) == [
        "a/v100",
        "b/v100",
        "v100",
    ]


# The hub's policy: alnair that never preempts across clusters (dispatcher/hub.py).
HUB_POLICY = queue_policy("alnair", preempt=False, reclaim=False)


def test_the_hub_waits_for_a_busy_cluster_when_that_is_predicted_to_end_first() -> None:
    """V100s on `busy` free in 100 s (a running job's predicted end); K80s on `idle` are free
    now. 100 + 1000 s beats 5000 s, so `alnair` holds the job and `score` ranks `busy` first;
    once the running job is predicted to hold the V100s for 9000 s, the K80s win."""
    views = [
        view("busy", 10000.0, {"v100": (4, 0)}),
        view("idle", 10000.0, {"k80": (4, 4)}),
    ]
    queues = {"q": ClusterQueueSpec("q", {"v100": FlavorQuota(8), "k80": FlavorQuota(8)})}
    pending = [(job(4, v100=1000.0, k80=5000.0), [])]

    def holder(end_s: float) -> RunningJob:
        spec = JobSpec("ns/r", "q", 4, 0.0, runtime={"busy/v100": RuntimeEstimate.exact(end_s)})
        return RunningJob(spec, "busy/v100", 0.0)

    decisions = HUB_POLICY.decide(hub_snapshot(0.0, pending, [holder(100.0)], queues, views))
    assert not decisions.admissions
    assert decisions.waiting["ns/j"].kind == "capacity"
    released = [replace(views[0], releases={"v100": [(100.0, 4)]}), views[1]]
    assert score(pending[0][0], [], released, 0.0)[0].cluster == "busy"

    decisions = HUB_POLICY.decide(hub_snapshot(0.0, pending, [holder(9000.0)], queues, views))
    assert [a.gpu_type for a in decisions.admissions] == ["idle/k80"]


@pytest.mark.parametrize("policy", ["alnair", "fifo", "sjf", "drf"])
def test_a_job_goes_only_to_the_clusters_that_serve_its_kind(policy: str) -> None:
    """`JobSpec.clusters` (the hub: workers serving a JobSet): the faster cluster that does not
    serve it is neither scored nor admitted onto; with none left, it says why."""
    views = [
        view("fast", 10000.0, {"v100": (8, 8)}),
        view("slow", 10000.0, {"k80": (8, 8)}),
    ]
    queues = {"q": ClusterQueueSpec("q", {"v100": FlavorQuota(8), "k80": FlavorQuota(8)})}
    jobset = replace(job(2, v100=100.0, k80=1000.0), clusters=frozenset({"slow"}))
    assert jobset.allowed_types(["fast/v100", "slow/k80", "k80"]) == ["slow/k80", "k80"]
    assert [o.cluster for o in score(jobset, [], views, 0.0)] == ["slow"]
    decisions = queue_policy(policy).decide(hub_snapshot(0.0, [(jobset, [])], [], queues, views))
    assert [a.gpu_type for a in decisions.admissions] == ["slow/k80"]
    # Unconstrained, it takes the faster one.
    free = replace(jobset, clusters=None)
    assert score(free, [], views, 0.0)[0].cluster == "fast"
    nowhere = replace(jobset, clusters=frozenset())
    assert score(nowhere, [], views, 0.0) == []
    assert unplaceable(nowhere, views) == "no worker cluster serves its kind"
