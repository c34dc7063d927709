"""Preemption takes an elastic job's surplus workers first, highest ordinal first, gracefully."""

from __future__ import annotations

from alnair.common import resources as r
from alnair.scheduler.cluster.pods import LivePod
from alnair.scheduler.cluster.requests import Placement
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.plugins.preemption import select_victims, surplus_ordinal

GANG = "ns/elastic"


def worker(ordinal: int, prio: int = 10) -> LivePod:
    return LivePod(
        name=f"elastic-workers-{ordinal}", uid=f"w{ordinal}", namespace="ns", cpu_milli=0,
        memory_mib=0, num_gpu=1, gpu_milli=1000, priority=prio, gang=GANG,
        labels=((r.POD_INDEX_LABEL, str(ordinal)), (r.POD_GROUP_LABEL, "elastic")),
    )  # fmt: skip


def plain(uid: str, prio: int) -> LivePod:
    return LivePod(
        name=uid, uid=uid, namespace="ns", cpu_milli=0, memory_mib=0, num_gpu=1,
        gpu_milli=1000, priority=prio,
    )  # fmt: skip


def high(gpus: int) -> LivePod:
    return LivePod(
        name="hi", uid="hi", cpu_milli=0, memory_mib=0, num_gpu=gpus, gpu_milli=1000, priority=100
    )


def test_surplus_is_an_ordinal_at_or_above_min_member() -> None:
    mins = {GANG: 2}
    assert [surplus_ordinal(worker(i), mins) for i in range(4)] == [None, None, 2, 3]
    assert surplus_ordinal(plain("x", 1), mins) is None
    no_index = LivePod(name="g", uid="g", cpu_milli=0, memory_mib=0, gang=GANG)
    assert surplus_ordinal(no_index, mins) is None


def test_surplus_workers_go_first_highest_ordinal_first_and_gracefully() -> None:
    cache = SchedulerCache()
    for name in ("n1", "n2"):
        cache.upsert_node(
            {
                "metadata": {"name": name, "labels": {}},
                "spec": {},
                "status": {
                    "allocatable": {"cpu": "32", "memory": "128Gi", r.GPU: "4"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    snap = cache.snapshot()
    # n1: elastic workers 0..3 (min 2), n2: workers 4, 5 and two lower-priority plain pods.
    for i in range(4):
        cache.assume(worker(i), Placement(0, "n1", (i,), 1000))
    for i in (4, 5):
        cache.assume(worker(i), Placement(1, "n2", (i - 4,), 1000))
    cache.assume(plain("batch-a", 1), Placement(1, "n2", (2,), 1000))
    cache.assume(plain("batch-b", 1), Placement(1, "n2", (3,), 1000))
    mins = {GANG: 2}

    # Two GPUs: n2's surplus workers 5 and 4 go, not the lower-priority plain pods, not n1.
    nom = select_victims(high(2), snap, [0, 1], mins)
    assert nom is not None
    assert nom.node_name == "n2"
    assert sorted(nom.victims) == ["w4", "w5"]
    assert sorted(nom.graceful) == ["w4", "w5"]

    # One GPU on n1 only: the highest surplus ordinal there (3), never a worker below min.
    nom = select_victims(high(1), snap, [0], mins)
    assert nom is not None and nom.victims == ("w3",) and nom.graceful == ("w3",)

    # Three GPUs on n1: surplus 3 and 2 are not enough; one worker below the minimum goes too
    # (the gang keeps 3 >= minMember members on both nodes), without a grace period.
    nom = select_victims(high(3), snap, [0], mins)
    assert nom is not None and len(nom.victims) == 3
    assert {"w2", "w3"} < set(nom.victims) and sorted(nom.graceful) == ["w2", "w3"]

    # Without a gang minimum above them nothing is surplus: plain ordering is unchanged.
    nom = select_victims(high(2), snap, [1], {GANG: 6})
    assert nom is not None and sorted(nom.victims) == ["batch-a", "batch-b"]
    assert nom.graceful == ()
