"""The predictor proper: a trained bundle of models and the answers it gives.

A `ModelBundle` is immutable once trained: the throughput model, the co-location model, the
memory model, what they were trained on and how they validated. The service holds one bundle
as its current snapshot and swaps in a new one only after it validated (see `retraining`), so
a request always sees one consistent model, never a half-trained one.

`predict` and `colocation` turn a request into figures the scheduler plans with: throughput
and runtime with an interval on every GPU type and count asked for, peak memory per GPU and
whether it fits, and for two jobs on one GPU each one's slowdown. A (job, GPU, count) that was
measured answers with its measurement; others come from the models, flagged low-confidence
when the job was measured nowhere.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alnair.common.colocation import ColocationTable
from alnair.predictor.catalog import normalize_model_name
from alnair.predictor.colocation import ColocationModel, ColocQuery, make_colocation_model
from alnair.predictor.datasets import JobKey, Observation, TrainingData
from alnair.predictor.gpus import GPU_SPECS, lookup_gpu
from alnair.predictor.memory import MemoryModel
from alnair.predictor.models import make_model
from alnair.predictor.schemas import (
    DEFAULT_GPU_COUNTS,
    HIGH_CONFIDENCE_BASES,
    ColocatedJob,
    ColocationReply,
    ColocationRequest,
    Interval,
    JobSpec,
    Prediction,
    PredictReply,
    PredictRequest,
)
from alnair.predictor.throughput import (
    ModelKind,
    ThroughputEstimate,
    ThroughputModel,
    ThroughputQuery,
)


@dataclass(frozen=True)
class Validation:
    """How a candidate bundle fared before it was allowed to serve."""

    accepted: bool
    reason: str
    holdout_records: int = 0
    candidate_mape: float | None = None
    current_mape: float | None = None

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "accepted": str(self.accepted).lower(),
            "reason": self.reason,
            "holdout_records": self.holdout_records,
            "candidate_mape": self.candidate_mape,
            "current_mape": self.current_mape,
        }


@dataclass
class ModelBundle:
    """Everything one model version serves with."""

    kind: ModelKind
    level: float
    throughput: ThroughputModel
    colocation: ColocationModel
    memory: MemoryModel
    measured: dict[tuple[JobKey, str, int], float]
    training_size: dict[str, int]
    trained_at: float
    version: int = 0
    validation: Validation | None = None
    known_models: frozenset[str] = field(default_factory=frozenset)
    measured_gpus: frozenset[str] = field(default_factory=frozenset)
    # Cells measured after training and served without a refit (see `with_measurements`).
    absorbed: frozenset[tuple[JobKey, str, int]] = field(default_factory=frozenset)

    def halfwidths(self) -> dict[str, float]:
        widths = getattr(self.throughput, "halfwidth", {})
        out = {f"throughput_{k}": round(float(v), 4) for k, v in widths.items()}
        out["colocation"] = round(float(getattr(self.colocation, "halfwidth", math.nan)), 4)
        return out


def _measured(observations: Sequence[Observation]) -> dict[tuple[JobKey, str, int], float]:
    logs: dict[tuple[JobKey, str, int], list[float]] = defaultdict(list)
    for obs in observations:
        logs[(obs.job, obs.gpu_type, obs.gpu_count)].append(math.log(obs.throughput))
    return {key: float(np.mean(values)) for key, values in logs.items()}


def train_bundle(
    gavel: TrainingData,
    records: Sequence[Observation],
    kind: ModelKind = "ratio",
    level: float = 0.9,
    calibration_folds: int = 6,
) -> ModelBundle:
    """Fit every model on Gavel's measurements plus the execution records (CPU-bound).

    Six calibration folds: each holds out a sixth of the (job, GPU) pairs, close to the
    single unseen pair a prediction faces, which brought held-out coverage of the nominal 90%
    intervals to 92.7% (three folds, as the time-boxed evaluation uses, give 95.5%).
    """
    alone = [*gavel.alone, *records]
    throughput = make_model(kind, level, calibration_folds)
    throughput.fit(alone)
    colocation = make_colocation_model(kind, level, calibration_folds)
    colocation.fit(gavel.colocated)
    memory = MemoryModel()
    memory.fit(records)
    return ModelBundle(
        kind=kind,
        level=level,
        throughput=throughput,
        colocation=colocation,
        memory=memory,
        measured=_measured(alone),
        training_size={
            "gavel_alone": len(gavel.alone),
            "gavel_colocated": len(gavel.colocated),
            "records": len(records),
        },
        trained_at=time.time(),
        known_models=frozenset(o.job.model_name for o in alone),
        measured_gpus=frozenset(o.gpu_type for o in alone),
    )


def with_measurements(
    bundle: ModelBundle, observations: Sequence[Observation]
) -> ModelBundle | None:
    """The bundle serving also these measurements, without refitting anything; None when each
    of their (job, GPU type, count) cells is measured already.

    This is how a TrialJob's run (or any job's record) of a pair the bundle has not seen
    serves at once: that cell answers with its measurement, and `ratio` anchors the pair's
    other counts on it (`basis: "on_type"`) because it reads its table afresh on every
    prediction. The next retrain learns from the record properly; cells already measured wait
    for it, so absorbing the same record twice changes nothing.
    """
    new = [o for o in observations if (o.job, o.gpu_type, o.gpu_count) not in bundle.measured]
    if not new:
        return None
    cells = _measured(new)
    return dataclasses.replace(
        bundle,
        throughput=bundle.throughput.with_observations(new),
        measured={**bundle.measured, **cells},
        training_size={
            **bundle.training_size,
            "absorbed": bundle.training_size.get("absorbed", 0) + len(new),
        },
        known_models=bundle.known_models | {o.job.model_name for o in new},
        measured_gpus=bundle.measured_gpus | {o.gpu_type for o in new},
        absorbed=bundle.absorbed | set(cells),
    )


def _mape(
    model: ThroughputModel,
    measured: dict[tuple[JobKey, str, int], float],
    observations: Sequence[Observation],
) -> float:
    """MAPE of the answers as the service gives them: a measured key answers with its mean."""
    queries = [ThroughputQuery(o.job, lookup_gpu(o.gpu_type), o.gpu_count) for o in observations]
    errors = []
    for obs, estimate in zip(observations, model.predict(queries), strict=True):
        known = measured.get((obs.job, obs.gpu_type, obs.gpu_count))
        value = math.exp(known) if known is not None else estimate.steps_per_s
        errors.append(abs(value - obs.throughput) / obs.throughput)
    return float(np.mean(errors))


def _sane(model: ThroughputModel, gavel: TrainingData) -> str | None:
    """Why the model's answers on the Gavel grid are unusable, or None when they are fine."""
    jobs = sorted({o.job for o in gavel.alone}, key=str)
    queries = [
        ThroughputQuery(job, spec, count)
        for job in jobs
        for spec in GPU_SPECS.values()
        for count in DEFAULT_GPU_COUNTS
    ]
    for query, estimate in zip(queries, model.predict(queries), strict=True):
        values = (estimate.steps_per_s, estimate.low, estimate.high)
        if not all(math.isfinite(v) and v > 0 for v in values):
            return f"non-finite or non-positive throughput for {query.job} on {query.gpu.name}"
        if not estimate.low <= estimate.steps_per_s <= estimate.high:
            return f"interval does not contain the estimate for {query.job}"
    return None


