"""Issue 27: co-location interference in placement, and the measured-use score placing pods.

Each test runs the whole profile (`build_profile`) on a snapshot, so what it shows is where a
pod goes, not what one plugin returns; each would fail with the plugin switched off (checked
by running the same placement without it)."""

from __future__ import annotations

import numpy as np
import pytest

from alnair.common.colocation import ColocationTable, gpu_type_of, workload_key
from alnair.common.errors import InvalidValueError
from alnair.dev.builders import make_pod
from alnair.scheduler.cluster.pods import parse_pod
from alnair.scheduler.cluster.requests import NodeSpec, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.dispatcher.sharing import Fraction, SharedGpu, may_join
from alnair.scheduler.framework.runtime import Framework
from alnair.scheduler.plugins.interference import ColocationBook
from alnair.scheduler.plugins.registry import ProfileOptions, build_profile

JOBS = ("bert@32", "recommendation@512", "resnet50@16")
# kept[i][j]: what JOBS[i] keeps next to JOBS[j] on a V100. The recommendation model next to
# ResNet-50 keeps 1% of its speed (as Gavel measured); BERT and ResNet-50 share well.
KEPT = [
    [0.5, 0.45, 0.8],
    [0.45, 0.5, 0.01],
    [0.85, 0.6, 0.5],
]


def table(kept: list[list[float]] | None = None) -> ColocationTable:
    return ColocationTable(7, JOBS, {"V100": kept or KEPT, "K80": [[0.5] * 3] * 3})


