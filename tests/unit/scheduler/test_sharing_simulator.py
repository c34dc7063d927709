"""The time replay of shared GPUs (`simulator/sharing.py`): jobs slow each other as the
ground truth says, and the interference plugin changes what they finish at."""

from __future__ import annotations

import pytest

from alnair.common.colocation import ColocationTable
from alnair.scheduler.cluster.requests import NodeSpec
from alnair.scheduler.plugins.interference import ColocationBook
from alnair.scheduler.plugins.registry import ProfileOptions
from alnair.scheduler.simulator.sharing import Physics, SharedJob, simulate_sharing

ALONE = {("a@1", "V100"): 1.0, ("b@1", "V100"): 1.0}
# a keeps 10% beside b (10x slower), b keeps 90% beside a
PHYSICS = Physics(ALONE, {("a@1", "b@1", "V100"): 0.1, ("b@1", "a@1", "V100"): 0.9})
ONE_GPU = [NodeSpec("n", 8000, 64000, 1, "V100")]
TWO_GPUS = [NodeSpec("n", 8000, 64000, 2, "V100")]
JOBS = [SharedJob("j1", "a@1", 0.0, 500, 100.0), SharedJob("j2", "b@1", 0.0, 500, 100.0)]


def test_sharers_slow_each_other_as_the_ground_truth_says() -> None:
    result = simulate_sharing("binpack", ONE_GPU, JOBS, PHYSICS, seed=1)
    # Together: a runs at 0.1/s, b at 0.9/s. b ends at 111.1 s having made 100 steps; a has
    # made 11.1 and runs the 88.9 left alone: it ends at 200 s.
    assert result.finished == 2 and result.colocations == 1 and result.slowed_past_cap == 1
    assert result.avg_jct_s == pytest.approx((100 / 0.9 + 100 / 0.9 + 100 - 100 / 9) / 2)
    assert result.makespan_s == pytest.approx(100 / 0.9 + (100 - 100 / 9))


def test_the_interference_plugin_keeps_the_pair_apart_and_both_finish_sooner() -> None:
    table = ColocationTable(1, ("a@1", "b@1"), {"V100": [[0.5, 0.1], [0.9, 0.5]]})
    aware = ProfileOptions(colocation=ColocationBook(table))
    blind = simulate_sharing("binpack", TWO_GPUS, JOBS, PHYSICS, seed=1)
    kept = simulate_sharing("binpack", TWO_GPUS, JOBS, PHYSICS, seed=1, options=aware)
    assert blind.colocations == 1 and kept.colocations == 0
    assert kept.avg_jct_s == pytest.approx(100.0)
    assert kept.avg_jct_s < blind.avg_jct_s
    # On one GPU the second job waits for the first instead of crushing it.
    alone = simulate_sharing("binpack", ONE_GPU, JOBS, PHYSICS, seed=1, options=aware)
    assert alone.colocations == 0 and alone.makespan_s == pytest.approx(200.0)
