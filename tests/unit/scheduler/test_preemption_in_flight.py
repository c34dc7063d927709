"""Victims in flight: while a preemptor's victims are being deleted (the binder's background
write), their room is promised to it, so no other pod takes it or evicts them again."""

from __future__ import annotations

from typing import Any

import numpy as np

from alnair.common import resources as r
from alnair.scheduler.cluster.pods import LivePod
from alnair.scheduler.cluster.requests import Placement
from alnair.scheduler.framework import Framework, ScheduleResult
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.plugins.preemption import PROMISED
from alnair.scheduler.plugins.registry import build_profile


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {r.LABEL_GPU_MODEL: "V100"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", r.GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(uid: str, gpus: int, prio: int, created: float = 1000.0) -> LivePod:
    return LivePod(
        name=uid, uid=uid, namespace="ns", cpu_milli=100, memory_mib=100, num_gpu=gpus,
        gpu_milli=1000, priority=prio, created=created,
    )  # fmt: skip


def cluster(nodes: int, gpus: int) -> tuple[SchedulerCache, Framework]:
    """`nodes` nodes of `gpus` GPUs, each full with one low-priority pod (`low-<i>`)."""
    cache = SchedulerCache()
    for i in range(nodes):
        cache.upsert_node(node(f"n{i}", gpus))
    cache.snapshot()
    for i in range(nodes):
        cache.assume(pod(f"low-{i}", gpus, 1), Placement(i, f"n{i}", tuple(range(gpus)), 1000))
    return cache, Framework(build_profile("alnair", [pod("typical", 1, 0)]))


def cycle(cache: SchedulerCache, framework: Framework, req: LivePod) -> ScheduleResult:
    """One cycle as the binder runs it, up to what it records before any API call."""
    result = framework.schedule(req, cache.snapshot(), np.random.default_rng(0))
    nom = result.nomination
    if result.placement is not None:
        cache.assume(req, result.placement)
    elif nom is not None and (nom.victims or nom.awaiting):
        cache.nominations.nominate(req, nom.node_name, nom.victims)
    return result


def test_two_preemptors_arriving_together_take_two_different_victims() -> None:
    cache, framework = cluster(2, 4)
    # Same priority, same creation second: the first one's node hold admits the second.
    first, second = pod("hi-1", 4, 100), pod("hi-2", 4, 100)
    a = cycle(cache, framework, first).nomination
    assert a is not None and len(a.victims) == 1
    b = cycle(cache, framework, second).nomination
    assert b is not None and len(b.victims) == 1
    # The victim already leaving for hi-1 is not chosen again: its 4 GPUs are promised.
    assert b.node_name != a.node_name
    assert set(a.victims).isdisjoint(b.victims)
    assert not b.awaiting

    # Without the record of hi-1's victims in flight, hi-2 would evict the same pod.
    blind, blind_fw = cluster(2, 4)
    x = cycle(blind, blind_fw, first).nomination
    blind.nominations.clear(first.key)
    blind.nominations.leaving.clear()
    y = blind_fw.schedule(second, blind.snapshot(), np.random.default_rng(0)).nomination
    assert x is not None and y is not None and y.victims == x.victims

    # The victims go; each preemptor lands on its own node; nothing is over-committed.
    for uid in (*a.victims, *b.victims):
        cache.remove_pod(uid)
    assert not cache.nominations.leaving
    placed = {req.key: cycle(cache, framework, req).placement for req in (second, first)}
    assert {p.node_name for p in placed.values() if p} == {a.node_name, b.node_name}
    assert placed["hi-1"] is not None and placed["hi-1"].node_name == a.node_name
    assert len(cache.nominations) == 0
    assert int(cache.snapshot().gpu_free.min()) >= 0


def test_preemptors_share_the_room_being_freed_and_others_keep_off_it() -> None:
    cache, framework = cluster(2, 8)  # two 8-GPU nodes, each full with one 8-GPU pod
    preemptors = [pod(f"hi-{i}", 1, 100, created=1000.0 + i) for i in range(9)]
    noms = [cycle(cache, framework, p).nomination for p in preemptors]
    assert all(n is not None for n in noms)
    first = noms[0]
    assert first is not None and len(first.victims) == 1
    # The next seven fit in the 7 GPUs left after hi-0's: they wait, evicting nobody.
    for nom in noms[1:8]:
        assert nom is not None and nom.node_name == first.node_name
        assert nom.victims == () and nom.awaiting == first.victims
    # The ninth finds the room promised: one more victim, on the other node.
    ninth = noms[8]
    assert ninth is not None and ninth.node_name != first.node_name and len(ninth.victims) == 1

    # The first victim is gone; a lower-priority pod must not take its GPUs: the node is held
    # for hi-0, and once hi-0 is placed, the rest is promised to hi-1..hi-7.
    cache.remove_pod(first.victims[0])
    late = pod("late", 1, 50)
    refused = cycle(cache, framework, late)
    assert refused.placement is None
    landed = cycle(cache, framework, preemptors[0]).placement
    assert landed is not None and landed.node_name == first.node_name
    refused = cycle(cache, framework, late)
    assert refused.placement is None
    assert PROMISED in refused.reasons
    # Its own preemption waits for the other node's victim, behind hi-8's promise.
    assert refused.nomination is not None and refused.nomination.awaiting == ninth.victims
    for p in preemptors[1:8]:
        placement = cycle(cache, framework, p).placement
        assert placement is not None and placement.node_name == first.node_name
    assert int(cache.snapshot().gpu_free[cache.snapshot().node_index(first.node_name)].sum()) == 0
    assert set(cache.nominations.by_pod) == {"hi-8", "late"}  # both wait for low-1


def test_a_higher_priority_pod_ignores_lower_nominations_and_a_gone_preemptor_frees_its_room() -> (
    None
):
    cache, framework = cluster(1, 8)
    nom = cycle(cache, framework, pod("hi", 4, 100)).nomination
    assert nom is not None and nom.victims == ("low-0",)
    cache.remove_pod("low-0")
    # Upstream's rule: only pods of lower or equal priority leave a nominated pod's room.
    top = cycle(cache, framework, pod("top", 8, 1000))
    assert top.placement is not None
    cache.forget("top")
    # The preemptor is deleted: its promise goes with it.
    cache.remove_pod("hi")
    assert len(cache.nominations) == 0
    cache.reservations.release("hi")
    assert cycle(cache, framework, pod("mid", 8, 50)).placement is not None
