"""Throughput prediction: the interface every model shares and the machinery they share.

Runtime, the figure the scheduler plans with, is total steps divided by throughput, so
throughput is what the predictor learns: steps/s of a job on a GPU type and count, with an
interval. The models are in `learned` (`BaselineThroughput`, `LearnedThroughput`) and `ratio`
(`RatioThroughput`); `models.make_model` builds one by name.

All work in log space (errors are relative). Intervals are split-free conformal: the
quantile of absolute log residuals from a cross-validation grouped by (job, GPU type), so a
residual always comes from a pair the model had not seen, which is how predictions are used.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from alnair.predictor.catalog import describe_model
from alnair.predictor.datasets import JobKey, Observation
from alnair.predictor.gpus import GpuSpec, lookup_gpu

ModelKind = Literal["baseline", "rf", "gb", "ratio"]
# anchored: from the job's measurements on other GPU types; on_type: from its measurement on the
# same GPU type at another count (a TrialJob's 1-GPU run); features: job measured nowhere;
# extrapolated: GPU type measured for no job (see `predictor._estimate`).
Basis = Literal["anchored", "on_type", "features", "extrapolated"]
# Half-widths before any calibration (log space).
DEFAULT_HALFWIDTH: dict[Basis, float] = {
    "anchored": math.log(2.0),
    "on_type": math.log(1.5),
    "features": math.log(4.0),
}


@dataclass(frozen=True, slots=True)
class ThroughputQuery:
    """A job on `gpu_count` GPUs of type `gpu`."""

    job: JobKey
    gpu: GpuSpec
    gpu_count: int


@dataclass(frozen=True, slots=True)
class ThroughputEstimate:
    """Predicted steps/s with an interval at the model's nominal level."""

    steps_per_s: float
    low: float
    high: float
    basis: Basis

    @property
    def low_confidence(self) -> bool:
        return self.basis not in ("anchored", "on_type")


class ThroughputModel(Protocol):
    kind: ModelKind

    def fit(self, observations: Sequence[Observation]) -> None: ...

    def predict(self, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]: ...

    def with_observations(self, observations: Sequence[Observation]) -> ThroughputModel:
        """A copy that also reads `observations` as measurements, without refitting."""
        ...


def conformal_halfwidth(abs_residuals: Iterable[float], level: float) -> float:
    """Half-width that covers `level` of exchangeable absolute residuals (finite-sample rank)."""
    values = sorted(abs_residuals)
    if not values:
        return math.log(2.0)
    rank = min(len(values), math.ceil((len(values) + 1) * level))
    return values[rank - 1]