def validate_candidate(
    gavel: TrainingData,
    records: Sequence[Observation],
    current: ModelBundle | None,
    kind: ModelKind,
    level: float,
    holdout_fraction: float = 0.2,
    tolerance: float = 0.25,
) -> Validation:
    """Train on all but the newest records and compare with the serving model on those.

    The candidate passes when its answers are sane and, given enough records to hold some
    out, its MAPE on the newest ones is within `tolerance` (relative, or 5 points) of the
    serving model's. A serving model may have seen those records already, which favours it;
    the tolerance keeps that from blocking every retrain.
    """
    holdout_n = int(len(records) * holdout_fraction) if len(records) >= 5 else 0
    train_records = list(records[: len(records) - holdout_n])
    holdout = list(records[len(records) - holdout_n :])
    candidate = make_model(kind, level, calibration_folds=0)
    candidate_data = [*gavel.alone, *train_records]
    candidate.fit(candidate_data)
    problem = _sane(candidate, gavel)
    if problem is not None:
        return Validation(False, problem, holdout_n)
    if not holdout:
        return Validation(True, "sane on the Gavel grid; too few records to hold out", 0)
    candidate_mape = _mape(candidate, _measured(candidate_data), holdout)
    if current is None:
        return Validation(True, "no serving model to compare with", holdout_n, candidate_mape)
    # Cells the serving model absorbed without training are no test of it: compare its model.
    current_measured = {k: v for k, v in current.measured.items() if k not in current.absorbed}
    current_mape = _mape(current.throughput, current_measured, holdout)
    limit = max(current_mape * (1.0 + tolerance), current_mape + 0.05)
    if candidate_mape > limit:
        return Validation(
            False,
            f"holdout MAPE {candidate_mape:.3f} exceeds the serving model's "
            f"{current_mape:.3f} by more than the tolerance",
            holdout_n,
            candidate_mape,
            current_mape,
        )
    return Validation(
        True, "holdout MAPE within tolerance", holdout_n, candidate_mape, current_mape
    )


