"""The framework's contract: filters explain rejections, selection and GPU choice are right,
assume/forget keep the snapshot consistent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.requests import Placement
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework import Code, CycleState, Framework, Profile, WeightedScore
from alnair.scheduler.placement import BestFitGpu, RandomGpu, WorstFitGpu
from alnair.scheduler.plugins.best_fit import BestFitScore
from alnair.scheduler.plugins.fit import DEFAULT_FILTERS
from alnair.scheduler.plugins.registry import framework, policy

PodF = Callable[..., Any]
NodeF = Callable[[str], Any]


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def cycle() -> CycleState:
    return CycleState(rng=rng())


def test_unschedulable_message_counts_each_reason(pod: PodF, node: NodeF) -> None:
    snap = ClusterSnapshot.build(
        [
            node("small").cpu(500).gpus(4).obj(),
            node("t4").gpus(2, "T4").obj(),
            node("cpu-only").obj(),
            node("busy").gpus(1).obj(),
        ]
    )
    snap.assume(pod("hog").gpus(1).obj(), Placement(3, "busy", (0,), 1000))
    wanted = pod().gpus(1).models("V100M32").obj()

    result = framework("BestFit", []).schedule(wanted, snap, rng(), explain=True)

    assert result.placement is None
    assert result.status.code is Code.UNSCHEDULABLE
    assert result.reasons == {
        "Insufficient cpu": 1,
        "GPU model not allowed": 1,
        "no GPU": 1,
        "Insufficient whole GPUs": 1,
    }
    assert result.node_reasons[1] == "GPU model not allowed"
    assert result.message().startswith("0/4 nodes are available: ")
    assert "1 Insufficient cpu" in result.message()


@pytest.mark.parametrize(
    ("selector", "free", "expected"),
    [
        (BestFitGpu(), [1000, 300, 600, 500], 1),
        (WorstFitGpu(), [600, 300, 1000, 1000], 2),
        (BestFitGpu(), [200, 240, 100, 500], 3),
    ],
)
def test_fractional_gpu_choice(
    pod: PodF, node: NodeF, selector: BestFitGpu | WorstFitGpu, free: list[int], expected: int
) -> None:
    snap = ClusterSnapshot.build([node("n").gpus(4).obj()])
    snap.gpu_free[0, :4] = free
    gpus = selector.select_gpus(pod().share(250).obj(), snap, cycle(), 0)
    assert gpus == (expected,)


def test_random_gpu_only_picks_fitting_gpus(pod: PodF, node: NodeF) -> None:
    snap = ClusterSnapshot.build([node("n").gpus(4).obj()])
    snap.gpu_free[0, :4] = [100, 900, 50, 700]
    state = cycle()
    wanted = pod().share(600).obj()
    picks = {RandomGpu().select_gpus(wanted, snap, state, 0) for _ in range(50)}
    assert picks == {(1,), (3,)}


def test_whole_gpus_take_lowest_free_indices(pod: PodF, node: NodeF) -> None:
    snap = ClusterSnapshot.build([node("n").gpus(8).obj()])
    snap.gpu_free[0, [0, 3]] = [400, 0]
    result = framework("BestFit", []).schedule(pod().gpus(3).obj(), snap, rng())
    assert result.placement is not None
    assert result.placement.gpu_indices == (1, 2, 4)
    assert result.placement.annotation_indices() == "1,2,4"


def test_first_tie_break_takes_snapshot_order_and_random_spreads(pod: PodF, node: NodeF) -> None:
    nodes = [node(f"n{i}").gpus(2).obj() for i in range(6)]
    profile = Profile("bf", DEFAULT_FILTERS, (WeightedScore(BestFitScore()),), BestFitGpu())
    wanted = pod().gpus(1).obj()

    first = Framework(profile, tie_break="first")
    assert {
        first.schedule(wanted, ClusterSnapshot.build(nodes), rng()).placement.node for _ in range(5)
    } == {0}  # type: ignore[union-attr]

    spread = Framework(profile, tie_break="random")
    generator = np.random.default_rng(7)
    chosen = {
        spread.schedule(wanted, ClusterSnapshot.build(nodes), generator).placement.node
        for _ in range(60)
    }  # type: ignore[union-attr]
    assert len(chosen) > 3


def test_unknown_tie_break_is_named(pod: PodF) -> None:
    with pytest.raises(InvalidValueError, match="tie_break"):
        Framework(policy("FGD").build([pod().obj()]), tie_break="last")


def test_assume_then_forget_restores_the_snapshot(pod: PodF, node: NodeF) -> None:
    snap = ClusterSnapshot.build([node("a").gpus(4).obj(), node("b").gpus(2).obj()])
    before = (
        snap.cpu_free.copy(),
        snap.mem_free.copy(),
        snap.gpu_free.copy(),
        snap.affinity.copy(),
    )
    shared = pod("s").share(300).obj()
    snap.assume(shared, Placement(1, "b", (1,), 300))
    assert snap.gpu_free[1, 1] == 700
    assert snap.affinity[1, 0] == 1
    assert snap.gpu_allocated_milli == 300
    snap.forget(shared.key)
    after = (snap.cpu_free, snap.mem_free, snap.gpu_free, snap.affinity)
    for old, new in zip(before, after, strict=True):
        assert np.array_equal(old, new)
    assert snap.generation[1] == 2


@pytest.mark.parametrize(
    ("placement", "problem"),
    [
        (Placement(0, "a", (0,), 1000), "insufficient milli-GPU on GPU 0"),
        (Placement(0, "a", (5,), 1000), "no GPU 5"),
        (Placement(0, "a", (1, 1), 1000), "chosen twice"),
        (Placement(0, "a", (), 1000), "0 GPUs chosen"),
    ],
)
def test_assume_refuses_overcommit(
    pod: PodF, node: NodeF, placement: Placement, problem: str
) -> None:
    snap = ClusterSnapshot.build([node("a").gpus(2).obj()])
    snap.gpu_free[0, 0] = 200
    wanted = pod().gpus(2 if len(placement.gpu_indices) == 2 else 1).obj()
    with pytest.raises(InvalidValueError, match=problem):
        snap.assume(wanted, placement)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_gpu": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"num_gpu": 0, "gpu_milli": 500}, "gpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 1500}, "gpu_milli"),
        ({"cpu_milli": -1}, "cpu_milli"),
    ],
)
def test_bad_pod_requests_name_the_field(kwargs: dict[str, int], field: str) -> None:
    from alnair.scheduler.cluster.requests import PodRequest

    base = {"name": "p", "cpu_milli": 1, "memory_mib": 1}
    with pytest.raises(InvalidValueError) as caught:
        PodRequest(**(base | kwargs))  # type: ignore[arg-type]
    assert caught.value.field == field


def test_policy_names_are_case_insensitive_and_unknown_names_listed() -> None:
    assert policy("dotprod").name == "DotProd"
    assert policy("fgd").name == "FGD"
    with pytest.raises(InvalidValueError, match="known: Random"):
        policy("tetris")


@pytest.mark.parametrize(("name", "expected"), [("FGD", 0), ("alnair", 2)])
def test_fractional_ties_inside_a_node(pod: PodF, node: NodeF, name: str, expected: int) -> None:
    # Every typical pod asks for 100 milli, so a 300-milli pod on any of these GPUs leaves the
    # fragmentation the same: FGD takes the lowest index, alnair the fullest GPU that fits.
    snap = ClusterSnapshot.build([node("n").gpus(4).obj()])
    snap.gpu_free[0, :4] = [1000, 1000, 400, 700]
    fw = framework(name, [pod().share(100).obj()] * 5, tie_break="first")
    result = fw.schedule(pod().share(300).obj(), snap, rng())
    assert result.placement is not None
    assert result.placement.gpu_indices == (expected,)
