"""`bench/placement.py --table`'s paired statistics: a policy against FGD seed by seed, and on how
many seeds it is at or above FGD (the figure the issue-18 note's variant table reports)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from alnair.scheduler.simulator.engine import RunResult

BENCH = Path(__file__).resolve().parents[3] / "bench" / "placement.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_placement", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(policy: str, seed: int, at_100: float) -> RunResult:
    return RunResult(
        policy=policy,
        seed=seed,
        nodes_file="nodes.csv",
        pods_file="pods.csv",
        tune=1.3,
        total_milli_gpu=8000,
        pods=10,
        placed=10,
        demand_pct=np.zeros(1),
        alloc_pct=np.zeros(1),
        wall_s=1.0,
        alloc_pct_by_demand={"100": at_100},
    )


def test_paired_difference_counts_seeds_at_or_above_fgd(bench: ModuleType) -> None:
    fgd = {42: run("FGD", 42, 91.0), 43: run("FGD", 43, 91.5), 44: run("FGD", 44, 90.0)}
    ours = {42: run("alnair", 42, 91.2), 43: run("alnair", 43, 91.4), 44: run("alnair", 44, 90.0)}

    paired = bench._paired(ours, fgd, [42, 43, 44], "100")

    assert paired["seeds_at_or_above"] == 2  # +0.2 and a tie count, -0.1 does not
    assert paired["min"] == pytest.approx(-0.1)
    assert paired["max"] == pytest.approx(0.2)
    assert paired["mean"] == pytest.approx(0.1 / 3, abs=1e-3)


def test_paired_difference_pairs_by_seed_not_by_order(bench: ModuleType) -> None:
    fgd = {42: run("FGD", 42, 90.0), 43: run("FGD", 43, 95.0)}
    ours = {43: run("alnair", 43, 95.0), 42: run("alnair", 42, 89.0)}

    paired = bench._paired(ours, fgd, [42, 43], "100")

    assert paired["seeds_at_or_above"] == 1
    assert paired["min"] == pytest.approx(-1.0)
    assert paired["max"] == pytest.approx(0.0)
