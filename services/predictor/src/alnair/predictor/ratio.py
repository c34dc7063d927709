"""`ratio`: throughput of a job on a GPU type as its measurement elsewhere times a learned ratio.

For a job measured on GPU types A (at some GPU counts) and asked about type B at count n, the
model never predicts an absolute speed. It predicts log(thr(job, B, n) / thr(job, A, n)) for
each anchor A from how other jobs' throughput moved between the same two (GPU, count)
columns, and adds it to the job's own measurement on A. Several estimators of that ratio
("members") are stacked:

- `nearest` / `all`: the ratio of the same model at the neighbouring batch sizes
  (interpolated in log batch size), else its family's mean ratio, else the median job's, else
  FP32 x count; from the anchor closest to B in FP32 throughput, or the geometric mean over
  every anchor at the same count.
- `similar2` / `similar5`: a weighted mean of the ratios of the 2 (5) most similar other jobs,
  where similarity is how closely their measurements on the job's other columns (every GPU
  count, relative to the anchor) follow the job's own, with a penalty for another model and
  for batch-size distance within the model. A job that scales across GPU counts the way a
  sibling does tends to move between GPU types the way that sibling does.
- `direct`: the same model's batch-size neighbours measured on the target (GPU, count)
  itself, interpolated in log batch size, ignoring the job's own measurements (only between
  two siblings; `nearest` otherwise). Its errors are not the anchor's: where the job's anchor
  is odd (Transformer at batch 256 runs as fast on the V100 as on the P100) it is not misled.
- `anycount`: the median, over every measurement of the job on another GPU type at any count,
  of that measurement times the siblings' ratio from its (GPU, count) to the target; a median
  so that one odd anchor cell does not move it.

A job measured on the asked GPU type at another count (a TrialJob's one run there, or any
record) is answered differently (`basis: "on_type"`): that measurement fixes the level, and
the members estimate only how throughput moves from its count to the asked one, on that type
(`ON_TYPE_MEMBERS`): `prior` (the batch-size siblings' move between the two counts on that
type, else the family's, else the median job's), `similar2` / `similar5` (the same similarity
members, anchored on the on-type measurement), `cross` (the cross-type stack above, which
ignores the on-type measurement) and `cross_shift` (the cross-type stack's own move between
the two counts, added to the on-type measurement). They are stacked the same way, with
weights and half-width from holding out, for each pair of the training data, every count but
its smallest.

The stacking weights (a simplex grid in steps of 0.1) minimise the mean absolute percentage
error of the stacked prediction on the training data with each (job, GPU type) pair held out
on its own, and the same inner residuals give the conformal half-width of the interval, so in
the held-out evaluation both are nested and never see the held-out pair. A job measured nowhere
is answered by the random forest's features-only model and flagged (`basis: "features"`).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from alnair.predictor.datasets import Observation
from alnair.predictor.gpus import GpuSpec, lookup_gpu
from alnair.predictor.learned import LearnedThroughput
from alnair.predictor.throughput import (
    DEFAULT_HALFWIDTH,
    Basis,
    ModelKind,
    ObservationTable,
    ThroughputEstimate,
    ThroughputQuery,
    conformal_halfwidth,
    estimates_from_logs,
)

MEMBERS: tuple[str, ...] = ("nearest", "all", "similar2", "similar5", "direct", "anycount")
ON_TYPE_MEMBERS: tuple[str, ...] = ("prior", "similar2", "similar5", "cross", "cross_shift")
# (neighbours, temperature of the exp(-distance / temperature) weights) per similarity member.
_SIMILAR: dict[str, tuple[int, float]] = {"similar2": (2, 0.1), "similar5": (5, 0.3)}
_OTHER_MODEL_PENALTY = 1.0
_BATCH_PENALTY = 0.3


def ratio_prior(
    table: ObservationTable, query: ThroughputQuery, anchor_gpu: GpuSpec, count: int
) -> float:
    """Log ratio query/anchor: siblings' (interpolated), else family, else median job, else spec."""
    target = (query.gpu.name, query.gpu_count)
    anchor = (anchor_gpu.name, count)
    for value in (
        table.sibling_ratio(query.job, target, anchor)[0],
        table.family_ratio(query.job, target, anchor),
        table.global_ratio(query.job, target, anchor),
    ):
        if not math.isnan(value):
            return value
    return math.log(query.gpu.fp32_tflops / anchor_gpu.fp32_tflops) + math.log(
        query.gpu_count / count
    )


