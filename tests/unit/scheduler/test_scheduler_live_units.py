"""Pure parts of the live scheduler: pod parsing, queue, cache accounting, preemption."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alnair.common import resources as r
from alnair.common.events import GpuLink
from alnair.common.tasks import within
from alnair.dev.builders import make_pod
from alnair.scheduler.cluster.books import Holder, Reservations
from alnair.scheduler.cluster.budgets import DisruptionBudgets
from alnair.scheduler.cluster.pods import InvalidPodError, LivePod, parse_pod
from alnair.scheduler.cluster.requests import Placement
from alnair.scheduler.framework.interface import CycleState
from alnair.scheduler.framework.runtime import Framework
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.live.queue import SchedulingQueue
from alnair.scheduler.placement import BestFitGpu
from alnair.scheduler.plugins.constraints import (
    InterPodAffinity,
    NodeAffinity,
    PodTopologySpread,
    PreferredInterPodAffinity,
    PreferredNodeAffinity,
)
from alnair.scheduler.plugins.node_state import (
    GpuUtilization,
    NodeResourcesExtra,
    TopologyAwareGpus,
)
from alnair.scheduler.plugins.preemption import select_victims
from alnair.scheduler.plugins.registry import build_profile
from alnair.scheduler.plugins.reservation import NodeReservation, closest_node
from scheduler_support import bound, node


def test_parse_whole_fraction_and_errors() -> None:
    whole = parse_pod(make_pod("a", "ns").gpus(2).cpu("500m").obj())
    assert (whole.num_gpu, whole.gpu_milli, whole.cpu_milli, whole.memory_mib) == (
        2,
        1000,
        500,
        1024,
    )
    frac = parse_pod(make_pod("b", "ns").fraction(25).obj())
    assert (frac.num_gpu, frac.gpu_milli) == (1, 250)
    # Memory converts against the smallest GPU the pod may land on (T4: 15360 MiB).
    pod = make_pod("c", "ns").fraction(10, memory_mib=7680).obj()
    pod["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "T4|V100M32"
    assert parse_pod(pod).gpu_milli == 500
    # alnair.io/gpu-memory-gib: the same 7.5 GiB in the unit the device plugin serves by default
    gib = make_pod("g", "ns").fraction(10, memory_gib=8).obj()
    gib["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "T4"
    assert parse_pod(gib).gpu_milli == math.ceil(8 * 1024 * 1000 / 15360)
    both = make_pod("h", "ns").fraction(10, memory_mib=512, memory_gib=1).obj()
    with pytest.raises(InvalidPodError, match="one unit"):
        parse_pod(both)
    with pytest.raises(InvalidPodError, match="gpu-memory-gib='100': 102400 MiB is more than"):
        parse_pod(make_pod("i", "ns").fraction(10, memory_gib=100).obj())
    with pytest.raises(InvalidPodError, match="not both"):
        parse_pod(make_pod("d", "ns").gpus(1).fraction(20).obj())
    with pytest.raises(InvalidPodError, match="gpu-compute"):
        parse_pod(make_pod("e", "ns").fraction(150).obj())
    bad = make_pod("f", "ns").gpus(1).obj()
    bad["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "Z80"
    with pytest.raises(InvalidPodError, match="Z80"):
        parse_pod(bad)


async def test_queue_orders_by_priority_then_gang_then_age() -> None:
    q = SchedulingQueue()
    reqs = [
        LivePod(name="old", cpu_milli=0, memory_mib=0, uid="1", created=1.0),
        LivePod(name="vip", cpu_milli=0, memory_mib=0, uid="2", created=5.0, priority=100),
        LivePod(name="g-b", cpu_milli=0, memory_mib=0, uid="3", created=2.0, gang="ns/g"),
        LivePod(name="g-a", cpu_milli=0, memory_mib=0, uid="4", created=9.0, gang="ns/g"),
    ]
    q.gang_ts["ns/g"] = 0.5
    for req in reqs:
        q.add(req.uid, {"metadata": {"name": req.name, "namespace": "ns"}}, req)
    order = [(await q.pop()).request.name for _ in reqs]  # type: ignore[union-attr]
    assert order == ["vip", "g-b", "g-a", "old"]


async def test_unschedulable_pod_waits_for_an_event_and_none_is_lost() -> None:
    q = SchedulingQueue(initial_backoff_s=0.01)
    req = LivePod(name="p", cpu_milli=0, memory_mib=0, uid="u")
    q.add("u", {"metadata": {"name": "p", "namespace": "ns"}}, req)
    entry = await q.pop()
    q.unschedulable_now(entry)
    assert q.depth()["unschedulable"] == 1
    with pytest.raises(TimeoutError):
        await within(q.pop(), 0.05)
    q.move_all_to_active()
    entry = await within(q.pop(), 1)
    # An event during the cycle sends the pod to backoff instead of parking it.
    q.move_all_to_active()
    q.unschedulable_now(entry)
    assert q.depth()["unschedulable"] == 0
    assert (await within(q.pop(), 1)).uid == "u"


async def test_a_placed_pod_wakes_only_the_pods_whose_terms_count_it() -> None:
    q = SchedulingQueue(initial_backoff_s=0.01)
    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    near_db = app_pod("near-db", app="api")
    near_db["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    spread_web = spread(app_pod("web"))
    plain = app_pod("plain")
    for uid, obj in (("a", near_db), ("s", spread_web), ("p", plain)):
        q.add(uid, obj, parse_pod(obj))
        q.unschedulable_now(await q.pop())
    assert q.depth()["unschedulable"] == 3

    async def woken(namespace: str, labels: dict[str, str]) -> set[str]:
        moved = q.move_to_active(lambda req: req.counts_pod(namespace, labels))
        entries = [await q.pop() for _ in range(moved)]
        for entry in entries:
            q.unschedulable_now(entry)  # parked again for the next question
        return {e.request.name for e in entries if e.request is not None}

    assert await woken("ns", {"app": "db"}) == {"near-db"}
    assert await woken("ns", {"app": "web"}) == {"web"}  # the spread constraint counts it
    assert await woken("other", {"app": "web"}) == set()  # spread counts its own namespace only
    assert await woken("ns", {"app": "cache"}) == set()
    assert q.depth()["unschedulable"] == 3
    # A helpful placement during a helped pod's cycle sends it to backoff, not to the pool.
    q.move_all_to_active()
    entries = [await q.pop() for _ in range(3)]
    q.move_to_active(lambda req: req.counts_pod("ns", {"app": "db"}))
    for entry in entries:
        q.unschedulable_now(entry)
    assert q.depth()["unschedulable"] == 0  # every in-flight pod went to backoff


def test_cache_accounts_bound_pods_health_and_forget() -> None:
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 4))
    cache.add_bound(bound("a", "n1", 2, "0,1", "ua"))
    snap = cache.snapshot()
    assert list(snap.gpu_free[0, :4]) == [0, 0, 1000, 1000]
    cache.set_gpu_health("n1", 2, healthy=False)
    assert list(snap.gpu_free[0, :4]) == [0, 0, 0, 1000]
    cache.remove_pod("ua")
    assert list(snap.gpu_free[0, :4]) == [1000, 1000, 0, 1000]
    assert cache.set_gpu_health("n1", 2, healthy=True) is True
    assert list(snap.gpu_free[0, :4]) == [1000, 1000, 1000, 1000]
    # A node gaining capacity rebuilds the snapshot with everything still accounted.
    cache.add_bound(bound("b", "n1", 1, "3", "ub"))
    cache.upsert_node(node("n1", 8))
    assert int(cache.snapshot().gpu_free[0, 3]) == 0
    assert cache.rebuilds == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=30))
def test_cache_never_overcommits_through_assume_forget(ops: list[tuple[int, bool]]) -> None:
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 8))
    snap = cache.snapshot()
    placed: list[str] = []
    for i, (gpus, forget) in enumerate(ops):
        if forget and placed:
            cache.forget(placed.pop(0))
            continue
        free = np.flatnonzero(snap.gpu_free[0, :8] == 1000)
        if free.size < gpus:
            continue
        pod = LivePod(
            name=f"p{i}", uid=f"u{i}", cpu_milli=0, memory_mib=0, num_gpu=gpus, gpu_milli=1000
        )
        cache.assume(pod, Placement(0, "n1", tuple(int(g) for g in free[:gpus]), 1000))
        placed.append(pod.key)
        assert (snap.gpu_free >= 0).all()
    used = 8000 - int(snap.gpu_free[0, :8].sum())
    assert used == sum(p.total_milli_gpu for p, _ in snap.placed.values())


def test_preemption_picks_fewest_lowest_priority_and_keeps_gangs_whole() -> None:
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 4))
    cache.upsert_node(node("n2", 4))
    snap = cache.snapshot()

    def place(uid: str, n: int, gpus: tuple[int, ...], prio: int, gang: str | None = None) -> None:
        pod = LivePod(
            name=uid, uid=uid, cpu_milli=0, memory_mib=0, num_gpu=len(gpus), gpu_milli=1000,
            priority=prio, gang=gang,
        )  # fmt: skip
        cache.assume(pod, Placement(n, snap.names[n], gpus, 1000))

    place("low-a", 0, (0, 1), 1)
    place("low-b", 0, (2,), 1)
    place("mid", 0, (3,), 50)
    for g in range(4):
        place(f"gang-{g}", 1, (g,), 1, gang="ns/g")
    wants = LivePod(
        name="hi", uid="hi", cpu_milli=0, memory_mib=0, num_gpu=2, gpu_milli=1000, priority=100
    )
    nom = select_victims(wants, snap, [0, 1], {"ns/g": 4})
    assert nom is not None
    # n1 frees 2 GPUs by evicting one pod; n2 would need the whole 4-pod gang.
    assert nom.node_name == snap.names[0]
    assert nom.victims == ("low-a",)
    # Nothing of equal or higher priority is ever a victim.
    peer = LivePod(
        name="p", uid="p", cpu_milli=0, memory_mib=0, num_gpu=4, gpu_milli=1000, priority=1
    )
    assert select_victims(peer, snap, [0, 1], {"ns/g": 4}) is None


def pdb(name: str, allowed: int, selector: dict[str, Any] | None, ns: str = "ns") -> dict[str, Any]:
    spec = {} if selector is None else {"selector": selector}
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
        "status": {"disruptionsAllowed": allowed},
    }


def test_disruption_budgets_select_and_count_as_policy_v1() -> None:
    budgets = DisruptionBudgets()
    budgets.upsert(pdb("web", 1, {"matchLabels": {"app": "web"}}))
    budgets.upsert(pdb("all", 5, {}, ns="other"))  # empty selector: the whole namespace
    budgets.upsert(pdb("none", 0, None))  # no selector: no pod
    budgets.upsert(
        pdb("tier", 0, {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]})
    )
    assert len(budgets) == 3
    victims = [
        ("a", "ns", {"app": "web"}),
        ("b", "ns", {"app": "web"}),  # the second web pod breaks "web" (1 allowed)
        ("c", "ns", {"tier": "db"}),  # "tier" allows none
        ("d", "ns", {"tier": "cache"}),
        ("e", "other", {"x": "y"}),
    ]
    assert budgets.violations(victims) == {"b", "c"}
    budgets.delete(pdb("tier", 0, {}))
    assert budgets.violations(victims) == {"b"}


def test_preemption_prefers_victims_no_budget_protects() -> None:
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 4))
    cache.upsert_node(node("n2", 4))
    snap = cache.snapshot()

    def place(uid: str, n: int, gpus: tuple[int, ...], prio: int, app: str) -> None:
        pod = LivePod(
            name=uid, uid=uid, namespace="ns", cpu_milli=0, memory_mib=0, num_gpu=len(gpus),
            gpu_milli=1000, priority=prio, labels=(("app", app),),
        )  # fmt: skip
        cache.assume(pod, Placement(n, snap.names[n], gpus, 1000))

    # n1: the lowest-priority pod is protected; n2: a slightly higher one is not.
    place("guarded", 0, (0, 1, 2, 3), 1, "db")
    place("free", 1, (0, 1, 2, 3), 5, "batch")
    wants = LivePod(
        name="hi", uid="hi", cpu_milli=0, memory_mib=0, num_gpu=4, gpu_milli=1000, priority=100
    )
    budgets = DisruptionBudgets()
    assert select_victims(wants, snap, [0, 1], {}, budgets).victims == ("guarded",)  # type: ignore[union-attr]
    budgets.upsert(pdb("db", 0, {"matchLabels": {"app": "db"}}))
    nom = select_victims(wants, snap, [0, 1], {}, budgets)
    assert nom is not None and nom.victims == ("free",) and nom.budget_violations == 0
    # On one node, the unprotected victim goes first even at a higher priority ...
    cache.remove_pod("free")
    place("b1", 1, (0, 1), 1, "db")
    place("b2", 1, (2, 3), 9, "batch")
    two = LivePod(
        name="two", uid="two", cpu_milli=0, memory_mib=0, num_gpu=2, gpu_milli=1000, priority=100
    )
    nom = select_victims(two, snap, [1], {}, budgets)
    assert nom is not None and nom.victims == ("b2",)
    # ... and when only protected pods make room, a budget is broken, and said so.
    nom = select_victims(wants, snap, [0], {}, budgets)
    assert nom is not None and nom.victims == ("guarded",) and nom.budget_violations == 1
    assert "PodDisruptionBudget" in nom.describe()


def with_required_affinity(pod: dict[str, Any], *terms: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }
    return pod


def test_required_node_affinity_filters_nodes_as_upstream() -> None:
    cache = SchedulerCache()
    zones = {"n1": ("a", "4"), "n2": ("b", "8"), "n3": (None, "16")}
    for name, (zone, gen) in zones.items():
        obj = node(name)
        if zone:
            obj["metadata"]["labels"]["zone"] = zone
        obj["metadata"]["labels"]["gen"] = gen
        cache.upsert_node(obj)
    snap = cache.snapshot()
    nodes = np.arange(len(snap.names), dtype=np.int64)

    def admitted(*terms: dict[str, Any]) -> set[str]:
        req = parse_pod(with_required_affinity(make_pod("p", "ns").gpus(1).obj(), *terms))
        verdict = NodeAffinity().filter(req, snap, CycleState(np.random.default_rng(0)), nodes)
        return {snap.names[int(n)] for n in nodes[verdict.passed]}

    def expr(key: str, op: str, *values: str) -> dict[str, Any]:
        return (
            {"key": key, "operator": op, "values": list(values)}
            if values
            else {
                "key": key,
                "operator": op,
            }
        )

    assert admitted({"matchExpressions": [expr("zone", "In", "a", "b")]}) == {"n1", "n2"}
    assert admitted({"matchExpressions": [expr("zone", "NotIn", "a")]}) == {"n2", "n3"}
    assert admitted({"matchExpressions": [expr("zone", "DoesNotExist")]}) == {"n3"}
    assert admitted({"matchExpressions": [expr("gen", "Gt", "4")]}) == {"n2", "n3"}
    assert admitted({"matchExpressions": [expr("gen", "Lt", "16"), expr("zone", "Exists")]}) == {
        "n1",
        "n2",
    }
    # Terms are ORed; matchFields names the node; an empty term matches nothing.
    assert admitted(
        {"matchExpressions": [expr("zone", "In", "a")]},
        {"matchFields": [expr("metadata.name", "In", "n3")]},
        {},
    ) == {"n1", "n3"}
    # The filter names its reason for the nodes it rejects.
    req = parse_pod(
        with_required_affinity(
            make_pod("q", "ns").gpus(1).obj(), {"matchExpressions": [expr("zone", "In", "z")]}
        )
    )
    verdict = NodeAffinity().filter(req, snap, CycleState(np.random.default_rng(0)), nodes)
    assert [(reason, int(mask.sum())) for reason, mask in verdict.failures] == [
        ("node affinity mismatch", 3)
    ]


@pytest.mark.parametrize(
    ("term", "field", "value"),
    [
        (
            {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]},
            "operator",
            "Near",
        ),
        ({"matchExpressions": [{"key": "zone", "operator": "In"}]}, "values", "[]"),
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}, "values", "x"),
        (
            {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]},
            "values",
            "a",
        ),
        (
            {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["u"]}]},
            "key",
            "metadata.uid",
        ),
    ],
)
def test_malformed_node_affinity_is_an_invalid_request_naming_it(
    term: dict[str, Any], field: str, value: str
) -> None:
    pod = with_required_affinity(make_pod("p", "ns").gpus(1).obj(), term)
    with pytest.raises(InvalidPodError) as err:
        parse_pod(pod)
    assert err.value.field.startswith(
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
    )
    assert err.value.field.endswith(field)
    assert value in str(err.value)


def test_preferred_node_affinity_steers_placement_and_is_validated() -> None:
    cache = SchedulerCache()
    for name, zone in (("n1", "a"), ("n2", "b"), ("n3", "b")):
        obj = node(name)
        obj["metadata"]["labels"]["zone"] = zone
        obj["metadata"]["labels"]["disk"] = "ssd" if name == "n3" else "hdd"
        cache.upsert_node(obj)
    snap = cache.snapshot()
    nodes = np.arange(len(snap.names), dtype=np.int64)
    pod = make_pod("p", "ns").gpus(1).obj()
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["b"]}]}},
                {"weight": 30, "preference": {"matchExpressions": [
                    {"key": "disk", "operator": "In", "values": ["ssd"]}]}},
            ]
        }
    }  # fmt: skip
    req = parse_pod(pod)
    plugin = PreferredNodeAffinity()
    state = CycleState(np.random.default_rng(0))
    raw = plugin.score(req, snap, state, nodes)
    assert list(raw) == [0.0, 10.0, 40.0]
    assert list(plugin.normalize_score(req, state, raw)) == [0.0, 25.0, 100.0]
    # A pod without preferences scores 0 everywhere: the policy alone decides.
    plain = parse_pod(make_pod("q", "ns").gpus(1).obj())
    assert not plugin.score(plain, snap, state, nodes).any()
    # Through the live profile, on otherwise identical nodes, the preference wins.
    framework = Framework(build_profile("alnair", [req]))
    chosen = set()
    for seed in range(12):
        placed = framework.schedule(req, snap, np.random.default_rng(seed))
        chosen.add(placed.placement.node_name if placed.placement else None)
    assert chosen == {"n3"}
    # (Without the preference, ties among the three spread over them.)
    unsteered = {
        placement.node_name
        for seed in range(12)
        if (placement := framework.schedule(plain, snap, np.random.default_rng(seed)).placement)
    }
    assert len(unsteered) > 1
    # A weight outside 1-100 is refused, naming the field.
    pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "weight"
    ] = 0
    with pytest.raises(
        InvalidPodError, match=r"preferredDuringSchedulingIgnoredDuringExecution\[0\]\.weight"
    ):
        parse_pod(pod)


def test_reservations_admit_only_pods_that_outrank_the_holder() -> None:
    holder = Holder(uid="big", key="ns/big", priority=10, created=100.0, gang="ns/g")

    def pod(uid: str, priority: int, created: float, gang: str | None = None) -> LivePod:
        return LivePod(
            name=uid, uid=uid, cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=1000,
            priority=priority, created=created, gang=gang,
        )  # fmt: skip

    assert holder.admits(pod("big", 10, 100.0))  # itself
    assert holder.admits(pod("vip", 11, 500.0))  # higher priority
    assert holder.admits(pod("old", 10, 99.0))  # as high and older
    assert holder.admits(pod("mate", 0, 900.0, gang="ns/g"))  # its gang
    assert not holder.admits(pod("young", 10, 101.0))
    assert not holder.admits(pod("low", 9, 1.0))

    res = Reservations()
    assert res.reserve("n1", holder) is True
    assert res.reserve("n2", holder) is False  # one node per pod
    junior = Holder(uid="j", key="ns/j", priority=10, created=200.0)
    assert res.reserve("n1", junior) is False  # held by a senior
    senior = Holder(uid="s", key="ns/s", priority=50, created=300.0)
    assert res.reserve("n1", senior) == holder  # taken over
    assert res.node_of("big") is None and res.node_of("s") == "n1"
    assert res.describe() == {"n1": "ns/s"}
    assert res.release("s") == "n1" and len(res) == 0
    assert res.reserve("n3", junior) is True
    assert res.drop_node("n3") == junior and res.node_of("j") is None


def test_a_reserved_node_is_filtered_and_the_closest_node_is_chosen() -> None:
    cache = SchedulerCache()
    for name in ("n1", "n2", "n3"):
        cache.upsert_node(node(name, 4))
    cache.add_bound(bound("a", "n1", 3, "0,1,2", "ua"))
    cache.add_bound(bound("b", "n2", 1, "3", "ub"))
    cache.add_bound(bound("c", "n3", 2, "0,1", "uc"))
    snap = cache.snapshot()
    big = LivePod(name="big", uid="big", cpu_milli=0, memory_mib=0, num_gpu=4, gpu_milli=1000)
    # n2 has 3 of its 4 GPUs free: closest to the 4-GPU pod. A node too small never qualifies.
    assert closest_node(big, snap, [0, 1, 2]) == 1
    huge = LivePod(name="h", uid="h", cpu_milli=0, memory_mib=0, num_gpu=8, gpu_milli=1000)
    assert closest_node(huge, snap, [0, 1, 2]) is None
    cache.reservations.reserve("n2", Holder(uid="big", key="ns/big", priority=0, created=50.0))
    nodes = np.arange(3, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))
    late = LivePod(
        name="late", uid="late", cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=1000,
        created=60.0,
    )  # fmt: skip
    verdict = NodeReservation().filter(late, cache.snapshot(), state, nodes)
    assert list(verdict.passed) == [True, False, True]
    assert verdict.failures[0][0] == "reserved for a starving pod"
    assert NodeReservation().filter(big, cache.snapshot(), state, nodes).passed.all()


def test_topology_aware_gpus_pick_linked_sets_and_defer_otherwise() -> None:
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 4))
    nv, sys_, me = GpuLink.NVLINK, GpuLink.SYS, GpuLink.SELF
    cache.topology["n1"] = [
        [me, sys_, nv, sys_],
        [sys_, me, sys_, nv],
        [nv, sys_, me, sys_],
        [sys_, nv, sys_, me],
    ]
    snap = cache.snapshot()
    selector = TopologyAwareGpus(BestFitGpu())
    state = CycleState(np.random.default_rng(0))

    def pod(gpus: int, milli: int = 1000) -> LivePod:
        return LivePod(name="p", uid="p", cpu_milli=0, memory_mib=0, num_gpu=gpus, gpu_milli=milli)

    assert selector.select_gpus(pod(2), snap, state, 0) == (0, 2)
    assert selector.select_gpus(pod(1), snap, state, 0) == (0,)  # one GPU: the policy's choice
    assert selector.select_gpus(pod(1, 300), snap, state, 0) == (0,)  # a fraction, likewise
    cache.add_bound(bound("x", "n1", 1, "0", "ux"))
    assert selector.select_gpus(pod(2), cache.snapshot(), state, 0) == (1, 3)
    assert selector.select_gpus(pod(4), cache.snapshot(), state, 0) is None


def test_inter_pod_affinity_and_anti_affinity_as_upstream() -> None:
    cache = SchedulerCache()
    for name, zone in (("n1", "a"), ("n2", "a"), ("n3", "b")):
        obj = node(name)
        obj["metadata"]["labels"].update({"zone": zone, "kubernetes.io/hostname": name})
        cache.upsert_node(obj)

    def with_terms(pod: dict[str, Any], kind: str, app: str, key: str) -> dict[str, Any]:
        term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
        pod["spec"].setdefault("affinity", {})[kind] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [term]
        }
        return pod

    def labelled(pod: dict[str, Any], app: str) -> dict[str, Any]:
        pod["metadata"]["labels"]["app"] = app
        return pod

    web = labelled(bound("web-1", "n1", 1, "0", "uw"), "web")
    cache.add_bound(web)
    nodes = np.arange(3, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))

    def admitted(pod: dict[str, Any]) -> set[str]:
        snap = cache.snapshot()
        verdict = InterPodAffinity().filter(parse_pod(pod), snap, state, nodes)
        return {snap.names[int(n)] for n in nodes[verdict.passed]}

    def new(name: str) -> dict[str, Any]:
        return make_pod(name, "ns").gpus(1).obj()

    assert admitted(with_terms(new("p"), "podAntiAffinity", "web", "zone")) == {"n3"}
    hostname = "kubernetes.io/hostname"
    assert admitted(with_terms(new("p"), "podAntiAffinity", "web", hostname)) == {"n2", "n3"}
    assert admitted(with_terms(new("p"), "podAffinity", "web", "zone")) == {"n1", "n2"}
    # The first pod of a group that wants its own kind may go anywhere.
    first = labelled(with_terms(new("db-0"), "podAffinity", "db", "zone"), "db")
    assert admitted(first) == {"n1", "n2", "n3"}
    # Other namespaces are out of a term's scope unless named.
    elsewhere = with_terms(make_pod("p", "other").gpus(1).obj(), "podAntiAffinity", "web", "zone")
    assert admitted(elsewhere) == {"n1", "n2", "n3"}
    # Symmetry: a placed pod's anti-affinity keeps matching newcomers out of its domain.
    loner = with_terms(bound("loner", "n3", 1, "0", "ul"), "podAntiAffinity", "web", hostname)
    cache.add_bound(loner)
    assert admitted(labelled(new("web-2"), "web")) == {"n1", "n2"}
    assert admitted(new("plain")) == {"n1", "n2", "n3"}
    verdict = InterPodAffinity().filter(
        parse_pod(labelled(new("web-3"), "web")), cache.snapshot(), state, nodes
    )
    assert [(reason, int(mask.sum())) for reason, mask in verdict.failures] == [
        ("pod anti-affinity", 1),
        ("pod affinity not satisfied", 0),
    ]
    cache.remove_pod("ul")
    assert admitted(labelled(new("web-2"), "web")) == {"n1", "n2", "n3"}


def test_malformed_pod_affinity_terms_are_invalid_requests() -> None:
    pod = make_pod("p", "ns").gpus(1).obj()
    term: dict[str, Any] = {"labelSelector": {"matchLabels": {"app": "x"}}}
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    with pytest.raises(InvalidPodError, match="topologyKey"):
        parse_pod(pod)
    term["topologyKey"] = "zone"
    term["namespaceSelector"] = {"matchLabels": {"team": "a"}}
    with pytest.raises(InvalidPodError, match="namespaceSelector"):
        parse_pod(pod)
    term["namespaceSelector"] = {}
    assert parse_pod(pod).pod_anti_affinity[0].namespaces == frozenset()  # every namespace


def zoned_cache(layout: tuple[tuple[str, str | None], ...]) -> SchedulerCache:
    cache = SchedulerCache()
    for name, zone in layout:
        obj = node(name)
        obj["metadata"]["labels"]["kubernetes.io/hostname"] = name
        if zone is not None:
            obj["metadata"]["labels"]["zone"] = zone
        cache.upsert_node(obj)
    return cache


def app_pod(name: str, app: str = "web", ns: str = "ns") -> dict[str, Any]:
    pod = make_pod(name, ns).gpus(1).obj()
    pod["metadata"]["labels"]["app"] = app
    return pod


def placed_app(
    name: str, node_name: str, uid: str, app: str = "web", gpu: int = 0
) -> dict[str, Any]:
    pod = bound(name, node_name, 1, str(gpu), uid)
    pod["metadata"]["labels"]["app"] = app
    return pod


def spread(pod: dict[str, Any], when: str = "DoNotSchedule", **extra: Any) -> dict[str, Any]:
    constraint = {
        "maxSkew": 1,
        "topologyKey": "zone",
        "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {"app": "web"}},
        **extra,
    }
    pod["spec"].setdefault("topologySpreadConstraints", []).append(constraint)
    return pod


def test_topology_spread_filter_as_upstream() -> None:
    cache = zoned_cache((("a1", "a"), ("a2", "a"), ("b1", "b"), ("x1", None)))
    cache.add_bound(placed_app("w1", "a1", "u1"))
    cache.add_bound(placed_app("w2", "a2", "u2"))
    cache.add_bound(placed_app("w3", "b1", "u3"))
    cache.add_bound(placed_app("other", "b1", "u4", app="db", gpu=1))
    nodes = np.arange(4, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))

    def verdict(pod: dict[str, Any]) -> tuple[set[str], list[tuple[str, int]]]:
        snap = cache.snapshot()
        v = PodTopologySpread().filter(parse_pod(pod), snap, state, nodes)
        admitted = {snap.names[int(n)] for n in nodes[v.passed]}
        return admitted, [(reason, int(mask.sum())) for reason, mask in v.failures]

    # Zone a holds 2 web pods, zone b 1 (the db pod does not match): one more in a would make
    # the skew 3 - 1 = 2 > 1; the node without a zone label can never satisfy the constraint.
    admitted, failures = verdict(spread(app_pod("w4")))
    assert admitted == {"b1"}
    assert failures == [
        (PodTopologySpread.MISSING, 1),
        (PodTopologySpread.SKEWED, 2),
    ]
    # maxSkew 2 admits zone a as well.
    assert verdict(spread(app_pod("w4"), maxSkew=2))[0] == {"a1", "a2", "b1"}
    # A pod the selector does not match does not count itself: 2 + 0 - 1 <= 1.
    assert verdict(spread(app_pod("d", app="db")))[0] == {"a1", "a2", "b1"}
    # Pods of other namespaces are not counted: every zone is at 0 for this one.
    assert verdict(spread(app_pod("w", ns="other")))[0] == {"a1", "a2", "b1"}
    # minDomains 3 with two eligible zones: the global minimum counts as 0, so a zone already
    # holding one matching pod is full at maxSkew 1.
    assert verdict(spread(app_pod("w4"), minDomains=3))[0] == set()
    # Node affinity policy Honor (default): zone b, excluded by the pod's node selector, is not
    # a domain, so zone a is the minimum and admits the pod (b1 is left to NodeSelector to
    # refuse, as upstream); Ignore counts zone b again and zone a is over the skew.
    only_a = spread(app_pod("w4"))
    only_a["spec"]["nodeSelector"] = {"zone": "a"}
    assert verdict(only_a)[0] == {"a1", "a2", "b1"}
    only_a["spec"]["topologySpreadConstraints"][0]["nodeAffinityPolicy"] = "Ignore"
    assert verdict(only_a)[0] == {"b1"}
    # Soft constraints do not filter.
    assert verdict(spread(app_pod("w4"), when="ScheduleAnyway"))[0] == {"a1", "a2", "b1", "x1"}


def test_topology_spread_taint_policy_and_match_label_keys() -> None:
    cache = zoned_cache((("a1", "a"), ("b1", "b")))
    tainted = node("c1", spec={"taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    tainted["metadata"]["labels"].update({"zone": "c", "kubernetes.io/hostname": "c1"})
    cache.upsert_node(tainted)
    cache.add_bound(placed_app("w1", "a1", "u1"))
    cache.add_bound(placed_app("w2", "b1", "u2"))
    nodes = np.arange(3, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))

    def admitted(pod: dict[str, Any]) -> set[str]:
        snap = cache.snapshot()
        v = PodTopologySpread().filter(parse_pod(pod), snap, state, nodes)
        return {snap.names[int(n)] for n in nodes[v.passed]}

    # Taints ignored (default): zone c (0 pods) is the minimum, a and b are at the limit.
    assert admitted(spread(app_pod("w3"))) == {"c1"}
    # Taints honoured: the untolerated zone c is not a domain; a and b tie at 1.
    assert admitted(spread(app_pod("w3"), nodeTaintsPolicy="Honor")) == {"a1", "b1", "c1"}
    # matchLabelKeys narrows the selector to the pod's own revision: no placed pod matches.
    fresh = spread(app_pod("w3"), matchLabelKeys=["rev"])
    fresh["metadata"]["labels"]["rev"] = "2"
    assert parse_pod(fresh).spread[0].selector.match_labels == (("app", "web"), ("rev", "2"))
    assert admitted(fresh) == {"a1", "b1", "c1"}


def test_topology_spread_score_prefers_the_emptier_domain() -> None:
    cache = zoned_cache((("a1", "a"), ("a2", "a"), ("b1", "b"), ("x1", None)))
    cache.add_bound(placed_app("w1", "a1", "u1"))
    cache.add_bound(placed_app("w2", "a2", "u2"))
    snap = cache.snapshot()
    nodes = np.arange(4, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))
    soft = parse_pod(spread(app_pod("w3"), when="ScheduleAnyway"))
    scores = PodTopologySpread().score(soft, snap, state, nodes)
    # Zone b (0 matching) scores 100, zone a (2) scores 0, the unlabelled node 0.
    assert list(scores) == [0.0, 0.0, 100.0, 0.0]
    # Hard constraints and pods without any do not score.
    assert not PodTopologySpread().score(parse_pod(spread(app_pod("h"))), snap, state, nodes).any()
    assert not PodTopologySpread().score(parse_pod(app_pod("p")), snap, state, nodes).any()
    # Through the live profile, the soft constraint steers the pod to zone b.
    framework = Framework(build_profile("alnair", [soft]))
    chosen = {
        placement.node_name
        for seed in range(8)
        if (placement := framework.schedule(soft, snap, np.random.default_rng(seed)).placement)
    }
    assert chosen == {"b1"}


def test_preferred_inter_pod_affinity_scores_domains() -> None:
    cache = zoned_cache((("a1", "a"), ("a2", "a"), ("b1", "b")))
    cache.add_bound(placed_app("w1", "a1", "u1"))
    cache.add_bound(placed_app("c1", "b1", "u2", app="cache"))
    cache.add_bound(placed_app("c2", "b1", "u3", app="cache", gpu=1))
    snap = cache.snapshot()
    nodes = np.arange(3, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))

    def preferring(**kinds: list[tuple[int, str]]) -> LivePod:
        pod = app_pod("p", app="api")
        affinity = pod["spec"].setdefault("affinity", {})
        for kind, terms in kinds.items():
            affinity[kind] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": weight,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": app}},
                            "topologyKey": "zone",
                        },
                    }
                    for weight, app in terms
                ]
            }
        return parse_pod(pod)

    plugin = PreferredInterPodAffinity()
    # Near the caches (two of them in zone b), away from web (zone a).
    near_cache = preferring(podAffinity=[(10, "cache")])
    assert list(plugin.score(near_cache, snap, state, nodes)) == [0.0, 0.0, 100.0]
    away_from_web = preferring(podAntiAffinity=[(50, "web")])
    assert list(plugin.score(away_from_web, snap, state, nodes)) == [0.0, 0.0, 100.0]
    # Wanting web (+40 in zone a) beats wanting the caches' zone (+15 x 2 in b), which still
    # scores in proportion: the range is taken from 0, as upstream.
    mixed = preferring(podAffinity=[(40, "web"), (15, "cache")])
    assert list(plugin.score(mixed, snap, state, nodes)) == [100.0, 100.0, 75.0]
    # No preferred terms, or nothing they select: 0 everywhere.
    assert not plugin.score(parse_pod(app_pod("q")), snap, state, nodes).any()
    assert not plugin.score(preferring(podAffinity=[(5, "none")]), snap, state, nodes).any()


def test_placed_pods_terms_score_newcomers_symmetrically() -> None:
    cache = zoned_cache((("a1", "a"), ("b1", "b"), ("c1", "c")))
    state = CycleState(np.random.default_rng(0))
    nodes = np.arange(3, dtype=np.int64)
    plugin = PreferredInterPodAffinity()

    def term(app: str) -> dict[str, Any]:
        return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "zone"}

    # A placed web pod (zone a) prefers api pods near it (weight 20); a placed cache pod
    # (zone b) requires api pods near it (weight 1 for scoring); a placed batch pod (zone c)
    # prefers api pods away from it.
    web = placed_app("w", "a1", "u1")
    web["spec"]["affinity"] = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 20, "podAffinityTerm": term("api")}
            ]
        }
    }
    cache_pod = placed_app("c", "b1", "u2", app="cache")
    cache_pod["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("api")]}
    }
    batch = placed_app("b", "c1", "u3", app="batch")
    batch["spec"]["affinity"] = {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 30, "podAffinityTerm": term("api")}]}}  # fmt: skip
    for placed in (web, cache_pod, batch):
        cache.add_bound(placed)
    api = parse_pod(app_pod("api-0", app="api"))
    # Raw +20 (a), +1 (b), -30 (c): normalised over [-30, 20].
    assert list(plugin.score(api, cache.snapshot(), state, nodes)) == [100.0, 62.0, 0.0]
    # A pod those terms do not select is left to the policy.
    assert not plugin.score(
        parse_pod(app_pod("x", app="other")), cache.snapshot(), state, nodes
    ).any()
    # The index forgets a pod that leaves.
    cache.remove_pod("u1")
    cache.remove_pod("u3")
    assert list(plugin.score(api, cache.snapshot(), state, nodes)) == [0.0, 100.0, 0.0]


def test_malformed_spread_and_preferred_pod_terms_name_the_field() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"maxSkew": 0}, r"topologySpreadConstraints\[0\]\.maxSkew"),
        ({"whenUnsatisfiable": "Sometimes"}, r"whenUnsatisfiable"),
        ({"topologyKey": ""}, r"topologySpreadConstraints\[0\]\.topologyKey"),
        ({"minDomains": 2, "whenUnsatisfiable": "ScheduleAnyway"}, r"minDomains"),
        ({"nodeTaintsPolicy": "Maybe"}, r"nodeTaintsPolicy"),
        (
            {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
            r"labelSelector",
        ),
    ]
    for extra, field_pattern in cases:
        with pytest.raises(InvalidPodError, match=field_pattern):
            parse_pod(spread(app_pod("p"), **extra))
    pod = app_pod("p")
    pod["spec"]["affinity"] = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 101, "podAffinityTerm": {"topologyKey": "zone"}}
            ]
        }
    }
    with pytest.raises(InvalidPodError, match=r"preferredDuringSchedulingIgnoredDuringExecution"):
        parse_pod(pod)


def test_a_relabelled_bound_pod_is_seen_with_its_new_labels() -> None:
    cache = zoned_cache((("a1", "a"), ("b1", "b")))
    placed = placed_app("w1", "a1", "u1", app="web")
    cache.add_bound(placed)
    nodes = np.arange(2, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))
    wants_db = app_pod("api", app="api")
    wants_db["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
            ]
        }
    }

    def admitted() -> set[str]:
        snap = cache.snapshot()
        verdict = InterPodAffinity().filter(parse_pod(wants_db), snap, state, nodes)
        return {snap.names[int(n)] for n in nodes[verdict.passed]}

    assert admitted() == set()
    relabelled = {**placed, "metadata": {**placed["metadata"], "labels": {"app": "db"}}}
    cache.add_bound(relabelled)
    assert admitted() == {"a1"}


def test_pod_count_and_other_resources_are_checked_and_counted() -> None:
    cache = SchedulerCache()
    small = node("small")
    small["status"]["allocatable"].update({"pods": "2", "example.com/rdma": "1"})
    big = node("big")
    big["status"]["allocatable"].update({"pods": "110", "hugepages-2Mi": "64Mi"})
    cache.upsert_node(small)
    cache.upsert_node(big)
    nodes = np.arange(2, dtype=np.int64)
    state = CycleState(np.random.default_rng(0))

    def rdma_pod(name: str) -> dict[str, Any]:
        pod = make_pod(name, "ns").gpus(1).obj()
        pod["spec"]["containers"][0]["resources"]["limits"]["example.com/rdma"] = "1"
        return pod

    req = parse_pod(rdma_pod("r1"))
    assert req.extra == (("example.com/rdma", 1),)
    snap = cache.snapshot()
    verdict = NodeResourcesExtra().filter(req, snap, state, nodes)
    assert [snap.names[int(n)] for n in nodes[verdict.passed]] == ["small"]
    assert [(why, int(m.sum())) for why, m in verdict.failures] == [
        ("Too many pods", 0),
        ("Insufficient example.com/rdma", 1),  # big reports none
    ]
    # Through the live profile the pod lands where the device is, and takes it.
    framework = Framework(build_profile("alnair", [req]))
    placed = framework.schedule(req, snap, np.random.default_rng(0))
    assert placed.placement is not None and placed.placement.node_name == "small"
    cache.assume(req, placed.placement)
    second = parse_pod(rdma_pod("r2"))
    refused = framework.schedule(second, cache.snapshot(), np.random.default_rng(0), explain=True)
    assert refused.placement is None
    assert "2 Insufficient example.com/rdma" in refused.message()
    cache.forget(req.key)
    assert framework.schedule(second, cache.snapshot(), np.random.default_rng(0)).placement
    # The pod count: two pods fill `small` whatever they ask.
    for uid in ("p1", "p2"):
        cache.add_bound(bound(uid, "small", 1, "0" if uid == "p1" else "1", uid))
    plain = parse_pod(make_pod("plain", "ns").gpus(1).obj())
    snap = cache.snapshot()
    verdict = NodeResourcesExtra().filter(plain, snap, state, nodes)
    assert [snap.names[int(n)] for n in nodes[verdict.passed]] == ["big"]
    # A higher-priority pod that needs `small` (for its device) may evict one to get a slot.
    urgent = parse_pod(rdma_pod("urgent"))
    victims = select_victims(replace(urgent, priority=100), snap, [snap.node_index("small")], {})
    assert victims is not None and len(victims.victims) == 1
    # Sizes are whole bytes; a node reporting less than the request is refused.
    huge = make_pod("huge", "ns").gpus(1).obj()
    huge["spec"]["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = "128Mi"
    verdict = NodeResourcesExtra().filter(parse_pod(huge), snap, state, nodes)
    assert not verdict.passed.any()
    # A capacity change of those resources rebuilds the snapshot.
    big["status"]["allocatable"]["hugepages-2Mi"] = "256Mi"
    assert cache.upsert_node(big)
    snap = cache.snapshot()
    verdict = NodeResourcesExtra().filter(parse_pod(huge), snap, state, nodes)
    assert [snap.names[int(n)] for n in nodes[verdict.passed]] == ["big"]


def test_a_bound_pod_whose_request_cannot_be_read_still_holds_what_it_holds() -> None:
    """Bound by another scheduler with a model no node has (issue 24): its 8 GPUs are taken,
    not free; and a quantity that cannot be read leaves the rest of its request counted."""
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 8, model="V100M32"))
    foreign = make_pod("foreign", "ns").gpus(8).cpu("4").obj()
    foreign["metadata"]["uid"] = "uf"
    foreign["metadata"]["annotations"][r.GPU_MODEL_REQUEST] = "B200"
    foreign["spec"]["nodeName"] = "n1"
    problem = cache.add_bound(foreign)
    assert problem is not None and "B200" in problem
    snap = cache.snapshot()
    assert list(snap.gpu_free[0, :8]) == [0] * 8
    assert int(snap.cpu_free[0]) == 32000 - 4000
    assert cache.add_bound(foreign) is None  # said once, when first accounted

    bad_cpu = make_pod("odd", "ns").gpus(2).obj()
    bad_cpu["metadata"]["uid"] = "uo"
    bad_cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    bad_cpu["spec"]["nodeName"] = "n2"
    cache.upsert_node(node("n2", 4))
    assert cache.add_bound(bad_cpu) is not None
    held = cache.bound["uo"][0]
    assert (held.num_gpu, held.cpu_milli, held.memory_mib) == (2, 0, 1024)
    assert int(cache.snapshot().gpu_free[1, :4].sum()) == 2000

    readable = bound("fine", "n2", 1, "3", "ufine")
    assert cache.add_bound(readable) is None


def test_a_shared_gpus_use_is_the_sum_of_its_pods_and_idle_again_when_they_end() -> None:
    """Issue 27: each pod's sample used to overwrite the GPU's value, and a GPU whose pods
    ended kept its last reading forever."""
    cache = SchedulerCache()
    cache.upsert_node(node("n1", 2))
    cache.upsert_node(node("n2", 2))
    for name, uid in (("a", "ua"), ("b", "ub")):
        cache.add_bound(bound(name, "n1", 1, "0", uid))
    cache.set_gpu_util("n1", 0, 30.0, "ua", 1024.0)
    cache.set_gpu_util("n1", 0, 45.0, "ub")
    # Each pod's measured GPU memory is kept too (`kubectl alnair top`), and goes with it.
    assert cache.mem_of_pod["ua"] == {("n1", 0): 1024.0}
    snap = cache.snapshot()
    assert cache.util[("n1", 0)] == 75.0 and float(snap.gpu_util[0, 0]) == 75.0
    cache.set_gpu_util("n1", 0, 70.0, "ub")  # a newer sample replaces that pod's own share
    assert cache.util[("n1", 0)] == 100.0  # capped
    cache.set_gpu_util("n1", 0, 50.0, "gone")  # a pod not bound here: dropped
    assert cache.util[("n1", 0)] == 100.0
    cache.remove_pod("ub")
    assert float(snap.gpu_util[0, 0]) == 30.0
    cache.remove_pod("ua")
    assert ("n1", 0) not in cache.util and float(snap.gpu_util[0, 0]) == 0.0
    assert "ua" not in cache.mem_of_pod and "ub" not in cache.mem_of_pod

    # The score follows: a whole-GPU pod goes to the node whose GPUs are measured idle.
    cache.add_bound(bound("c", "n1", 1, "1", "uc"))
    cache.set_gpu_util("n1", 1, 90.0, "uc")
    scorer = GpuUtilization()
    pod = parse_pod(make_pod("new", "ns").gpus(1).obj())
    nodes = np.array([0, 1])
    scores = scorer.score(pod, cache.snapshot(), None, nodes)  # type: ignore[arg-type]
    assert scores[1] > scores[0]  # n1's free GPU sits beside a busy one: n2 scores higher
    cache.remove_pod("uc")
    assert not cache.snapshot().gpu_util.any()
