"""The table-scaling and learned throughput models.

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
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor

from alnair.predictor.catalog import describe_model
from alnair.predictor.compute import single_threaded
from alnair.predictor.datasets import JobKey, Observation
from alnair.predictor.gpus import GpuSpec, lookup_gpu
from alnair.predictor.throughput import (
    DEFAULT_HALFWIDTH,
    Basis,
    ModelKind,
    ObservationTable,
    ThroughputEstimate,
    ThroughputQuery,
    calibrate_halfwidths,
    conformal_halfwidth,
    estimates_from_logs,
    linear_scaling_residuals,
)


@lru_cache(maxsize=4096)
def _job_features(job: JobKey) -> tuple[float, ...]:
    info = describe_model(job.model_name)
    return (*info.features(), math.log(job.batch_size))


def _cold_row(query: ThroughputQuery) -> list[float]:
    return [*_job_features(query.job), *query.gpu.features(), math.log(query.gpu_count)]


def _transfer_row(
    table: ObservationTable,
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
        self._table = ObservationTable([])
        self._family_log_per_tflop: dict[str, float] = {}
        self._global_log_per_tflop = 0.0
        self.halfwidth: dict[Basis, float] = dict(DEFAULT_HALFWIDTH)

    def _fit_core(self, observations: Sequence[Observation]) -> None:
        self._observations = observations
        self._table = ObservationTable(observations)
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
            self.halfwidth = calibrate_halfwidths(
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
        return estimates_from_logs(self.predict_log(queries), self.halfwidth)

    def with_observations(self, observations: Sequence[Observation]) -> BaselineThroughput:
        out = copy.copy(self)
        out._observations = (*self._observations, *observations)
        out._table = ObservationTable(out._observations)
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
        self._table = ObservationTable([])
        self._transfer: RandomForestRegressor | HistGradientBoostingRegressor | None = None
        self._cold: RandomForestRegressor | HistGradientBoostingRegressor | None = None
        self.halfwidth: dict[Basis, float] = dict(DEFAULT_HALFWIDTH)
        self.training_size = 0

    def _fit_core(self, observations: Sequence[Observation]) -> None:
        self._table = ObservationTable(observations)
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
            self.halfwidth = calibrate_halfwidths(
                observations,
                lambda: LearnedThroughput(
                    self.learner, self.level, 0, self.seed, features_model=False
                ),
                self.calibration_folds,
                self.level,
            )
        self._fit_core(observations)

    def predict(self, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]:
        return estimates_from_logs(self.predict_log(queries), self.halfwidth)

    def with_observations(self, observations: Sequence[Observation]) -> LearnedThroughput:
        """New measurements become anchors; the learned ratios stay as they were fitted (the
        trees anchor on the same count, so a measurement on the asked type at another count
        does not move their answer until a retrain learns from it)."""
        out = copy.copy(self)
        out._observations = (*self._observations, *observations)
        out._table = ObservationTable(out._observations)
        out.training_size = len(out._observations)
        return out
