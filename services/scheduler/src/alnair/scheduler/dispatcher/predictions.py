"""The dispatcher's view of the predictor: runtime and peak memory per GPU model, or a reason.

The predictor answers over NATS request-reply (`alnair.predict`). Its answer is validated here
field by field (positive, finite runtimes; an interval whose upper end is not below the
estimate; a known GPU type), because a wrong number admits a job that will OOM or overtakes a
reservation: a malformed or missing answer makes the job wait with reason `prediction`, never
admits it blindly. Answers are cached per (job features, GPU count, GPU models) until the
predictor publishes a new model version (a completed job retrains it), so a reconcile costs no
request for jobs already asked about.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alnair.common.bus import Bus
from alnair.scheduler.queueing.model import RuntimeEstimate

log = logging.getLogger(__name__)


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_name: str
    batch_size: int | None = None
    data_size: int | None = None
    epoch: int | None = None


class _Request(BaseModel):
    job: _Job
    gpu_types: list[str]
    gpu_counts: list[int]


class _Interval(BaseModel):
    low: float
    high: float


class _Prediction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(ge=1)
    runtime_s: float | None
    runtime_interval_s: _Interval | None
    peak_gpu_mem_mib: float = Field(ge=0)
    low_confidence: bool

    @field_validator("runtime_s", "peak_gpu_mem_mib")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return value


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_version: int
    low_confidence: bool
    confidence: Literal["high", "low"] | None = None
    unmeasured_gpu_types: list[str] = Field(default_factory=list)
    predictions: list[_Prediction]


class PredictionError(Exception):
    """No usable prediction; the message says why (shown to the user as the wait reason)."""


@dataclass(frozen=True, slots=True)
class JobPrediction:
    """Per GPU model (the node label value): runtime estimate, peak memory per GPU."""

    runtime: Mapping[str, RuntimeEstimate]
    peak_memory_mib: float | None
    low_confidence: bool
    model_version: int
    unmeasured_models: tuple[str, ...] = ()
    """GPU models (node label values) where the job was never measured: a 1-GPU trial run
    there would make the prediction high-confidence."""

    @property
    def needs_trial(self) -> bool:
        return bool(self.unmeasured_models)


def canonical_match(model_label: str, predicted_types: Sequence[str]) -> str | None:
    """Which predicted type a node's GPU model label is (`V100M32` -> `V100`): the longest
    predicted name the label contains, so that `A100` is not read as `A10`."""
    upper = model_label.upper().replace("-", "").replace(" ", "")
    for name in sorted(predicted_types, key=len, reverse=True):
        if name.upper() in upper:
            return name
    return None


def _features(features: Mapping[str, str]) -> _Job:
    try:
        return _Job.model_validate(
            {
                k: features[k]
                for k in ("model_name", "batch_size", "data_size", "epoch")
                if k in features
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise PredictionError(
            f"annotation {field}={first.get('input')!r}: {first['msg']}"
        ) from None


def to_prediction(reply_doc: Any, gpus: int, models: Sequence[str]) -> JobPrediction:
    """Validate a predictor reply and map it onto the cluster's GPU models."""
    try:
        reply = _Reply.model_validate(reply_doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PredictionError(f"malformed predictor answer at {where}: {first['msg']}") from None
    by_type = {p.gpu_type: p for p in reply.predictions if p.gpu_count == gpus}
    runtime: dict[str, RuntimeEstimate] = {}
    peaks: list[float] = []
    for model in models:
        match = canonical_match(model, list(by_type))
        if match is None:
            continue
        p = by_type[match]
        peaks.append(p.peak_gpu_mem_mib)
        if p.runtime_s is None:
            continue
        if p.runtime_s <= 0:
            raise PredictionError(f"predictor answered runtime {p.runtime_s} s on {model}")
        upper = p.runtime_interval_s.high if p.runtime_interval_s else p.runtime_s
        runtime[model] = RuntimeEstimate(p.runtime_s, max(upper, p.runtime_s))
    if not peaks:
        raise PredictionError(f"predictor answered for none of the GPU models {list(models)}")
    unmeasured = tuple(
        m for m in models if canonical_match(m, reply.unmeasured_gpu_types) is not None
    )
    return JobPrediction(
        runtime=runtime,
        peak_memory_mib=max(peaks),
        low_confidence=reply.low_confidence or reply.confidence == "low",
        model_version=reply.model_version,
        unmeasured_models=unmeasured,
    )


class PredictorClient:
    """Asks the predictor, validates, caches until the model version changes.

    A reconcile asks for every waiting workload at once, and hundreds of them share a few
    dozen (features, GPUs, models) keys: one request per key is in flight, the others wait for
    its answer; at most `max_in_flight` requests are out at a time, so a burst queues here, not
    in the predictor where the requests would time out while waiting. A low-confidence answer
    (the predictor may absorb a measurement without a new model version) is reused for
    `low_confidence_s` before it is asked again."""

    def __init__(
        self,
        bus: Bus,
        subject: str,
        timeout_s: float,
        *,
        max_in_flight: int = 16,
        low_confidence_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self.timeout_s = timeout_s
        self.low_confidence_s = low_confidence_s
        self.clock = clock
        self._cache: dict[tuple[Any, ...], JobPrediction] = {}
        self._recent: dict[tuple[Any, ...], tuple[float, JobPrediction]] = {}
        """Low-confidence answers and when they were received."""
        self._asking: dict[tuple[Any, ...], asyncio.Future[JobPrediction]] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self.model_version: int | None = None

    def invalidate(self) -> None:
        """Forget every answer (a new model was trained)."""
        self._cache.clear()
        self._recent.clear()

    async def predict(
        self, features: Mapping[str, str], gpus: int, models: Sequence[str]
    ) -> JobPrediction:
        job = _features(features)
        key = (tuple(sorted(job.model_dump(exclude_none=True).items())), gpus, tuple(models))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        recent = self._recent.get(key)
        if recent is not None and self.clock() - recent[0] < self.low_confidence_s:
            return recent[1]
        asking = self._asking.get(key)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[JobPrediction] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        try:
            prediction = await self._ask(
                key,
                _Request(job=job, gpu_types=_predictable(models), gpu_counts=[gpus]),
                gpus,
                models,
            )
        except BaseException as exc:
            # Every waiter gets an answer, whatever ended this request (a cancellation of the
            # caller that asked is no reason for the others to be cancelled).
            told = exc if isinstance(exc, PredictionError) else PredictionError(
                f"the request ended: {exc!r}")  # fmt: skip
            future.set_exception(told)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            future.set_result(prediction)
            return prediction
        finally:
            del self._asking[key]

    async def _ask(
        self, key: tuple[Any, ...], request: _Request, gpus: int, models: Sequence[str]
    ) -> JobPrediction:
        async with self._slots:
            try:
                msg = await self.bus.nc.request(
                    self.subject,
                    request.model_dump_json(exclude_none=True).encode(),
                    timeout=self.timeout_s,
                )
            except TimeoutError as exc:
                raise PredictionError(
                    f"predictor did not answer within {self.timeout_s} s"
                ) from exc
            except Exception as exc:
                raise PredictionError(f"predictor unreachable: {exc!r}") from exc
        try:
            doc = json.loads(msg.data)
        except ValueError:
            raise PredictionError("predictor answer is not JSON") from None
        if isinstance(doc, dict) and "error" in doc:
            raise PredictionError(f"predictor refused the request: {doc['error']}")
        prediction = to_prediction(doc, gpus, models)
        if self.model_version is not None and prediction.model_version != self.model_version:
            self.invalidate()
        self.model_version = prediction.model_version
        if prediction.low_confidence:
            # A low-confidence answer may be superseded by a measurement the predictor has
            # not absorbed yet (a trial that just completed): asked again after a while.
            self._recent[key] = (self.clock(), prediction)
        else:
            self._cache[key] = prediction
        return prediction


def _predictable(models: Sequence[str]) -> list[str]:
    """GPU model labels as the predictor names them (it canonicalises `V100M32` itself, but
    refuses names it does not know, so unknown ones are dropped from the request)."""
    known = ("K80", "P100", "T4", "V100", "A10", "A100", "H100")
    out: list[str] = []
    for model in models:
        match = canonical_match(model, known)
        if match is not None and match not in out:
            out.append(match)
    return out
