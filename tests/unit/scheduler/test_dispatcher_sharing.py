"""Issue 27: the dispatcher plans fractions on shared GPUs with the co-location table."""

from __future__ import annotations

import pytest

from alnair.common.colocation import ColocationTable
from alnair.scheduler.dispatcher.sharing import Fraction, likely_sharing, pack

JOBS = ("bert@32", "recommendation@512", "resnet50@16")
KEPT = [[0.5, 0.45, 0.8], [0.45, 0.5, 0.01], [0.85, 0.6, 0.5]]
TABLE = ColocationTable(3, JOBS, {"V100": KEPT})
GIB = 1024.0


def f(key: str, workload: str, gib: float = 8) -> Fraction:
    return Fraction(key, workload, gib * GIB)


def test_two_fractions_predicted_past_the_cap_are_never_planned_on_one_gpu() -> None:
    rn, rec = f("a", "resnet50@16"), f("b", "recommendation@512")
    assert len(pack([rn, rec], 32 * GIB, TABLE, "V100M32", 2.5)) == 2
    # Without the table only memory decides: they would share.
    assert len(pack([rn, rec], 32 * GIB, None, "V100M32", 2.5)) == 1
    # A gentle pair shares; memory still bounds it.
    bert = f("c", "bert@32")
    assert len(pack([rn, bert], 32 * GIB, TABLE, "V100M32", 2.5)) == 1
    assert len(pack([rn, f("d", "bert@32", 30)], 32 * GIB, TABLE, "V100M32", 2.5)) == 2
    # Three: the recommendation model gets a GPU of its own, the others share.
    gpus = pack([rn, rec, bert], 32 * GIB, TABLE, "V100M32", 2.5)
    assert sorted(sorted(m.key for m in g.members) for g in gpus) == [["a", "c"], ["b"]]


def test_a_waiting_fraction_is_planned_at_its_speed_beside_the_gentlest_neighbour() -> None:
    gpus = pack([f("a", "resnet50@16"), f("b", "recommendation@512")], 32 * GIB, TABLE,
                "V100M32", 2.5)  # fmt: skip
    found = likely_sharing(f("c", "bert@32"), gpus, 32 * GIB, TABLE, "V100M32", 2.5)
    assert found is not None and found.partners == ("resnet50@16",)
    assert found.slowdown == pytest.approx(1 / 0.8)
    assert found.describe() == {"slowdown": 1.25, "with": ["resnet50@16"]}
    # A second recommendation model may join neither (1/0.01 beside ResNet-50, 2x beside
    # its twin is allowed only under the cap): with cap 1.5 it runs alone.
    assert likely_sharing(f("d", "recommendation@512"), gpus, 32 * GIB, TABLE, "V100M32",
                          1.5) is None  # fmt: skip
    # Unknown workloads share by memory, at a slowdown nobody can predict (1.0 planned).
    unknown = likely_sharing(f("e", ""), gpus, 32 * GIB, TABLE, "V100M32", 2.5)
    assert unknown is not None and unknown.slowdown == 1.0
