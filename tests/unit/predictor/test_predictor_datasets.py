"""Gavel data and execution records become observations, and bad records say why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alnair.predictor.datasets import (
    JobKey,
    Observation,
    RecordProblem,
    convert_gavel_json,
    gavel_job_key,
    load_gavel,
    parse_record,
    steps_of,
)


def test_gavel_job_types() -> None:
    assert gavel_job_key("ResNet-18 (batch size 16)") == JobKey("resnet18", 16)
    assert gavel_job_key("Recommendation (batch size 8192)") == JobKey("recommendation", 8192)
    assert gavel_job_key("A3C") == JobKey("a3c", 1)


def test_packaged_gavel_data() -> None:
    data = load_gavel()
    jobs = {o.job for o in data.alone}
    assert len(jobs) == 26
    assert {o.gpu_type for o in data.alone} == {"K80", "P100", "V100"}
    assert {o.gpu_count for o in data.alone} == {1, 2, 4, 8}
    # ResNet-50 at batch 128 did not fit a K80: a zero, dropped rather than learned.
    assert not any(o.job == JobKey("resnet50", 128) and o.gpu_type == "K80" for o in data.alone)
    assert all(o.throughput > 0 for o in data.alone)
    assert len(data.colocated) > 1000
    assert all(0 < c.fraction <= 1.05 for c in data.colocated)


def test_conversion_of_gavels_own_json(tmp_path: Path) -> None:
    raw = {
        gpu: {
            "('ResNet-18 (batch size 16)', 1)": {
                "null": 10.0,
                "('LM (batch size 5)', 1)": [4.0, 20.0],
                "('A3C', 1)": [0.0, 0.0],
            },
            "('LM (batch size 5)', 1)": {"null": 40.0},
        }
        for gpu in ("k80", "p100", "v100")
    }
    path = tmp_path / "throughputs.json"
    path.write_text(json.dumps(raw))
    data = load_gavel(path)
    assert len(data.alone) == 6
    (pair,) = [c for c in data.colocated if c.gpu_type == "V100"]
    assert pair.partner == JobKey("lm", 5)
    assert pair.fraction == pytest.approx(0.4)
    assert convert_gavel_json(json.dumps(raw)).startswith("gpu,job,scale")


def record(**over: str) -> dict[str, str]:
    fields = {
        "model_name": "ResNet-50",
        "batch_size": "64",
        "data_size": "",
        "epoch": "",
        "gpu_model": "Tesla-V100-SXM2-16GB",
        "gpu_count": "2",
        "submit_ts": "1000",
        "start_ts": "1010",
        "end_ts": "1110",
        "duration_s": "100",
        "peak_gpu_mem_mib": "7000",
        "mean_gpu_util_pct": "80",
        "outcome": "succeeded",
        "steps": "1200",
    }
    fields.update(over)
    return fields


def test_record_with_steps_and_duration() -> None:
    obs = parse_record("alnair:record:ml/a/1", record())
    assert isinstance(obs, Observation)
    assert obs.job == JobKey("resnet50", 64)
    assert obs.gpu_type == "V100"
    assert obs.gpu_count == 2
    assert obs.throughput == pytest.approx(12.0)
    assert obs.peak_gpu_mem_mib == 7000.0


def test_record_prefers_measured_throughput_then_epochs() -> None:
    measured = parse_record("k", record(throughput_steps_per_s="15.5"))
    assert isinstance(measured, Observation)
    assert measured.throughput == 15.5
    from_epochs = parse_record("k", record(steps="", epoch="2", data_size="6400"))
    assert isinstance(from_epochs, Observation)
    assert from_epochs.throughput == pytest.approx(2 * 100 / 100)


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"outcome": "failed"}, "outcome"),
        ({"model_name": ""}, "model_name"),
        ({"gpu_model": "G3"}, "gpu_model"),
        ({"batch_size": "lots"}, "batch_size"),
        ({"batch_size": "0"}, "batch_size"),
        ({"gpu_count": "nan"}, "gpu_count"),
        ({"steps": "", "duration_s": "100"}, "throughput_steps_per_s"),
        ({"throughput_steps_per_s": "-3"}, "throughput_steps_per_s"),
    ],
)
def test_bad_records_name_their_field(over: dict[str, str], field: str) -> None:
    problem = parse_record("alnair:record:ml/a/1", record(**over))
    assert isinstance(problem, RecordProblem)
    assert problem.field == field
    assert problem.key == "alnair:record:ml/a/1"


def test_steps_from_epochs() -> None:
    assert steps_of(3, 1000, 64) == 3 * 16
    assert steps_of(None, 1000, 64) is None


def test_a_record_without_a_batch_size_is_its_models_usual_one() -> None:
    fields = {k: v for k, v in record().items() if k != "batch_size"}
    cyclegan = parse_record("k", fields | {"model_name": "CycleGAN"})
    resnet = parse_record("k", fields)
    assert isinstance(cyclegan, Observation) and isinstance(resnet, Observation)
    assert (cyclegan.job, resnet.job) == (JobKey("cyclegan", 1), JobKey("resnet50", 32))
