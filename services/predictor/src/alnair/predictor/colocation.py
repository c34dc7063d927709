"""Co-location interference: how much of its speed each of two jobs keeps on a shared GPU.

The scheduler packs jobs onto one GPU only when neither slows down too much, so for a pair
(A, B) on a GPU type it needs A's slowdown and B's. The models learn the fraction f of its
alone throughput that A keeps next to B (slowdown = 1 / f), in log space:

- `BaselineColocation`: equal time-slicing, f = 1/2 for both, what a GPU without MPS or MIG
  does to two saturating jobs.
- `LearnedColocation("rf" | "gb")`: random forest or gradient-boosted trees over both jobs'
  features, the GPU's specifications, both alone throughputs, and collaborative features that
  need no measurement of the pair itself: how much A suffered next to other jobs, how much B
  hurt other jobs, and how A fared next to B's batch-size siblings (and A's siblings next to B).

Intervals are conformal, as for throughput, with residuals from folds grouped by job pair.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor

from alnair.predictor.catalog import describe_model
from alnair.predictor.compute import single_threaded
from alnair.predictor.datasets import ColocObservation, JobKey
from alnair.predictor.gpus import GpuSpec, lookup_gpu
from alnair.predictor.throughput import ModelKind, conformal_halfwidth

# A job never keeps more than its alone speed by sharing, and measured fractions below 1% are
# stalls; clipping keeps the log targets finite.
_MIN_FRACTION = 0.005
_MAX_FRACTION = 1.05


@dataclass(frozen=True, slots=True)
class ColocQuery:
    """`job` sharing `gpu_count` GPUs of type `gpu` with `partner`; alone log throughputs."""

    job: JobKey
    partner: JobKey
    gpu: GpuSpec
    gpu_count: int
    job_log_alone: float
    partner_log_alone: float


@dataclass(frozen=True, slots=True)
class FractionEstimate:
    """Fraction of alone throughput kept, with an interval at the nominal level."""

    fraction: float
    low: float
    high: float
    informed: bool

    @property
    def slowdown(self) -> float:
        return 1.0 / self.fraction


def pair_key(a: JobKey, b: JobKey) -> tuple[str, str]:
    """Order-free identity of a job pair, for grouping held-out folds."""
    first, second = sorted((str(a), str(b)))
    return (first, second)


class ColocationModel(Protocol):
    kind: ModelKind

    def fit(self, observations: Sequence[ColocObservation]) -> None: ...

    def predict(self, queries: Sequence[ColocQuery]) -> list[FractionEstimate]: ...


def _clip_log(fraction: float) -> float:
    return math.log(min(_MAX_FRACTION, max(_MIN_FRACTION, fraction)))


class _PairTable:
    """Measured log fractions, indexed for the collaborative features."""

    def __init__(self, observations: Sequence[ColocObservation]) -> None:
        self.log_f: dict[tuple[JobKey, JobKey, str, int], float] = {}
        self.as_victim: dict[tuple[JobKey, str, int], list[tuple[JobKey, float]]] = defaultdict(
            list
        )
        self.as_aggressor: dict[tuple[JobKey, str, int], list[tuple[JobKey, float]]] = defaultdict(
            list
        )
        self.siblings: dict[str, set[JobKey]] = defaultdict(set)
        for obs in observations:
            value = _clip_log(obs.fraction)
            self.log_f[(obs.job, obs.partner, obs.gpu_type, obs.gpu_count)] = value
            self.as_victim[(obs.job, obs.gpu_type, obs.gpu_count)].append((obs.partner, value))
            self.as_aggressor[(obs.partner, obs.gpu_type, obs.gpu_count)].append((obs.job, value))
            self.siblings[obs.job.model_name].add(obs.job)
            self.siblings[obs.partner.model_name].add(obs.partner)

    def features(self, query: ColocQuery) -> list[float]:
        gpu, count = query.gpu.name, query.gpu_count
        suffered = [
            v
            for other, v in self.as_victim.get((query.job, gpu, count), [])
            if other != query.partner
        ]
        inflicted = [
            v
            for other, v in self.as_aggressor.get((query.partner, gpu, count), [])
            if other != query.job
        ]
        via_partner_siblings = [
            v
            for sibling in self.siblings.get(query.partner.model_name, set())
            if sibling != query.partner
            and (v := self.log_f.get((query.job, sibling, gpu, count))) is not None
        ]
        via_job_siblings = [
            v
            for sibling in self.siblings.get(query.job.model_name, set())
            if sibling != query.job
            and (v := self.log_f.get((sibling, query.partner, gpu, count))) is not None
        ]
        out: list[float] = []
        for values in (suffered, inflicted, via_partner_siblings, via_job_siblings):
            out += [float(np.mean(values)), 1.0] if values else [0.0, 0.0]
        return out

    def informed(self, query: ColocQuery) -> bool:
        """Whether either job was ever measured sharing a GPU of this type and count."""
        gpu, count = query.gpu.name, query.gpu_count
        return (query.job, gpu, count) in self.as_victim or (
            query.partner,
            gpu,
            count,
        ) in self.as_aggressor


@lru_cache(maxsize=4096)
def _job_row(job: JobKey) -> tuple[float, ...]:
    return (*describe_model(job.model_name).features(), math.log(job.batch_size))


def _row(table: _PairTable, query: ColocQuery) -> list[float]:
    return [
        *_job_row(query.job),
        *_job_row(query.partner),
        *query.gpu.features(),
        math.log(query.gpu_count),
        query.job_log_alone,
        query.partner_log_alone,
        query.job_log_alone - query.partner_log_alone,
        *table.features(query),
    ]


def query_of(
    obs: ColocObservation, partner_alone: dict[tuple[JobKey, str, int], float]
) -> ColocQuery:
    """The query an observation answers, with alone throughputs from measurements."""
    partner_log = partner_alone.get((obs.partner, obs.gpu_type, obs.gpu_count))
    return ColocQuery(
        obs.job,
        obs.partner,
        lookup_gpu(obs.gpu_type),
        obs.gpu_count,
        math.log(obs.alone_throughput),
        math.log(obs.alone_throughput) if partner_log is None else partner_log,
    )


def alone_index(observations: Sequence[ColocObservation]) -> dict[tuple[JobKey, str, int], float]:
    """Log alone throughputs known from co-location measurements."""
    return {(o.job, o.gpu_type, o.gpu_count): math.log(o.alone_throughput) for o in observations}


class BaselineColocation:
    """Equal time-slicing: each job keeps half of its alone throughput."""

    kind: ModelKind = "baseline"

    def __init__(self, level: float = 0.9, calibration_folds: int = 4) -> None:
        self.level = level
        self.calibration_folds = calibration_folds
        self.halfwidth = math.log(2.0)

    def fit(self, observations: Sequence[ColocObservation]) -> None:
        # Nothing to learn; the interval still comes from how wrong 1/2 was on data.
        residuals = [abs(_clip_log(o.fraction) - math.log(0.5)) for o in observations]
        self.halfwidth = conformal_halfwidth(residuals, self.level)

    def predict(self, queries: Sequence[ColocQuery]) -> list[FractionEstimate]:
        return [
            FractionEstimate(
                0.5,
                0.5 * math.exp(-self.halfwidth),
                min(_MAX_FRACTION, 0.5 * math.exp(self.halfwidth)),
                informed=False,
            )
            for _ in queries
        ]


class LearnedColocation:
    """Random forest ("rf") or gradient-boosted trees ("gb") over log kept fractions."""

    def __init__(
        self,
        kind: Literal["rf", "gb"],
        level: float = 0.9,
        calibration_folds: int = 4,
        seed: int = 0,
    ) -> None:
        self.kind: ModelKind = kind
        self.learner: Literal["rf", "gb"] = kind
        self.level = level
        self.calibration_folds = calibration_folds
        self.seed = seed
        self._table = _PairTable([])
        self._model: RandomForestRegressor | HistGradientBoostingRegressor | None = None
        self.halfwidth = math.log(2.0)
        self.training_size = 0

    def _fit_core(self, observations: Sequence[ColocObservation]) -> None:
        self._table = _PairTable(observations)
        self.training_size = len(observations)
        alone = alone_index(observations)
        x = np.array([_row(self._table, query_of(o, alone)) for o in observations])
        y = np.array([_clip_log(o.fraction) for o in observations])
        model: RandomForestRegressor | HistGradientBoostingRegressor
        if self.learner == "rf":
            model = RandomForestRegressor(
                n_estimators=60,
                min_samples_leaf=2,
                max_features=0.5,
                random_state=self.seed,
                n_jobs=1,
            )
        else:
            model = HistGradientBoostingRegressor(
                max_iter=120,
                learning_rate=0.12,
                max_bins=63,
                max_leaf_nodes=31,
                min_samples_leaf=8,
                random_state=self.seed,
            )
        with single_threaded():
            self._model = model.fit(x, y)

    def _predict_log(self, queries: Sequence[ColocQuery]) -> list[float]:
        if self._model is None:
            raise RuntimeError("predict before fit")
        if not queries:
            return []
        rows = np.array([_row(self._table, q) for q in queries])
        return [float(v) for v in self._model.predict(rows)]

    def fit(self, observations: Sequence[ColocObservation]) -> None:
        if self.calibration_folds > 1:
            residuals: list[float] = []
            for train, test in pair_folds(observations, self.calibration_folds):
                inner = LearnedColocation(self.learner, self.level, 0, self.seed)
                inner._fit_core(train)
                alone = alone_index(observations)
                predicted = inner._predict_log([query_of(o, alone) for o in test])
                residuals += [
                    abs(_clip_log(o.fraction) - p) for o, p in zip(test, predicted, strict=True)
                ]
            self.halfwidth = conformal_halfwidth(residuals, self.level)
        self._fit_core(observations)

    def predict(self, queries: Sequence[ColocQuery]) -> list[FractionEstimate]:
        out = []
        for query, value in zip(queries, self._predict_log(queries), strict=True):
            fraction = min(_MAX_FRACTION, math.exp(value))
            out.append(
                FractionEstimate(
                    fraction,
                    fraction * math.exp(-self.halfwidth),
                    min(_MAX_FRACTION, fraction * math.exp(self.halfwidth)),
                    informed=self._table.informed(query),
                )
            )
        return out


def pair_folds(
    observations: Sequence[ColocObservation], folds: int
) -> list[tuple[list[ColocObservation], list[ColocObservation]]]:
    """Train/test splits in which every job pair is wholly on one side (all GPUs, both orders)."""
    pairs = sorted({pair_key(o.job, o.partner) for o in observations})
    # A fixed shuffle spreads each model's pairs over the folds instead of sorting them into one.
    order = np.random.default_rng(7).permutation(len(pairs))
    fold_of = {pairs[i]: rank % folds for rank, i in enumerate(order)}
    out = []
    for fold in range(folds):
        test = [o for o in observations if fold_of[pair_key(o.job, o.partner)] == fold]
        train = [o for o in observations if fold_of[pair_key(o.job, o.partner)] != fold]
        if test and train:
            out.append((train, test))
    return out


def make_colocation_model(
    kind: ModelKind, level: float = 0.9, calibration_folds: int = 4
) -> ColocationModel:
    """A fresh, unfitted co-location model of `kind`.

    `ratio` is a throughput model only; its bundles predict co-location with the random forest.
    """
    if kind == "baseline":
        return BaselineColocation(level, calibration_folds)
    if kind == "ratio":
        return LearnedColocation("rf", level, calibration_folds)
    return LearnedColocation(kind, level, calibration_folds)