def similar_scores(
    table: ObservationTable, query: ThroughputQuery, anchor_gpu: GpuSpec, count: int
) -> list[tuple[float, float]]:
    """(distance, log ratio query/anchor) of every other job measured on both, nearest first."""
    job = query.job
    target = (query.gpu.name, query.gpu_count)
    anchor = (anchor_gpu.name, count)
    own_anchor = table.log_thr[(job, *anchor)]
    profile = [
        (gpu, c, value - own_anchor)
        for gpu, c, value in table.by_job.get(job, [])
        if gpu != query.gpu.name and (gpu, c) != anchor
    ]
    scored: list[tuple[float, float]] = []
    for other in table.by_job:
        if other == job:
            continue
        here = table.log_thr.get((other, *target))
        there = table.log_thr.get((other, *anchor))
        if here is None or there is None:
            continue
        diffs = [
            (value - (theirs - there)) ** 2
            for gpu, c, value in profile
            if (theirs := table.log_thr.get((other, gpu, c))) is not None
        ]
        distance = math.sqrt(sum(diffs) / len(diffs)) if diffs else 0.0
        if other.model_name != job.model_name:
            distance += _OTHER_MODEL_PENALTY
        else:
            distance += _BATCH_PENALTY * abs(math.log(other.batch_size / job.batch_size))
        scored.append((distance, here - there))
    scored.sort()
    return scored


def weighted_neighbours(
    scored: Sequence[tuple[float, float]], neighbours: int, temperature: float
) -> float | None:
    """exp(-distance / temperature)-weighted mean ratio of the `neighbours` nearest (None: none)."""
    if not scored:
        return None
    chosen = scored[:neighbours]
    weights = [math.exp(-(d - chosen[0][0]) / temperature) for d, _ in chosen]
    return sum(w * r for w, (_, r) in zip(weights, chosen, strict=True)) / sum(weights)


def similar_ratio(
    table: ObservationTable,
    query: ThroughputQuery,
    anchor_gpu: GpuSpec,
    count: int,
    neighbours: int,
    temperature: float,
) -> float | None:
    """Similarity-weighted log ratio query/anchor of the jobs most like the query's job.

    None when no other job was measured on both columns.
    """
    scored = similar_scores(table, query, anchor_gpu, count)
    return weighted_neighbours(scored, neighbours, temperature)


def direct_interpolation(table: ObservationTable, query: ThroughputQuery) -> float | None:
    """Log throughput of the same model's batch-size neighbours on the target column itself.

    Interpolated in log batch size between the nearest smaller and larger sibling measured on
    (target GPU, count); None without one on each side (no extrapolation). Unlike the ratio
    members it ignores the job's own measurements, so its errors are not the anchor's.
    """
    target = (query.job.model_name, query.gpu.name, query.gpu_count)
    points = [
        (math.log(sibling.batch_size / query.job.batch_size), value)
        for sibling in table.siblings.get(target[0], [])
        if sibling != query.job and (value := table.log_thr.get((sibling, *target[1:]))) is not None
    ]
    below = max((p for p in points if p[0] < 0), default=None)
    above = min((p for p in points if p[0] > 0), default=None)
    if below is None or above is None:
        return None
    weight = -below[0] / (above[0] - below[0])
    return below[1] * (1.0 - weight) + above[1] * weight


def any_count_median(table: ObservationTable, query: ThroughputQuery) -> float | None:
    """Median over every measurement of the job on another GPU type, at any count, times the
    siblings' (interpolated) ratio from that (GPU, count) to the target; None without one."""
    target = (query.gpu.name, query.gpu_count)
    values = []
    for gpu, count, value in table.by_job.get(query.job, []):
        if gpu == query.gpu.name:
            continue
        ratio = table.sibling_ratio(query.job, target, (gpu, count))[0]
        if not math.isnan(ratio):
            values.append(value + ratio)
    return float(np.median(values)) if values else None


def member_predictions(table: ObservationTable, query: ThroughputQuery) -> list[float] | None:
    """Log throughput of the query by each member (order of MEMBERS); None if unanchored."""
    every = table.anchors(query, nearest_only=False, other_types_only=True)
    if not every:
        return None
    nearest = table.anchors(query, other_types_only=True)
    priors = {
        (gpu.name, count): value + ratio_prior(table, query, gpu, count)
        for gpu, count, value in every
    }
    out = [
        float(np.mean([priors[(gpu.name, count)] for gpu, count, _ in nearest])),
        float(np.mean(list(priors.values()))),
    ]
    scores = [similar_scores(table, query, gpu, count) for gpu, count, _ in every]
    for neighbours, temperature in _SIMILAR.values():
        values = []
        for (gpu, count, value), scored in zip(every, scores, strict=True):
            ratio = weighted_neighbours(scored, neighbours, temperature)
            values.append(priors[(gpu.name, count)] if ratio is None else value + ratio)
        out.append(float(np.mean(values)))
    # Members that can be undefined fall back to `nearest`.
    for extra in (direct_interpolation(table, query), any_count_median(table, query)):
        out.append(out[0] if extra is None else extra)
    return out