def _job_key(spec: JobSpec) -> JobKey:
    return JobKey(normalize_model_name(spec.model_name), spec.batch_size)


def _estimate(bundle: ModelBundle, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]:
    """Model estimates, extrapolated by specification to GPU types never measured.

    Trees cannot extrapolate: asked about an A100 they answer as for the fastest GPU they saw.
    A GPU type with no measurement at all is therefore predicted on the measured type closest
    in FP32 throughput and scaled by the geometric mean of the FP32 and memory-bandwidth
    ratios (training steps are partly compute-, partly memory-bound), with the features-only
    interval, and flagged as extrapolated.
    """
    if not bundle.measured_gpus:
        return bundle.throughput.predict(queries)
    measured = [lookup_gpu(name) for name in sorted(bundle.measured_gpus)]
    proxies: list[ThroughputQuery] = []
    scales: list[float] = []
    for query in queries:
        if query.gpu.name in bundle.measured_gpus:
            proxies.append(query)
            scales.append(0.0)
            continue
        near = min(measured, key=lambda m: abs(math.log(m.fp32_tflops / query.gpu.fp32_tflops)))
        proxies.append(ThroughputQuery(query.job, near, query.gpu_count))
        scales.append(
            0.5 * math.log(query.gpu.fp32_tflops / near.fp32_tflops)
            + 0.5 * math.log(query.gpu.bandwidth_gbps / near.bandwidth_gbps)
        )
    widths = getattr(bundle.throughput, "halfwidth", {})
    wide = float(widths.get("features", math.log(3.0)))
    out = []
    for query, proxy, scale, estimate in zip(
        queries, proxies, scales, bundle.throughput.predict(proxies), strict=True
    ):
        if proxy is query:
            out.append(estimate)
            continue
        value = estimate.steps_per_s * math.exp(scale)
        out.append(
            ThroughputEstimate(
                value, value * math.exp(-wide), value * math.exp(wide), "extrapolated"
            )
        )
    return out


def _log_throughput(bundle: ModelBundle, job: JobKey, gpu: str, count: int) -> tuple[float, str]:
    measured = bundle.measured.get((job, gpu, count))
    if measured is not None:
        return measured, "measured"
    estimate = _estimate(bundle, [ThroughputQuery(job, lookup_gpu(gpu), count)])[0]
    return math.log(estimate.steps_per_s), estimate.basis


def predict(bundle: ModelBundle, request: PredictRequest) -> PredictReply:
    """Throughput, runtime and peak memory of the job on every GPU type and count asked."""
    job = _job_key(request.job)
    gpu_types = request.gpu_types or list(GPU_SPECS)
    counts = request.gpu_counts or list(DEFAULT_GPU_COUNTS)
    queries = [ThroughputQuery(job, lookup_gpu(g), c) for g in gpu_types for c in counts]
    estimates = _estimate(bundle, queries)
    memory = bundle.memory.predict(job)
    steps = request.job.steps()
    anchored_width = getattr(bundle.throughput, "halfwidth", {}).get("anchored", 0.0)
    predictions = []
    for query, estimate in zip(queries, estimates, strict=True):
        value, low, high = estimate.steps_per_s, estimate.low, estimate.high
        basis: str = estimate.basis
        measured = bundle.measured.get((job, query.gpu.name, query.gpu_count))
        if measured is not None:
            value, basis = math.exp(measured), "measured"
            low, high = value * math.exp(-anchored_width), value * math.exp(anchored_width)
        predictions.append(
            Prediction(
                gpu_type=query.gpu.name,
                gpu_count=query.gpu_count,
                throughput_steps_per_s=round(value, 6),
                throughput_interval=Interval(low=round(low, 6), high=round(high, 6)),
                runtime_s=None if steps is None else round(steps / value, 3),
                runtime_interval_s=None
                if steps is None
                else Interval(low=round(steps / high, 3), high=round(steps / low, 3)),
                peak_gpu_mem_mib=memory.peak_mib,
                fits_memory=memory.peak_mib <= query.gpu.memory_mib,
                low_confidence=basis in ("features", "extrapolated"),
                basis=basis,
                confidence="high" if basis in HIGH_CONFIDENCE_BASES else "low",
            )
        )
    known = job.model_name in bundle.known_models
    unmeasured = list(dict.fromkeys(p.gpu_type for p in predictions if p.confidence == "low"))
    return PredictReply(
        model_version=bundle.version,
        model_kind=bundle.kind,
        interval_level=bundle.level,
        job=request.job,
        known_model=known,
        low_confidence=not known or any(p.low_confidence for p in predictions),
        confidence="low" if unmeasured else "high",
        unmeasured_gpu_types=unmeasured,
        memory_basis=memory.basis,
        predictions=predictions,
    )


