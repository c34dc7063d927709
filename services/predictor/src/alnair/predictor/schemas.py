"""Request and reply bodies of the predictor, shared by the HTTP API and NATS `alnair.predict`.

Validation lives here so both transports refuse nonsense the same way: a pydantic error names
the field (`job.batch_size`, `gpu_types.0`), which FastAPI turns into a 422 and the bus into a
400 reply. Job features accept the seeds' annotation names (`model_name`, `data_size`,
`epoch`) as they are, and `from_annotations` reads them from a pod's annotations in either
the seeds' or Alnair's (`alnair.io/model-name`, ...) spelling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alnair.common.annotations import job_model
from alnair.predictor.catalog import DEFAULT_BATCH_SIZE, default_batch_size
from alnair.predictor.gpus import GPU_SPECS, canonical_gpu

DEFAULT_GPU_COUNTS = (1, 2, 4, 8)
# Whether a prediction rests on a measurement of the job on the GPU type asked about.
Confidence = Literal["high", "low"]
HIGH_CONFIDENCE_BASES = frozenset({"measured", "on_type"})


def _gpu_name(value: str) -> str:
    canonical = canonical_gpu(value)
    if canonical is None:
        raise ValueError(f"unknown GPU type {value!r} (known: {', '.join(GPU_SPECS)})")
    return canonical


class JobSpec(BaseModel):
    """What the predictor needs to know about a job."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    model_name: str = Field(min_length=1, max_length=200, description="e.g. resnet50, bert-base")
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        le=1_000_000,
        description="samples per step per GPU; when absent, the model's usual one (1 for A3C "
        "and CycleGAN, as Gavel runs them; else 32)",
    )
    data_size: int | None = Field(
        default=None, ge=1, description="training samples per epoch (with epoch: total steps)"
    )
    epoch: int | None = Field(default=None, ge=1, le=1_000_000, description="epochs to train")
    total_steps: int | None = Field(
        default=None, ge=1, description="total training steps; overrides epoch x data_size"
    )

    @model_validator(mode="before")
    @classmethod
    def _usual_batch(cls, data: Any) -> Any:
        # A job that states no batch size runs with its model's usual one: 32 samples of
        # CycleGAN would be a model Gavel never measured, and 32 times its memory per sample.
        if isinstance(data, dict) and data.get("batch_size") is None and data.get("model_name"):
            model = data["model_name"]
            if isinstance(model, str):
                return {**data, "batch_size": default_batch_size(model)}
        return data

    @field_validator("model_name")
    @classmethod
    def _has_letters(cls, value: str) -> str:
        if not any(c.isalnum() for c in value):
            raise ValueError(f"model name {value!r} has no letters or digits")
        return value

    def steps(self) -> int | None:
        """Total steps: given, or epochs x batches per epoch; None when neither is known."""
        if self.total_steps is not None:
            return self.total_steps
        if self.epoch is not None and self.data_size is not None:
            return self.epoch * math.ceil(self.data_size / self.batch_size)
        return None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> JobSpec:
        """Job features from pod annotations (Alnair's names, or the seeds' bare names)."""
        return cls.model_validate(job_model(annotations).present())


class PredictRequest(BaseModel):
    """A job, and the GPU types and counts to predict it on (default: all known, 1/2/4/8)."""

    model_config = ConfigDict(extra="forbid")

    job: JobSpec
    gpu_types: list[str] | None = Field(default=None, max_length=32)
    gpu_counts: list[int] | None = Field(default=None, max_length=16)

    @field_validator("gpu_types")
    @classmethod
    def _known_gpus(cls, values: list[str] | None) -> list[str] | None:
        if values is None:
            return None
        return list(dict.fromkeys(_gpu_name(v) for v in values))

    @field_validator("gpu_counts")
    @classmethod
    def _counts(cls, values: list[int] | None) -> list[int] | None:
        if values is None:
            return None
        for value in values:
            if not 1 <= value <= 64:
                raise ValueError(f"GPU count {value} is outside 1..64")
        return sorted(set(values))


class Interval(BaseModel):
    low: float
    high: float


class Prediction(BaseModel):
    """The job on `gpu_count` GPUs of `gpu_type`."""

    gpu_type: str
    gpu_count: int
    throughput_steps_per_s: float
    throughput_interval: Interval
    runtime_s: float | None = Field(description="total steps / throughput; null without steps")
    runtime_interval_s: Interval | None
    peak_gpu_mem_mib: float = Field(description="per GPU")
    fits_memory: bool
    low_confidence: bool = Field(description="basis is features or extrapolated")
    basis: str = Field(
        description="measured: this very measurement; on_type: from this job's measurement on "
        "this GPU type at another count (a TrialJob's run), scaled to this count; anchored: "
        "from this job's measurements on other GPU types; features: from its features alone "
        "(job never measured); extrapolated: GPU type never measured, scaled by specification"
    )
    confidence: Confidence = Field(
        description="high: this job was measured on this GPU type (basis measured or on_type); "
        "low: it was not (anchored, features, extrapolated), and one short run of it on this "
        "GPU type (a TrialJob on 1 GPU) would make this prediction high-confidence"
    )


class PredictReply(BaseModel):
    model_version: int
    model_kind: str
    interval_level: float
    job: JobSpec
    known_model: bool = Field(description="the model name was measured somewhere")
    low_confidence: bool = Field(
        description="the model was never measured, or any prediction below is low-confidence"
    )
    confidence: Confidence = Field(
        description="low when any prediction below has confidence low, else high"
    )
    unmeasured_gpu_types: list[str] = Field(
        description="GPU types asked about on which this job (model and batch size) has no "
        "measurement: the candidates for a TrialJob; empty when confidence is high"
    )
    memory_basis: str = Field(description="records, catalog or family (name not in catalog)")
    predictions: list[Prediction]


class ColocationRequest(BaseModel):
    """Two jobs sharing one GPU of `gpu_type`."""

    model_config = ConfigDict(extra="forbid")

    job_a: JobSpec
    job_b: JobSpec
    gpu_type: str

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        return _gpu_name(value)


class ColocatedJob(BaseModel):
    throughput_alone_steps_per_s: float
    throughput_colocated_steps_per_s: float
    slowdown: float = Field(description="alone / co-located throughput (>= about 1)")
    slowdown_interval: Interval
    fits_memory_together: bool


class ColocationReply(BaseModel):
    model_version: int
    model_kind: str
    interval_level: float
    gpu_type: str
    job_a: ColocatedJob
    job_b: ColocatedJob
    low_confidence: bool


class ModelInfoReply(BaseModel):
    """What `GET /v1/models` says about the serving model and its history."""

    version: int
    kind: str
    trained_at: float
    training_size: dict[str, int]
    interval_level: float
    halfwidths: dict[str, float]
    last_evaluation: dict[str, float | int | str | None]
    retraining: bool
    history: list[dict[str, float | int | str | None]]
