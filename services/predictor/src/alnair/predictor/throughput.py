"""Throughput models: steps/s of a job on a GPU type and count, with an interval.

Runtime, the figure the scheduler plans with, is total steps divided by throughput, so
throughput is what the predictor learns. Three models share one interface:

- `BaselineThroughput`: the honest simple reference. It takes the job's own measurement on
  another GPU and scales it by the ratio of FP32 throughput (and linearly by GPU count); a job
  never measured gets its family's median throughput per TFLOP.
- `LearnedThroughput("rf" | "gb")`: a random forest or gradient-boosted trees. A job measured
  somewhere ("anchored") is predicted as its measurement on an anchor GPU/count times a learned
  log-ratio, whose features are the two GPUs' specifications, the counts, the model family,
  batch size and size, and how strongly this job's speed followed FP32 throughput on the GPUs
  it was measured on. Learning ratios rather than absolute speeds is what lets the few
  measured GPU types inform the others. A job measured nowhere gets a features-only model
  and is flagged low-confidence.

All work in log space (errors are relative). Intervals are split-free conformal: the
quantile of absolute log residuals from a cross-validation grouped by (job, GPU type), so a
residual always comes from a pair the model had not seen, which is how predictions are used.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor

from alnair.predictor.catalog import describe_model
from alnair.predictor.compute import single_threaded
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


class _Table:
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


@lru_cache(maxsize=4096)
def _job_features(job: JobKey) -> tuple[float, ...]:
    info = describe_model(job.model_name)
    return (*info.features(), math.log(job.batch_size))


def _cold_row(query: ThroughputQuery) -> list[float]:
    return [*_job_features(query.job), *query.gpu.features(), math.log(query.gpu_count)]


def _transfer_row(
    table: _Table,
    query: ThroughputQuery,
    anchor_gpu: GpuSpec,
    anchor_count: int,
    anchor_log: float,
    slope: float,
) -> list[float]:
    target, source = query.gpu.features(), anchor_gpu.features()
    target_key = (query.gpu.name, query.gpu_count)
    anchor_key = (anchor_gpu.name, anchor_count)
    sibling, distance = table.sibling_ratio(query.job, target_key, anchor_key)
    family = table.family_ratio(query.job, target_key, anchor_key)
    overall = table.global_ratio(query.job, target_key, anchor_key)
    return [
        0.0 if math.isnan(sibling) else sibling,
        0.0 if math.isnan(sibling) else 1.0,
        3.0 if math.isnan(distance) else distance,
        0.0 if math.isnan(family) else family,
        0.0 if math.isnan(family) else 1.0,
        0.0 if math.isnan(overall) else overall,
        0.0 if math.isnan(overall) else 1.0,
        *_job_features(query.job),
        *target,
        *(t - s for t, s in zip(target, source, strict=True)),
        math.log(query.gpu_count),
        math.log(query.gpu_count / anchor_count),
        anchor_log,
        0.0 if math.isnan(slope) else slope,
        0.0 if math.isnan(slope) else 1.0,
    ]


def _prior_ratio(
    row: Sequence[float], query: ThroughputQuery, anchor_gpu: GpuSpec, anchor_count: int
) -> float:
    """The log ratio target/anchor the trees correct rather than learn from scratch.

    The same model at the neighbouring batch sizes moved between these two GPUs (and counts)
    by this much; failing that, its family did; failing that, the median job did; failing
    that, FP32 throughput and count scale it. With a few hundred measurements, learning
    corrections to this prior beats learning the ratio itself (held-out MAPE 18% -> 16%).
    """
    if row[1] > 0:
        return row[0]
    if row[4] > 0:
        return row[3]
    if row[6] > 0:
        return row[5]
    return math.log(query.gpu.fp32_tflops / anchor_gpu.fp32_tflops) + math.log(
        query.gpu_count / anchor_count
    )


def _regressor(kind: ModelKind, seed: int) -> RandomForestRegressor | HistGradientBoostingRegressor:
    if kind == "rf":
        return RandomForestRegressor(
            n_estimators=60, min_samples_leaf=2, max_features=0.6, random_state=seed, n_jobs=1
        )
    return HistGradientBoostingRegressor(
        max_iter=100,
        learning_rate=0.12,
        max_leaf_nodes=15,
        min_samples_leaf=5,
        max_bins=63,
        random_state=seed,
    )


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
    table = _Table(observations)
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


class BaselineThroughput:
    """Measured throughput elsewhere, scaled by FP32 TFLOPS and GPU count.

    A job measured on the asked GPU type at another count (a TrialJob's run) is scaled from
    that measurement linearly in GPU count: the simple answer to the cold-start question.
    """

    kind: ModelKind = "baseline"

    def __init__(self, level: float = 0.9, calibration_folds: int = 4) -> None:
        self.level = level
        self.calibration_folds = calibration_folds
        self._observations: Sequence[Observation] = ()
        self._table = _Table([])
        self._family_log_per_tflop: dict[str, float] = {}
        self._global_log_per_tflop = 0.0
        self.halfwidth: dict[Basis, float] = dict(DEFAULT_HALFWIDTH)

    def _fit_core(self, observations: Sequence[Observation]) -> None:
        self._observations = observations
        self._table = _Table(observations)
        per_family: dict[str, list[float]] = defaultdict(list)
        for obs in observations:
            gpu = lookup_gpu(obs.gpu_type)
            normalized = math.log(obs.throughput / (gpu.fp32_tflops * obs.gpu_count))
            per_family[describe_model(obs.job.model_name).family].append(normalized)
        self._family_log_per_tflop = {f: float(np.median(v)) for f, v in per_family.items()}
        every = [v for values in per_family.values() for v in values]
        self._global_log_per_tflop = float(np.median(every)) if every else 0.0

    def predict_log(self, queries: Sequence[ThroughputQuery]) -> list[tuple[float, Basis]]:
        out: list[tuple[float, Basis]] = []
        for query in queries:
            on_type = self._table.on_type(query)
            if on_type:
                linear = [value + math.log(query.gpu_count / count) for count, value in on_type]
                out.append((float(np.mean(linear)), "on_type"))
                continue
            anchors = self._table.anchors(query, nearest_only=False)
            if anchors:
                estimates = [
                    value
                    + math.log(query.gpu.fp32_tflops / gpu.fp32_tflops)
                    + math.log(query.gpu_count / count)
                    for gpu, count, value in anchors
                ]
                out.append((float(np.mean(estimates)), "anchored"))
            else:
                family = describe_model(query.job.model_name).family
                per = self._family_log_per_tflop.get(family, self._global_log_per_tflop)
                out.append((per + math.log(query.gpu.fp32_tflops * query.gpu_count), "features"))
        return out

    def fit(self, observations: Sequence[Observation]) -> None:
        if self.calibration_folds > 1:
            self.halfwidth = _calibrate(
                observations,
                lambda: BaselineThroughput(self.level, 0),
                self.calibration_folds,
                self.level,
            )
            residuals = linear_scaling_residuals(observations)
            if residuals:
                self.halfwidth["on_type"] = conformal_halfwidth(residuals, self.level)
        self._fit_core(observations)

    def predict(self, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]:
        return _estimates(self.predict_log(queries), self.halfwidth)

    def with_observations(self, observations: Sequence[Observation]) -> BaselineThroughput:
        out = copy.copy(self)
        out._observations = (*self._observations, *observations)
        out._table = _Table(out._observations)
        return out


class LearnedThroughput:
    """Random forest ("rf") or gradient-boosted trees ("gb") over log throughput ratios."""

    def __init__(
        self,
        kind: Literal["rf", "gb"],
        level: float = 0.9,
        calibration_folds: int = 4,
        seed: int = 0,
        features_model: bool = True,
    ) -> None:
        self.kind: ModelKind = kind
        self.learner: Literal["rf", "gb"] = kind
        self.level = level
        self.calibration_folds = calibration_folds
        self.seed = seed
        # The features-only model serves jobs measured nowhere; calibration folds and the
        # held-out evaluation never ask for one, so they skip fitting it.
        self.features_model = features_model
        self._observations: Sequence[Observation] = ()
        self._table = _Table([])
        self._transfer: RandomForestRegressor | HistGradientBoostingRegressor | None = None
        self._cold: RandomForestRegressor | HistGradientBoostingRegressor | None = None
        self.halfwidth: dict[Basis, float] = dict(DEFAULT_HALFWIDTH)
        self.training_size = 0

    def _fit_core(self, observations: Sequence[Observation]) -> None:
        self._table = _Table(observations)
        self._observations = observations
        self.training_size = len(observations)
        transfer_x: list[list[float]] = []
        transfer_y: list[float] = []
        cold_x: list[list[float]] = []
        cold_y: list[float] = []
        for job, measured in self._table.by_job.items():
            for gpu_name, count, value in measured:
                query = ThroughputQuery(job, lookup_gpu(gpu_name), count)
                cold_x.append(_cold_row(query))
                cold_y.append(value)
                # Elasticity is computed without the target GPU, as it is at prediction time
                # for a pair never measured.
                slope = self._table.elasticity(job, count, exclude_gpu=gpu_name)
                for anchor_name, anchor_count, anchor_value in measured:
                    if (anchor_name, anchor_count) == (gpu_name, count):
                        continue
                    # Prediction anchors on the same count whenever it can, so training
                    # rows that change both GPU and count would only dilute the fit.
                    if anchor_name != gpu_name and anchor_count != count:
                        continue
                    anchor = lookup_gpu(anchor_name)
                    row = _transfer_row(
                        self._table, query, anchor, anchor_count, anchor_value, slope
                    )
                    transfer_x.append(row)
                    transfer_y.append(
                        value - anchor_value - _prior_ratio(row, query, anchor, anchor_count)
                    )
        with single_threaded():
            self._cold = None
            if self.features_model:
                self._cold = _regressor(self.learner, self.seed).fit(
                    np.array(cold_x), np.array(cold_y)
                )
            self._transfer = None
            if transfer_x:
                self._transfer = _regressor(self.learner, self.seed).fit(
                    np.array(transfer_x), np.array(transfer_y)
                )

    def predict_log(self, queries: Sequence[ThroughputQuery]) -> list[tuple[float, Basis]]:
        rows: list[list[float]] = []
        owners: list[int] = []
        bases: list[float] = []
        for index, query in enumerate(queries):
            anchors = self._table.anchors(query) if self._transfer is not None else []
            slope = self._table.elasticity(query.job, query.gpu_count, query.gpu.name)
            for gpu, count, value in anchors:
                row = _transfer_row(self._table, query, gpu, count, value, slope)
                rows.append(row)
                owners.append(index)
                bases.append(value + _prior_ratio(row, query, gpu, count))
        sums = np.zeros(len(queries))
        counts = np.zeros(len(queries))
        if rows and self._transfer is not None:
            ratios = self._transfer.predict(np.array(rows))
            np.add.at(sums, owners, np.array(bases) + ratios)
            np.add.at(counts, owners, 1.0)
        cold = np.zeros(len(queries))
        unanchored = [q for i, q in enumerate(queries) if counts[i] == 0]
        if unanchored:
            if self._cold is None:
                # Fitted without the features-only model (calibration, evaluation) and then
                # asked about an unmeasured job after all: fit it now rather than fail.
                self.features_model = True
                self._fit_core(self._observations)
            assert self._cold is not None
            values = iter(self._cold.predict(np.array([_cold_row(q) for q in unanchored])))
            cold = np.array([next(values) if counts[i] == 0 else 0.0 for i in range(len(queries))])
        return [
            (float(sums[i] / counts[i]), "anchored")
            if counts[i] > 0
            else (float(cold[i]), "features")
            for i in range(len(queries))
        ]

    def fit(self, observations: Sequence[Observation]) -> None:
        if self.calibration_folds > 1:
            self.halfwidth = _calibrate(
                observations,
                lambda: LearnedThroughput(
                    self.learner, self.level, 0, self.seed, features_model=False
                ),
                self.calibration_folds,
                self.level,
            )
        self._fit_core(observations)

    def predict(self, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]:
        return _estimates(self.predict_log(queries), self.halfwidth)

    def with_observations(self, observations: Sequence[Observation]) -> LearnedThroughput:
        """New measurements become anchors; the learned ratios stay as they were fitted (the
        trees anchor on the same count, so a measurement on the asked type at another count
        does not move their answer until a retrain learns from it)."""
        out = copy.copy(self)
        out._observations = (*self._observations, *observations)
        out._table = _Table(out._observations)
        out.training_size = len(out._observations)
        return out


class _CoreModel(Protocol):
    def _fit_core(self, observations: Sequence[Observation]) -> None: ...

    def predict_log(self, queries: Sequence[ThroughputQuery]) -> list[tuple[float, Basis]]: ...


def _calibrate(
    observations: Sequence[Observation],
    make: Callable[[], _CoreModel],
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
        model: _CoreModel = make()
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


def _estimates(
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


def make_model(
    kind: ModelKind,
    level: float = 0.9,
    calibration_folds: int = 4,
    features_model: bool = True,
    on_type: bool = True,
) -> ThroughputModel:
    """A fresh, unfitted throughput model of `kind`.

    `on_type=False` skips calibrating `ratio`'s on-type estimators, for evaluations that never
    ask about a pair measured on its own GPU type.
    """
    if kind == "baseline":
        return BaselineThroughput(level, calibration_folds)
    if kind == "ratio":
        from alnair.predictor.ratio import RatioThroughput

        return RatioThroughput(
            level, calibration_folds, features_model=features_model, on_type=on_type
        )
    return LearnedThroughput(kind, level, calibration_folds, features_model=features_model)