class ObservationTable:
    """Measured log throughputs, by job, with duplicate measurements averaged."""

    def __init__(self, observations: Sequence[Observation]) -> None:
        sums: dict[tuple[JobKey, str, int], list[float]] = defaultdict(list)
        for obs in observations:
            sums[(obs.job, obs.gpu_type, obs.gpu_count)].append(math.log(obs.throughput))
        # fsum / len, not np.mean: this runs for every held-out pair of the evaluation.
        self.log_thr = {key: math.fsum(values) / len(values) for key, values in sums.items()}
        self.by_job: dict[JobKey, list[tuple[str, int, float]]] = defaultdict(list)
        for (job, gpu, count), value in self.log_thr.items():
            self.by_job[job].append((gpu, count, value))
        self.siblings: dict[str, list[JobKey]] = defaultdict(list)
        self.families: dict[str, list[JobKey]] = defaultdict(list)
        for job in self.by_job:
            self.siblings[job.model_name].append(job)
            self.families[describe_model(job.model_name).family].append(job)

    def add_cell(self, job: JobKey, gpu: str, count: int, value: float) -> None:
        """Add one measured (job, GPU, count) log throughput not yet in the table (in place)."""
        if job not in self.by_job:
            self.siblings[job.model_name].append(job)
            self.families[describe_model(job.model_name).family].append(job)
        self.log_thr[(job, gpu, count)] = value
        self.by_job[job].append((gpu, count, value))

    def on_type(self, query: ThroughputQuery) -> list[tuple[int, float]]:
        """(count, log throughput) of the query's job on the query's GPU type, other counts."""
        return [
            (count, value)
            for gpu, count, value in self.by_job.get(query.job, [])
            if gpu == query.gpu.name and count != query.gpu_count
        ]

    def anchors(
        self, query: ThroughputQuery, nearest_only: bool = True, other_types_only: bool = False
    ) -> list[tuple[GpuSpec, int, float]]:
        """Measurements of the query's job that can anchor it.

        Same GPU count preferred, and among those the GPU type closest in FP32 throughput (a
        V100 says more about an A100 than a K80 does; averaging in the far one cost 0.5 points
        of held-out MAPE; the FP32-scaling baseline does better averaging all, so it asks for
        `nearest_only=False`). Equally close anchors are all returned. `other_types_only`
        leaves out the job's measurements on the query's GPU type (the cross-type estimators
        of `ratio` use it; measurements on the same type are its `on_type` estimators').
        """
        found = [
            (lookup_gpu(gpu), count, value)
            for gpu, count, value in self.by_job.get(query.job, [])
            if not (gpu == query.gpu.name and (count == query.gpu_count or other_types_only))
        ]
        pool = [a for a in found if a[1] == query.gpu_count] or found
        if not pool or not nearest_only:
            return pool

        def distance(anchor: tuple[GpuSpec, int, float]) -> float:
            return abs(math.log(anchor[0].fp32_tflops / query.gpu.fp32_tflops))

        nearest = min(distance(a) for a in pool)
        return [a for a in pool if distance(a) == nearest]

    def sibling_ratio(
        self, job: JobKey, target: tuple[str, int], anchor: tuple[str, int]
    ) -> tuple[float, float]:
        """Log throughput ratio target/anchor of the same model at neighbouring batch sizes.

        Interpolated in log batch size between the nearest smaller and larger sibling measured
        on both (the nearest one alone at the edges). Returns (ratio, log batch distance to the
        nearest sibling used), NaNs when no sibling was measured on both.
        """
        points: list[tuple[float, float]] = []
        for sibling in self.siblings.get(job.model_name, []):
            if sibling == job:
                continue
            here = self.log_thr.get((sibling, *target))
            there = self.log_thr.get((sibling, *anchor))
            if here is not None and there is not None:
                points.append((math.log(sibling.batch_size / job.batch_size), here - there))
        if not points:
            return (math.nan, math.nan)
        below = max((p for p in points if p[0] < 0), default=None)
        above = min((p for p in points if p[0] > 0), default=None)
        if below is not None and above is not None:
            weight = -below[0] / (above[0] - below[0])
            ratio = below[1] * (1.0 - weight) + above[1] * weight
            return (ratio, min(-below[0], above[0]))
        nearest = below if below is not None else above
        assert nearest is not None
        return (nearest[1], abs(nearest[0]))

    def family_ratio(self, job: JobKey, target: tuple[str, int], anchor: tuple[str, int]) -> float:
        """Mean log ratio target/anchor over other jobs of the same family (NaN if none)."""
        family = describe_model(job.model_name).family
        values = [
            here - self.log_thr[(other, *anchor)]
            for other in self.families.get(family, [])
            if other != job
            and (here := self.log_thr.get((other, *target))) is not None
            and (other, *anchor) in self.log_thr
        ]
        return float(np.mean(values)) if values else math.nan

    def global_ratio(self, job: JobKey, target: tuple[str, int], anchor: tuple[str, int]) -> float:
        """Median log ratio target/anchor over every other job measured on both (NaN if none)."""
        values = [
            here - there
            for other in self.by_job
            if other != job
            and (here := self.log_thr.get((other, *target))) is not None
            and (there := self.log_thr.get((other, *anchor))) is not None
        ]
        return float(np.median(values)) if values else math.nan

    def elasticity(self, job: JobKey, count: int, exclude_gpu: str) -> float:
        """Slope of log throughput over log FP32 across the job's GPUs (NaN below two GPUs)."""
        points = [
            (math.log(lookup_gpu(gpu).fp32_tflops), value)
            for gpu, c, value in self.by_job.get(job, [])
            if c == count and gpu != exclude_gpu
        ]
        if len(points) < 2:
            return math.nan
        x = np.array([p[0] for p in points])
        y = np.array([p[1] for p in points])
        spread = float(np.sum((x - x.mean()) ** 2))
        if spread == 0.0:
            return math.nan
        return float(np.sum((x - x.mean()) * (y - y.mean())) / spread)