def fraction(name: str, model: str, batch: int, milli: int = 500) -> PodRequest:
    pod = parse_pod(make_pod(name, "ns").fraction(milli // 10).trains(model, batch).obj())
    assert pod.is_fractional and pod.workload == workload_key(model, batch)
    return pod


def cluster(gpus: int = 1) -> ClusterSnapshot:
    nodes = [NodeSpec(f"n{i}", 32_000, 128_000, gpus, "V100M16") for i in (1, 2)]
    return ClusterSnapshot.build(nodes)


def place(snap: ClusterSnapshot, pod: PodRequest, node: str, gpu: int) -> None:
    snap.assume(pod, Placement(snap.node_index(node), node, (gpu,), pod.gpu_milli))


def run(pod: PodRequest, snap: ClusterSnapshot, book: ColocationBook | None, **options: float):
    profile = build_profile(
        "alnair",
        [pod],
        ProfileOptions(colocation=book, **options),  # type: ignore[arg-type]
    )
    return Framework(profile, tie_break="first").schedule(pod, snap, np.random.default_rng(0))


def test_a_fraction_goes_to_the_gpu_where_the_model_predicts_no_harm() -> None:
    snap = cluster()
    place(snap, fraction("rn", "resnet50", 16), "n1", 0)
    place(snap, fraction("bert", "bert", 32), "n2", 0)
    rec = fraction("rec", "recommendation", 512)
    placed = run(rec, snap, ColocationBook(table())).placement
    assert placed is not None and placed.node_name == "n2"
    # Without the table the policy packs it beside ResNet-50 (n1 is first on ties).
    blind = run(rec, snap, ColocationBook(None)).placement
    assert blind is not None and blind.node_name == "n1"


def test_with_only_the_harmful_gpu_free_the_pod_waits_and_the_reason_says_why() -> None:
    snap = cluster()
    place(snap, fraction("rn", "resnet50", 16), "n1", 0)
    place(snap, fraction("big", "bert", 32, milli=1000 - 100), "n2", 0)  # n2 has no room
    result = run(fraction("rec", "recommendation", 512), snap, ColocationBook(table()))
    assert result.placement is None
    assert "co-location predicted past 2.5x slowdown" in result.message()
    # The pod already there is protected too: ResNet-50 joining a recommendation model.
    snap2 = cluster()
    place(snap2, fraction("rec", "recommendation", 512), "n1", 0)
    place(snap2, fraction("big", "bert", 32, milli=900), "n2", 0)
    assert run(fraction("rn", "resnet50", 16), snap2, ColocationBook(table())).placement is None
    # A higher cap admits it.
    loose = run(
        fraction("rn", "resnet50", 16), snap2, ColocationBook(table()), max_colocation_slowdown=200
    )
    assert loose.placement is not None and loose.placement.node_name == "n1"


def test_on_one_node_the_gpu_choice_moves_off_the_refused_gpu() -> None:
    snap = cluster(gpus=2)
    place(snap, fraction("rn", "resnet50", 16), "n1", 0)
    place(snap, fraction("bert", "bert", 32), "n1", 1)
    place(snap, fraction("fill1", "bert", 32, milli=990), "n2", 0)
    place(snap, fraction("fill2", "bert", 32, milli=990), "n2", 1)
    placed = run(fraction("rec", "recommendation", 512), snap, ColocationBook(table())).placement
    assert placed is not None and placed.node_name == "n1" and placed.gpu_indices == (1,)


def test_the_score_prefers_the_gentler_neighbour_among_acceptable_ones() -> None:
    snap = cluster()
    place(snap, fraction("rec", "recommendation", 512), "n1", 0)  # BERT keeps 45%: 2.2x
    place(snap, fraction("rn", "resnet50", 16), "n2", 0)  # BERT keeps 80%: 1.25x
    bert = fraction("b2", "bert", 32)
    placed = run(bert, snap, ColocationBook(table())).placement
    assert placed is not None and placed.node_name == "n2"
    off = run(bert, snap, ColocationBook(table()), interference_weight=0.0).placement
    assert off is not None and off.node_name == "n1"  # caps only: the policy's tie order


def test_a_gpu_busy_past_the_sharing_cap_takes_no_further_fraction() -> None:
    snap = cluster()
    place(snap, fraction("a", "bert", 32), "n1", 0)
    place(snap, fraction("b", "bert", 32, milli=900), "n2", 0)
    snap.gpu_util = np.zeros_like(snap.gpu_util)
    snap.gpu_util[0, 0] = 75.0
    result = run(fraction("c", "bert", 32, milli=300), snap, ColocationBook(table()))
    assert result.placement is None and "GPU use past the 70% sharing cap" in result.message()
    snap.gpu_util[0, 0] = 40.0
    assert run(fraction("c", "bert", 32, milli=300), snap, ColocationBook(table())).placement


def test_pods_the_table_does_not_know_are_never_refused() -> None:
    snap = cluster()
    place(snap, fraction("rn", "resnet50", 16), "n1", 0)
    place(snap, fraction("big", "bert", 32, milli=900), "n2", 0)
    unknown = fraction("x", "mystery-net", 8)
    assert run(unknown, snap, ColocationBook(table())).placement is not None


def test_one_rule_for_sharers_the_table_does_not_know() -> None:
    """`ColocationTable.join`, which the binder and the dispatcher both judge by: an unknown
    sharer is left out of the sums (and counted), so a known harmful pair is still refused
    beside it; an unknown newcomer has no prediction and harms no one."""
    t = table()
    beside_unknown = t.join("recommendation@512", ["resnet50@16", "mystery@8"], "V100")
    assert beside_unknown.unknown == 1
    assert beside_unknown.own == pytest.approx(1.0 / 0.01)  # ResNet-50 alone counts
    assert beside_unknown.refused(2.5)
    assert beside_unknown.excess(1.0) == pytest.approx((1.0 / 0.01 - 1.0) + (1.0 / 0.6 - 1.0) + 1.0)
    gentle = t.join("bert@32", ["resnet50@16", ""], "V100")
    assert not gentle.refused(2.5) and gentle.unknown == 1
    stranger = t.join("mystery@8", ["resnet50@16", "bert@32"], "V100")
    assert (stranger.own, stranger.neighbours, stranger.unknown) == (None, (), 2)
    assert not stranger.refused(1.0) and stranger.excess(1.0) == 2.0
    # The dispatcher's packing keeps the same verdicts.
    gpu = SharedGpu([Fraction("a", "resnet50@16", 4096.0), Fraction("b", "mystery@8", 4096.0)])
    new = Fraction("c", "recommendation@512", 4096.0)
    assert may_join(gpu, new, 16384.0, t, "V100", 2.5) is None
    bert = Fraction("d", "bert@32", 4096.0)
    assert may_join(gpu, bert, 16384.0, t, "V100", 2.5) == pytest.approx(1.0 / 0.8)


def test_the_snapshot_knows_who_shares_each_gpu_and_forgets_them() -> None:
    snap = cluster()
    a, b = fraction("a", "bert", 32, 300), fraction("b", "resnet50", 16, 300)
    place(snap, a, "n1", 0)
    place(snap, b, "n1", 0)
    assert snap.sharers == {(0, 0): {a.key: "bert@32", b.key: "resnet50@16"}}
    copy = snap.copy()
    snap.forget(a.key)
    assert snap.sharers == {(0, 0): {b.key: "resnet50@16"}}
    assert len(copy.sharers[(0, 0)]) == 2  # copies are independent
    snap.forget(b.key)
    assert snap.sharers == {}


def test_the_measured_use_score_changes_a_placement() -> None:
    """Issue 27: the score must move a pod, and the placement must differ with it off."""
    nodes = [NodeSpec(f"n{i}", 32_000, 128_000, 2, "V100M16") for i in (1, 2)]
    snap = ClusterSnapshot.build(nodes)
    snap.gpu_util[0, :] = 95.0  # n1's GPUs run someone else's work flat out
    pod = parse_pod(make_pod("p", "ns").gpus(1).obj())
    rng = np.random.default_rng(0)

    def where(weight: float) -> str:
        profile = build_profile("binpack", [pod], ProfileOptions(utilization_weight=weight))
        result = Framework(profile, tie_break="first").schedule(pod, snap, rng)
        assert result.placement is not None
        return result.placement.node_name

    assert where(0.0) == "n1"
    assert where(0.1) == "n2"


def test_the_table_round_trips_and_refuses_malformed_input_by_name() -> None:
    t = table()
    back = ColocationTable.decode(t.encode())
    assert back.jobs == JOBS and back.model_version == 7
    assert back.kept_fraction("bert@32", "resnet50@16", "Tesla-V100-SXM2-16GB") == 0.8
    assert back.kept_fraction("bert@32", "resnet50@16", "A100") is None
    assert back.slowdown("bert@32", ["resnet50@16", "recommendation@512"], "V100") == (
        pytest.approx(1 + 0.25 + (1 / 0.45 - 1))
    )
    with pytest.raises(InvalidValueError, match="kept.V100"):
        ColocationTable(1, JOBS, {"V100": [[0.5] * 3] * 2})
    with pytest.raises(InvalidValueError, match="kept fraction"):
        ColocationTable(1, JOBS, {"V100": [[0.5, 0.5, -1.0]] * 3})
    with pytest.raises(InvalidValueError, match="not JSON"):
        ColocationTable.decode(b"{oops")
    with pytest.raises(InvalidValueError, match="model_version"):
        ColocationTable.decode(b'{"jobs": [], "kept": {}}')
    assert workload_key("ResNet-50", "64") == "resnet50@64"
    assert workload_key("a3c", None) == "a3c@1" and workload_key("bert", "") == "bert@32"
    assert workload_key("bert", "x") == "" and workload_key(None) == ""
    assert gpu_type_of("A100-SXM4-80GB", ["A10", "A100"]) == "A100"