def on_type_local(
    table: ObservationTable, query: ThroughputQuery, count: int, value: float
) -> tuple[float, float, float]:
    """`prior`, `similar2`, `similar5` from the job's log throughput `value` on the query's GPU
    type at `count`: the move from `count` to the asked count on that type, added to it."""
    prior = value + ratio_prior(table, query, query.gpu, count)
    elsewhere = any(gpu != query.gpu.name for gpu, _, _ in table.by_job.get(query.job, []))
    # Without measurements on other types there is no profile to compare: every other job
    # would be equally similar, so the similarity members fall back to `prior`.
    scored = similar_scores(table, query, query.gpu, count) if elsewhere else []
    similar = [weighted_neighbours(scored, k, t) for k, t in _SIMILAR.values()]
    two, five = (prior if ratio is None else value + ratio for ratio in similar)
    return prior, two, five


def on_type_row(
    local: tuple[float, float, float],
    value: float,
    cross_here: Sequence[float] | None,
    cross_anchor: Sequence[float] | None,
    weights: Sequence[float],
) -> list[float]:
    """The on-type members (order of ON_TYPE_MEMBERS) from `on_type_local`'s three, the on-type
    log throughput `value`, and the cross-type members at the asked and at the anchor count
    (None when the job was measured on no other type: both cross members are then `prior`)."""
    prior = local[0]
    if cross_here is None or cross_anchor is None:
        return [*local, prior, prior]
    w = np.asarray(weights)
    here = float(np.asarray(cross_here) @ w)
    there = float(np.asarray(cross_anchor) @ w)
    return [*local, here, value + here - there]


def on_type_members(
    table: ObservationTable, query: ThroughputQuery, cross_weights: Sequence[float]
) -> list[float] | None:
    """Log throughput of the query by each on-type member, averaged over the job's
    measurements on the query's GPU type at other counts; None without one."""
    anchors = table.on_type(query)
    if not anchors:
        return None
    cross_here = member_predictions(table, query)
    rows = []
    for count, value in anchors:
        local = on_type_local(table, query, count, value)
        cross_anchor = member_predictions(table, ThroughputQuery(query.job, query.gpu, count))
        rows.append(on_type_row(local, value, cross_here, cross_anchor, cross_weights))
    return [float(v) for v in np.mean(np.asarray(rows), axis=0)]


def _simplex(members: int, step: int = 10) -> list[tuple[float, ...]]:
    """Every weight vector over `members` with weights in multiples of 1/step summing to 1."""
    grid = []
    for cut in itertools.combinations(range(step + members - 1), members - 1):
        bounds = (-1, *cut, step + members - 1)
        grid.append(tuple((bounds[i + 1] - bounds[i] - 1) / step for i in range(members)))
    return grid


def stack_weights(members: np.ndarray, truth: np.ndarray) -> tuple[float, ...]:
    """Simplex weights minimising mean |exp(stacked - truth) - 1| (ties: the earliest)."""
    grid = _simplex(members.shape[1])
    losses = np.mean(np.abs(np.expm1(members @ np.asarray(grid).T - truth[:, None])), axis=0)
    # The earliest weights within 1e-12 of the best loss.
    return grid[int(np.flatnonzero(losses <= losses.min() + 1e-12)[0])]


