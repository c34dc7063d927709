"""The execution record is one format with a writer (the profiler's aggregator) and a reader
(the predictor's training data): what one writes, the other reads back, field for field."""

from __future__ import annotations

import pytest

from alnair.common.records import (
    RECORD_PREFIX,
    BadRecordKeyError,
    ExecutionRecord,
    decode_fields,
    parse_record_key,
    record_key,
)
from alnair.predictor.datasets import Observation, RecordProblem, parse_record


def _record(**overrides: object) -> ExecutionRecord:
    fields: dict[str, object] = {
        "namespace": "team-a",
        "job_name": "resnet",
        "uid": "1f2e",
        "model_name": "ResNet-50",
        "batch_size": "64",
        "data_size": "1281167",
        "epoch": "2",
        "gpu_model": "V100",
        "gpu_count": 2,
        "submit_ts": 1000.0,
        "start_ts": 1010.25,
        "end_ts": 1610.25,
        "steps": 3000,
        "throughput_steps_per_s": 5.0,
        "peak_gpu_mem_mib": 14123.5,
        "mean_gpu_util_pct": 87.25,
        "outcome": "succeeded",
    }
    fields.update(overrides)
    return ExecutionRecord.model_validate(fields)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"steps": None, "throughput_steps_per_s": None},
        {"peak_gpu_mem_mib": None, "mean_gpu_util_pct": None},
        {"outcome": "failed", "batch_size": "", "epoch": ""},
    ],
    ids=["complete", "no-progress", "unsampled", "failed"],
)
def test_a_record_reads_back_as_written(overrides: dict[str, object]) -> None:
    record = _record(**overrides)
    fields = record.to_fields()
    assert all(isinstance(v, str) for v in fields.values())
    # Redis hands back bytes; the shared decoder makes them the written strings again.
    raw = {k.encode(): v.encode() for k, v in fields.items()}
    assert ExecutionRecord.from_fields(record.key, decode_fields(raw)) == record
    # Unknown optional fields are left out, not written as empty strings.
    for name in ("steps", "throughput_steps_per_s", "peak_gpu_mem_mib", "mean_gpu_util_pct"):
        assert (name in fields) == (getattr(record, name) is not None)


def test_the_predictor_learns_what_the_profiler_writes() -> None:
    record = _record()
    seen = parse_record(record.key, record.to_fields())
    assert isinstance(seen, Observation)
    assert (seen.gpu_type, seen.gpu_count, seen.job.batch_size) == ("V100", 2, 64)
    assert seen.throughput == pytest.approx(5.0)
    assert seen.peak_gpu_mem_mib == pytest.approx(14123.5)


def test_without_a_measured_throughput_the_predictor_derives_it_from_steps_and_duration() -> None:
    record = _record(throughput_steps_per_s=None)
    seen = parse_record(record.key, record.to_fields())
    assert isinstance(seen, Observation)
    assert seen.throughput == pytest.approx(3000 / 600.0)


def test_a_failed_run_is_refused_by_the_predictor_with_its_reason() -> None:
    record = _record(outcome="failed")
    seen = parse_record(record.key, record.to_fields())
    assert isinstance(seen, RecordProblem)
    assert seen.field == "outcome" and "failed" in seen.reason


def test_record_keys_name_the_job_and_refuse_anything_else() -> None:
    key = record_key("team-a", "resnet", "1f2e")
    assert key == f"{RECORD_PREFIX}team-a/resnet/1f2e"
    assert parse_record_key(key) == ("team-a", "resnet", "1f2e")
    for bad in ("alnair:record:team-a/resnet", "other:team-a/resnet/1f2e", f"{RECORD_PREFIX}a//c"):
        with pytest.raises(BadRecordKeyError, match="not an execution record key"):
            parse_record_key(bad)
