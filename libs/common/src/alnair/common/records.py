"""The execution record: what a finished job was, where it ran and what it used. The profiler's
aggregator writes it to Redis and the predictor learns from it, so this module is the format
both read, in one place:

- hash `alnair:record:<namespace>/<job-name>/<uid>` whose fields are all strings (model_name,
  batch_size, data_size, epoch, gpu_model, gpu_count, submit_ts, start_ts, end_ts,
  duration_s, steps, throughput_steps_per_s, peak_gpu_mem_mib, mean_gpu_util_pct, outcome,
  progress_step, total_steps, checkpoint_step, preemptions; the optional ones, steps,
  throughput, the two usage fields and the progress ones, are left out when unknown);
- sorted set `alnair:records` with score end_ts and the hash key as member.

A record without the usage fields is of a job no sample of which reached the aggregator (it
ran while the node's agent was away): its duration, GPUs and outcome are still facts the
predictor's runtime model learns from, and its memory model skips it.

Writing (exactly once per job uid) is the profiler's `RecordStore`; reading for training is the
predictor's `parse_record`. `tests/unit/common/test_execution_record.py` pairs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

# Progress a workload reports about itself (a training callback writes them on its pod or its
# owner; the sim agent writes the throughput of simulated pods). Records take steps and
# throughput from them.
ANN_STEPS = "alnair.io/steps"
ANN_THROUGHPUT = "alnair.io/throughput-steps-per-s"

RECORD_PREFIX = "alnair:record:"
RECORDS_INDEX = "alnair:records"

Outcome = Literal["succeeded", "failed"]


class ExecutionRecord(BaseModel):
    """One finished job, in the shape the predictor reads."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    job_name: str
    uid: str
    model_name: str = Field(
        description="Model trained, from alnair.io/model-name or the seeds' model_name."
    )
    batch_size: str = Field(default="", description="Batch size annotation, as given.")
    data_size: str = Field(default="", description="Data size annotation, as given.")
    epoch: str = Field(default="", description="Epoch count annotation, as given.")
    gpu_model: str = Field(description="GPU model the job ran on (node label).")
    gpu_count: int = Field(ge=0, description="GPUs the job used.")
    submit_ts: float = Field(description="Job creation, unix seconds.")
    start_ts: float = Field(description="Job start, unix seconds.")
    end_ts: float = Field(description="Job completion or failure, unix seconds.")
    steps: int | None = Field(default=None, description="Training steps, when known.")
    throughput_steps_per_s: float | None = Field(default=None, description="Measured steps/s.")
    peak_gpu_mem_mib: float | None = Field(
        default=None, ge=0, description="Highest memory used on any one GPU (None: unsampled)."
    )
    mean_gpu_util_pct: float | None = Field(
        default=None, ge=0, description="Mean GPU utilization over samples (None: unsampled)."
    )
    outcome: Outcome
    progress_step: int | None = Field(
        default=None, ge=0, description="Last training step the job reported (how far it got)."
    )
    total_steps: int | None = Field(default=None, ge=1, description="Steps of the whole job.")
    checkpoint_step: int | None = Field(
        default=None, ge=0, description="Step of the last checkpoint the job reported."
    )
    preemptions: int = Field(default=0, ge=0, description="Times the queue stopped it.")

    @property
    def key(self) -> str:
        return record_key(self.namespace, self.job_name, self.uid)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end_ts - self.start_ts)

    def to_fields(self) -> dict[str, str]:
        fields = {
            "model_name": self.model_name,
            "batch_size": self.batch_size,
            "data_size": self.data_size,
            "epoch": self.epoch,
            "gpu_model": self.gpu_model,
            "gpu_count": str(self.gpu_count),
            "submit_ts": _num(self.submit_ts),
            "start_ts": _num(self.start_ts),
            "end_ts": _num(self.end_ts),
            "duration_s": _num(self.duration_s),
            "outcome": self.outcome,
        }
        if self.peak_gpu_mem_mib is not None:
            fields["peak_gpu_mem_mib"] = _num(self.peak_gpu_mem_mib)
        if self.mean_gpu_util_pct is not None:
            fields["mean_gpu_util_pct"] = _num(self.mean_gpu_util_pct)
        if self.steps is not None:
            fields["steps"] = str(self.steps)
        if self.throughput_steps_per_s is not None:
            fields["throughput_steps_per_s"] = _num(self.throughput_steps_per_s)
        for name in ("progress_step", "total_steps", "checkpoint_step"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = str(value)
        if self.preemptions:
            fields["preemptions"] = str(self.preemptions)
        return fields

    @staticmethod
    def from_fields(key: str, fields: Mapping[str, str]) -> ExecutionRecord:
        namespace, job_name, uid = parse_record_key(key)
        steps = fields.get("steps")
        throughput = fields.get("throughput_steps_per_s")
        peak = fields.get("peak_gpu_mem_mib")
        util = fields.get("mean_gpu_util_pct")
        return ExecutionRecord(
            namespace=namespace,
            job_name=job_name,
            uid=uid,
            model_name=fields.get("model_name", ""),
            batch_size=fields.get("batch_size", ""),
            data_size=fields.get("data_size", ""),
            epoch=fields.get("epoch", ""),
            gpu_model=fields.get("gpu_model", ""),
            gpu_count=int(fields.get("gpu_count", "0")),
            submit_ts=float(fields.get("submit_ts", "0")),
            start_ts=float(fields.get("start_ts", "0")),
            end_ts=float(fields.get("end_ts", "0")),
            steps=int(steps) if steps else None,
            throughput_steps_per_s=float(throughput) if throughput else None,
            peak_gpu_mem_mib=float(peak) if peak else None,
            mean_gpu_util_pct=float(util) if util else None,
            outcome=cast(Outcome, fields.get("outcome", "failed")),
            progress_step=_int_or_none(fields.get("progress_step")),
            total_steps=_int_or_none(fields.get("total_steps")),
            checkpoint_step=_int_or_none(fields.get("checkpoint_step")),
            preemptions=_int_or_none(fields.get("preemptions")) or 0,
        )


def _int_or_none(raw: str | None) -> int | None:
    return int(raw) if raw else None


def _num(value: float) -> str:
    # repr-like but without exponent noise for typical magnitudes, so the predictor's
    # float() and a human reading redis-cli both get the same number.
    if math.isnan(value):
        return "nan"
    return f"{value:.3f}".rstrip("0").rstrip(".")


class BadRecordKeyError(ValueError):
    """A key that is not `alnair:record:<ns>/<name>/<uid>`."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"not an execution record key: {key!r} (want {RECORD_PREFIX}<ns>/<name>/<uid>)"
        )
        self.key = key


def record_key(namespace: str, job_name: str, uid: str) -> str:
    return f"{RECORD_PREFIX}{namespace}/{job_name}/{uid}"


def parse_record_key(key: str) -> tuple[str, str, str]:
    if not key.startswith(RECORD_PREFIX):
        raise BadRecordKeyError(key)
    parts = key[len(RECORD_PREFIX) :].split("/")
    if len(parts) != 3 or not all(parts):
        raise BadRecordKeyError(key)
    return parts[0], parts[1], parts[2]


def text(value: object) -> str:
    """A Redis reply (bytes or str) as text."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def decode_fields(fields: Mapping[Any, Any]) -> dict[str, str]:
    """A record hash as Redis returns it, with text keys and values."""
    return {text(k): text(v) for k, v in fields.items()}