class RatioThroughput:
    """Stacked cross-GPU ratio estimators over the job's own measurements (see module)."""

    kind: ModelKind = "ratio"

    def __init__(
        self,
        level: float = 0.9,
        calibration_folds: int = 4,
        features_model: bool = True,
        on_type: bool = True,
    ) -> None:
        self.level = level
        self.calibration_folds = calibration_folds
        self.features_model = features_model
        self.on_type = on_type
        self.weights: tuple[float, ...] = tuple(1.0 / len(MEMBERS) for _ in MEMBERS)
        self.on_type_weights: tuple[float, ...] = tuple(
            1.0 / len(ON_TYPE_MEMBERS) for _ in ON_TYPE_MEMBERS
        )
        self.halfwidth: dict[Basis, float] = dict(DEFAULT_HALFWIDTH)
        self.training_size = 0
        self._observations: Sequence[Observation] = ()
        self._table = ObservationTable([])
        self._cold: LearnedThroughput | None = None

    def fit(self, observations: Sequence[Observation]) -> None:
        if self.calibration_folds > 1:
            self._calibrate(observations)
        self._table = ObservationTable(observations)
        self._observations = observations
        self.training_size = len(observations)
        self._cold = None
        if self.features_model:
            self._fit_cold()

    def _fit_cold(self) -> None:
        self._cold = LearnedThroughput("rf", self.level, 0, features_model=True)
        self._cold.fit(self._observations)

    def _calibrate(self, observations: Sequence[Observation]) -> None:
        """Stacking weights and half-widths from leave-one-(job, GPU type)-out predictions.

        The members need no fitting (they read a table), so every pair can be held out on its
        own, exactly as a prediction faces it. Coarser folds (a third of the pairs at once)
        also hold out the siblings the sibling members rely on and favoured the wrong member.
        The on-type members are calibrated in the same pass: the held-out pair's measurement
        at its smallest count goes back into the table, and its other counts are predicted.
        """
        pairs: dict[tuple[str, str], list[int]] = {}
        for index, obs in enumerate(observations):
            pairs.setdefault((str(obs.job), obs.gpu_type), []).append(index)
        rows: list[list[float]] = []
        truth: list[float] = []
        # On-type: (local members, anchor value, cross members here, at the anchor, truth).
        on_type: list[tuple[tuple[float, float, float], float, Any, Any, float]] = []
        for held in pairs.values():
            held_set = set(held)
            train = [o for i, o in enumerate(observations) if i not in held_set]
            if not train:
                continue
            table = ObservationTable(train)
            cross: dict[int, list[float] | None] = {}
            for index in held:
                obs = observations[index]
                query = ThroughputQuery(obs.job, lookup_gpu(obs.gpu_type), obs.gpu_count)
                members = member_predictions(table, query)
                cross[obs.gpu_count] = members
                if members is not None:
                    rows.append(members)
                    truth.append(math.log(obs.throughput))
            anchor = min(cross)
            if not self.on_type or len(cross) < 2:
                continue
            first = observations[held[0]]
            anchor_logs = [
                math.log(observations[i].throughput)
                for i in held
                if observations[i].gpu_count == anchor
            ]
            value = math.fsum(anchor_logs) / len(anchor_logs)
            table.add_cell(first.job, first.gpu_type, anchor, value)
            for index in held:
                obs = observations[index]
                if obs.gpu_count == anchor:
                    continue
                query = ThroughputQuery(obs.job, lookup_gpu(obs.gpu_type), obs.gpu_count)
                local = on_type_local(table, query, anchor, value)
                on_type.append(
                    (local, value, cross[obs.gpu_count], cross[anchor], math.log(obs.throughput))
                )
        if len(rows) >= 10:
            x, y = np.array(rows), np.array(truth)
            self.weights = stack_weights(x, y)
            anchored = conformal_halfwidth(
                np.abs(x @ np.asarray(self.weights) - y).tolist(), self.level
            )
            self.halfwidth = {
                "anchored": anchored,
                "on_type": self.halfwidth["on_type"],
                "features": max(anchored * 2.0, math.log(3.0)),
            }
        if len(on_type) >= 10:
            x = np.array([on_type_row(lo, v, h, a, self.weights) for lo, v, h, a, _ in on_type])
            y = np.array([t for *_, t in on_type])
            self.on_type_weights = stack_weights(x, y)
            self.halfwidth["on_type"] = conformal_halfwidth(
                np.abs(x @ np.asarray(self.on_type_weights) - y).tolist(), self.level
            )

    def predict_log(self, queries: Sequence[ThroughputQuery]) -> list[tuple[float, Basis]]:
        out: list[tuple[float, Basis] | None] = []
        weights = np.asarray(self.weights)
        on_type_weights = np.asarray(self.on_type_weights)
        for query in queries:
            local = on_type_members(self._table, query, self.weights)
            if local is not None:
                out.append((float(np.asarray(local) @ on_type_weights), "on_type"))
                continue
            members = member_predictions(self._table, query)
            out.append(
                None if members is None else (float(np.asarray(members) @ weights), "anchored")
            )
        missing = [q for q, o in zip(queries, out, strict=True) if o is None]
        if missing:
            if self._cold is None:
                self._fit_cold()
            assert self._cold is not None
            cold = iter(self._cold.predict_log(missing))
            out = [o if o is not None else next(cold) for o in out]
        return [o for o in out if o is not None]

    def predict(self, queries: Sequence[ThroughputQuery]) -> list[ThroughputEstimate]:
        return estimates_from_logs(self.predict_log(queries), self.halfwidth)

    def with_observations(self, observations: Sequence[Observation]) -> RatioThroughput:
        """Nothing is fitted on the table, so new measurements serve at once as anchors (the
        stacking weights and half-widths stay until the next fit)."""
        out = copy.copy(self)
        out._observations = (*self._observations, *observations)
        out._table = ObservationTable(out._observations)
        out.training_size = len(out._observations)
        return out