def colocation(bundle: ModelBundle, request: ColocationRequest) -> ColocationReply:
    """Each job's slowdown when both share one GPU of the requested type."""
    a, b = _job_key(request.job_a), _job_key(request.job_b)
    gpu = lookup_gpu(request.gpu_type)
    log_a, basis_a = _log_throughput(bundle, a, gpu.name, 1)
    log_b, basis_b = _log_throughput(bundle, b, gpu.name, 1)
    fractions = bundle.colocation.predict(
        [
            ColocQuery(a, b, gpu, 1, log_a, log_b),
            ColocQuery(b, a, gpu, 1, log_b, log_a),
        ]
    )
    memory_together = bundle.memory.predict(a).peak_mib + bundle.memory.predict(b).peak_mib
    fits = memory_together <= gpu.memory_mib

    def side(log_alone: float, fraction: Any) -> ColocatedJob:
        alone = math.exp(log_alone)
        return ColocatedJob(
            throughput_alone_steps_per_s=round(alone, 6),
            throughput_colocated_steps_per_s=round(alone * fraction.fraction, 6),
            slowdown=round(1.0 / fraction.fraction, 4),
            slowdown_interval=Interval(
                low=round(1.0 / fraction.high, 4), high=round(1.0 / fraction.low, 4)
            ),
            fits_memory_together=fits,
        )

    informed = all(f.informed for f in fractions)
    low_confidence = not informed or bool({"features", "extrapolated"} & {basis_a, basis_b})
    return ColocationReply(
        model_version=bundle.version,
        model_kind=bundle.kind,
        interval_level=bundle.level,
        gpu_type=gpu.name,
        job_a=side(log_a, fractions[0]),
        job_b=side(log_b, fractions[1]),
        low_confidence=low_confidence,
    )


TABLE_MAX_WORKLOADS = 64
"""Workloads in the published co-location table: 64 x 64 pairs on seven GPU types is about
200 KB, well inside a NATS message; past it the most measured workloads are kept."""


def colocation_table(
    bundle: ModelBundle, max_workloads: int = TABLE_MAX_WORKLOADS
) -> ColocationTable:
    """Every known workload against every other on every GPU type (`alnair.common.colocation`).

    Known workloads are those measured alone (Gavel's job types and the records' jobs); the
    table's rows are what the binder and the dispatcher read instead of asking per cycle."""
    cells: dict[JobKey, int] = defaultdict(int)
    for job, _gpu, _count in bundle.measured:
        cells[job] += 1
    jobs = sorted(sorted(cells, key=lambda j: (-cells[j], str(j)))[:max_workloads], key=str)
    kept: dict[str, list[list[float]]] = {}
    for gpu_name in GPU_SPECS:
        gpu = lookup_gpu(gpu_name)
        logs = [_log_throughput(bundle, job, gpu_name, 1)[0] for job in jobs]
        queries = [
            ColocQuery(a, b, gpu, 1, logs[i], logs[j])
            for i, a in enumerate(jobs)
            for j, b in enumerate(jobs)
        ]
        fractions = bundle.colocation.predict(queries)
        size = len(jobs)
        kept[gpu_name] = [
            [max(0.005, min(1.0, fractions[i * size + j].fraction)) for j in range(size)]
            for i in range(size)
        ]
    return ColocationTable(bundle.version, tuple(str(j) for j in jobs), kept)
