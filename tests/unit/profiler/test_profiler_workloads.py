"""Sim workload model: Gavel lookups and measured co-location slowdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alnair.profiler.workloads import (
    JobType,
    ThroughputTable,
    gpu_type_of,
    parse_job_type,
)


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.load()


def test_gavel_json_and_shipped_csv_give_the_same_table(tmp_path: Path) -> None:
    r18, r50 = "ResNet-18 (batch size 16)", "ResNet-50 (batch size 64)"
    raw = {
        "v100": {
            str((r18, 1)): {"null": 10.0, str((r50, 1)): [6.0, 2.0]},
            str((r50, 1)): {"null": 4.0, str((r18, 1)): [2.0, 6.0]},
            str((r50, 2)): {"null": 7.5},
        },
        "v100_unconsolidated": {str((r50, 2)): {"null": 1.0}},
    }
    as_json = tmp_path / "throughputs.json"
    as_json.write_text(json.dumps(raw))
    as_csv = tmp_path / "throughputs.csv"
    as_csv.write_text(
        "gpu,job,scale,partner,partner_scale,own,partner_own\n"
        f"v100,{r18},1,,,10.0,\nv100,{r18},1,{r50},1,6.0,2.0\n"
        f"v100,{r50},1,,,4.0,\nv100,{r50},1,{r18},1,2.0,6.0\nv100,{r50},2,,,7.5,\n"
    )
    for t in (ThroughputTable.load(as_json), ThroughputTable.load(as_csv)):
        r50_type, r18_type = JobType("ResNet-50", 64), JobType("ResNet-18", 16)
        assert t.throughput(r50_type, "Tesla V100", 2) == 7.5  # consolidated, not 1.0
        assert t.slowdown(r18_type, [r50_type], "V100") == pytest.approx(0.6)
        assert t.slowdown(r50_type, [r18_type], "V100") == pytest.approx(0.5)


def test_parse_job_type() -> None:
    assert parse_job_type("ResNet-50 (batch size 64)") == JobType("ResNet-50", 64)
    assert parse_job_type("A3C") == JobType("A3C", None)


def test_gpu_type_mapping() -> None:
    assert gpu_type_of("V100M32") == "v100"
    assert gpu_type_of("Tesla-K80") == "k80"
    assert gpu_type_of("A100") == "v100"  # unmeasured: borrows V100


def test_resolve_nearest_batch_size_case_insensitive(table: ThroughputTable) -> None:
    assert table.resolve("resnet-50", 100) == JobType("ResNet-50", 128)
    assert table.resolve("ResNet-50 (batch size 32)", None) == JobType("ResNet-50", 32)
    assert table.resolve("CycleGAN", 8) == JobType("CycleGAN", None)
    assert table.resolve("MyNewModel", 8) == JobType("MyNewModel", 8)


def test_measured_throughput_and_slowdown(table: ThroughputTable) -> None:
    r50 = JobType("ResNet-50", 64)
    r18 = JobType("ResNet-18", 16)
    # Values straight from Gavel's throughputs.json (v100, alone and paired with ResNet-18 bs16).
    assert table.throughput(r50, "V100M32") == pytest.approx(4.525762041224065)
    assert table.slowdown(r50, [r18], "V100M32") == pytest.approx(
        4.0687113803879855 / 4.525762041224065
    )
    assert table.slowdown(r50, [], "V100M32") == 1.0
    # Three on one GPU: pairwise factors multiply, so it is slower than with one neighbour.
    assert table.slowdown(r50, [r18, r18], "V100M32") < table.slowdown(r50, [r18], "V100M32")
    # An unmeasured pair falls back to an even split.
    assert table.slowdown(JobType("Unknown", 1), [r18], "V100M32") == 0.5
