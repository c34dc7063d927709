"""The trace simulator on a small synthetic trace: the paper's tuning protocol, the allocation
curve, and the `alnair simulate` command-line contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.simulator import cli
from alnair.scheduler.simulator.engine import alloc_by_demand, simulate
from alnair.scheduler.simulator.trace import load_nodes, load_pods, tune_and_shuffle

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,32000,131072,4,V100M32
node-1,32000,131072,4,T4
node-2,16000,65536,2,P100
node-3,16000,65536,0,
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
pod-0,4000,8192,1,1000,,LS,Running,0,10,0
pod-1,2000,4096,1,500,,LS,Running,0,10,0
pod-2,2000,4096,1,250,T4,LS,Running,0,10,0
pod-3,8000,16384,2,1000,V100M32,LS,Running,0,10,0
pod-4,1000,2048,0,0,,BE,Running,0,10,0
"""


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_loading_keeps_the_trace_columns(trace: tuple[Path, Path]) -> None:
    nodes = load_nodes(trace[0])
    pods = load_pods(trace[1])
    assert [n.gpu_count for n in nodes] == [4, 4, 2, 0]
    assert nodes[3].gpu_model == ""
    assert pods[2].gpu_models == frozenset({"T4"})
    assert pods[1].is_fractional
    assert pods[4].num_gpu == 0
    assert pods[4].gpu_models == frozenset()


@pytest.mark.parametrize("tune", [0.5, 1.3, 3.0])
def test_tuning_reaches_the_target_without_passing_it(
    trace: tuple[Path, Path], tune: float
) -> None:
    pods = load_pods(trace[1])
    capacity = 10_000
    workload = tune_and_shuffle(pods, capacity, tune, np.random.default_rng(3), 3)
    demand = workload.demand_milli
    assert demand <= tune * capacity
    largest = max(p.total_milli_gpu for p in pods)
    assert demand > tune * capacity - largest
    assert len({p.name for p in workload.pods}) == len(workload.pods)


def test_same_seed_same_replay(trace: tuple[Path, Path]) -> None:
    first = simulate("FGD", *trace, seed=5)
    again = simulate("FGD", *trace, seed=5)
    assert first.alloc_pct_by_demand == again.alloc_pct_by_demand
    assert first.total_milli_gpu == 10_000


def test_allocation_never_exceeds_arrived_demand(trace: tuple[Path, Path]) -> None:
    result = simulate("alnair", *trace, seed=1)
    assert np.all(result.alloc_pct <= result.demand_pct + 1e-9)
    assert np.all(np.diff(result.demand_pct) >= 0)
    points = result.alloc_pct_by_demand
    keys = [int(k) for k in points]
    assert keys == list(range(1, round(result.demand_pct[-1]) + 1))
    assert keys[-1] > 110  # tuned to 130% of 10 GPUs, short by less than the largest pod
    assert all(points[str(p)] <= p + 1e-9 for p in keys)


def test_alloc_by_demand_reads_the_last_point_at_or_below_each_percent() -> None:
    demand = np.array([0.0, 0.6, 1.0, 2.5, 3.0])
    alloc = np.array([0.0, 0.6, 0.9, 2.0, 2.1])
    assert alloc_by_demand(demand, alloc, 3) == {"1": 0.9, "2": 0.9, "3": 2.1}


def test_cli_json_contract(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    code = cli.main(
        [
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "BestFit",
            "--seed",
            "42",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "BestFit"
    assert out["seed"] == 42
    assert out["total_milli_gpu"] == 10_000
    assert set(out["alloc_pct_by_demand"]) >= {"50", "100", "130"}


def test_cli_compares_policies_and_writes_a_plot(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    chart = tmp_path / "cmp.png"
    code = cli.main(
        [
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "FGD",
            "alnair",
            "--seed",
            "1-2",
            "--json",
            "--plot",
            str(chart),
            "--workers",
            "1",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 4
    assert set(out["mean_alloc_pct_by_demand"]) == {"FGD", "alnair"}
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_cli_names_the_bad_value(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--policy", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert cli.main(["--nodes", str(nodes), "--pods", "missing.csv"]) == 2
    assert "missing.csv" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seeds"), [("42", [42]), ("42-45", [42, 43, 44, 45]), ("1,3", [1, 3])]
)
def test_seed_ranges(text: str, seeds: list[int]) -> None:
    assert cli.parse_seeds(text) == seeds


def test_bad_seed_range_is_named() -> None:
    with pytest.raises(InvalidValueError, match="seed"):
        cli.parse_seeds("51-42")
