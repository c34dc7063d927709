"""Sim workload model: Gavel lookups and measured co-location slowdown."""

from __future__ import annotations

import pytest

from alnair.profiler.workloads import (
    DEFAULT_GAVEL_PATH,
    JobType,
    ThroughputTable,
    gpu_type_of,
    parse_job_type,
)

pytestmark = pytest.mark.skipif(
    not DEFAULT_GAVEL_PATH.exists(), reason=f"Gavel data not at {DEFAULT_GAVEL_PATH}"
)


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.load(DEFAULT_GAVEL_PATH)


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