def on_type_folds(
    observations: Sequence[Observation],
) -> list[tuple[list[Observation], list[Observation]]]:
    """Cold-start folds: each (job, GPU type) pair keeps only its smallest-count measurement.

    That one measurement is what a TrialJob gives (one short run on the target type, usually
    on 1 GPU); the pair's other counts are held out and predicted from it plus everything
    else. One fold per pair measured at two counts or more, in a stable order.
    """
    by_pair: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, obs in enumerate(observations):
        by_pair[(str(obs.job), obs.gpu_type)].append(index)
    out = []
    for pair in sorted(by_pair):
        indices = by_pair[pair]
        anchor = min(observations[i].gpu_count for i in indices)
        held = {i for i in indices if observations[i].gpu_count != anchor}
        if not held:
            continue
        train = [o for i, o in enumerate(observations) if i not in held]
        out.append((train, [observations[i] for i in sorted(held)]))
    return out


def linear_scaling_residuals(observations: Sequence[Observation]) -> list[float]:
    """|log error| of scaling each pair's smallest-count measurement linearly to its others."""
    table = ObservationTable(observations)
    smallest: dict[tuple[JobKey, str], tuple[int, float]] = {}
    for (job, gpu, count), value in table.log_thr.items():
        if (job, gpu) not in smallest or count < smallest[(job, gpu)][0]:
            smallest[(job, gpu)] = (count, value)
    out = []
    for (job, gpu, count), value in table.log_thr.items():
        base_count, base = smallest[(job, gpu)]
        if count != base_count:
            out.append(abs(value - base - math.log(count / base_count)))
    return out


def _groups(observations: Sequence[Observation], folds: int) -> list[list[int]]:
    """Indices of observations split into folds by (job, GPU type), deterministically.

    Fold k holds job j on GPU type g when (j + g) % folds == k, so with at least as many folds
    as GPU types a fold takes at most one GPU type from each job: the rest of the job stays in
    training, as it does when a single unseen pair is predicted.
    """
    jobs = {job: i for i, job in enumerate(sorted({str(o.job) for o in observations}))}
    gpus = {gpu: i for i, gpu in enumerate(sorted({o.gpu_type for o in observations}))}
    fold_of = {(job, gpu): (j + g) % folds for job, j in jobs.items() for gpu, g in gpus.items()}
    out: list[list[int]] = [[] for _ in range(folds)]
    for index, obs in enumerate(observations):
        out[fold_of[(str(obs.job), obs.gpu_type)]].append(index)
    return [fold for fold in out if fold]


class CoreModel(Protocol):
    def _fit_core(self, observations: Sequence[Observation]) -> None: ...

    def predict_log(self, queries: Sequence[ThroughputQuery]) -> list[tuple[float, Basis]]: ...


def calibrate_halfwidths(
    observations: Sequence[Observation],
    make: Callable[[], CoreModel],
    folds: int,
    level: float,
) -> dict[Basis, float]:
    """Conformal half-widths from held-out (job, GPU) groups, per prediction basis."""
    residuals: dict[Basis, list[float]] = {"anchored": [], "features": []}
    for held in _groups(observations, folds):
        held_set = set(held)
        train = [o for i, o in enumerate(observations) if i not in held_set]
        if not train:
            continue
        model: CoreModel = make()
        model._fit_core(train)
        tests = [observations[i] for i in held]
        queries = [ThroughputQuery(o.job, lookup_gpu(o.gpu_type), o.gpu_count) for o in tests]
        for obs, (log_pred, basis) in zip(tests, model.predict_log(queries), strict=True):
            residuals[basis].append(abs(math.log(obs.throughput) - log_pred))
    anchored = conformal_halfwidth(residuals["anchored"], level)
    features = (
        conformal_halfwidth(residuals["features"], level)
        if len(residuals["features"]) >= 10
        else max(anchored * 2.0, math.log(3.0))
    )
    return {
        "anchored": anchored,
        "on_type": DEFAULT_HALFWIDTH["on_type"],
        "features": max(features, anchored),
    }


def estimates_from_logs(
    logs: Sequence[tuple[float, Basis]], halfwidth: dict[Basis, float]
) -> list[ThroughputEstimate]:
    return [
        ThroughputEstimate(
            math.exp(value),
            math.exp(value - halfwidth[basis]),
            math.exp(value + halfwidth[basis]),
            basis,
        )
        for value, basis in logs
    ]
