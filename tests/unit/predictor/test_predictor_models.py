"""Throughput and co-location models: sane answers, intervals around them, honest folds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alnair.predictor.colocation import (
    BaselineColocation,
    LearnedColocation,
    alone_index,
    pair_folds,
    pair_key,
    query_of,
)
from alnair.predictor.datasets import JobKey, TrainingData, load_gavel
from alnair.predictor.evaluation import figures, pair_holdout_folds
from alnair.predictor.gpus import GPU_SPECS, lookup_gpu
from alnair.predictor.learned import BaselineThroughput, LearnedThroughput
from alnair.predictor.throughput import (
    ThroughputQuery,
    conformal_halfwidth,
)


@pytest.fixture(scope="module")
def gavel() -> TrainingData:
    return load_gavel()


@pytest.fixture(scope="module")
def forest(gavel: TrainingData) -> LearnedThroughput:
    model = LearnedThroughput("rf", calibration_folds=3)
    model.fit(gavel.alone)
    return model


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=200), st.floats(0.5, 0.99))
def test_conformal_halfwidth_covers_the_level(residuals: list[float], level: float) -> None:
    width = conformal_halfwidth(residuals, level)
    covered = sum(r <= width for r in residuals) / len(residuals)
    assert covered >= level
    assert width in residuals


def test_baseline_scales_by_fp32(gavel: TrainingData) -> None:
    model = BaselineThroughput(calibration_folds=0)
    # No V100 at all: a V100 measurement at another count would anchor it on the type itself.
    model.fit([o for o in gavel.alone if o.gpu_type != "V100"])
    job = JobKey("resnet50", 32)
    p100 = next(
        o.throughput
        for o in gavel.alone
        if o.job == job and o.gpu_type == "P100" and o.gpu_count == 1
    )
    k80 = next(
        o.throughput
        for o in gavel.alone
        if o.job == job and o.gpu_type == "K80" and o.gpu_count == 1
    )
    (estimate,) = model.predict([ThroughputQuery(job, lookup_gpu("V100"), 1)])
    expected = math.exp((math.log(p100 * 15.7 / 9.3) + math.log(k80 * 15.7 / 4.37)) / 2)
    assert estimate.steps_per_s == pytest.approx(expected)
    assert estimate.basis == "anchored"


@given(
    st.sampled_from(["resnet50", "transformer", "lm", "vgg16", "whatever-net"]),
    st.sampled_from([1, 16, 64, 256]),
    st.sampled_from(sorted(GPU_SPECS)),
    st.sampled_from([1, 2, 3, 8]),
)
def test_learned_estimates_are_positive_and_inside_their_interval(
    forest: LearnedThroughput, model: str, batch: int, gpu: str, count: int
) -> None:
    (estimate,) = forest.predict([ThroughputQuery(JobKey(model, batch), lookup_gpu(gpu), count)])
    assert 0 < estimate.low <= estimate.steps_per_s <= estimate.high
    assert math.isfinite(estimate.high)


def test_unmeasured_models_come_from_features_with_wider_intervals(
    forest: LearnedThroughput,
) -> None:
    known, unknown = forest.predict(
        [
            ThroughputQuery(JobKey("resnet50", 64), lookup_gpu("V100"), 2),
            ThroughputQuery(JobKey("vgg16", 64), lookup_gpu("V100"), 2),
        ]
    )
    assert known.basis == "anchored"
    assert unknown.basis == "features"
    assert unknown.low_confidence
    assert unknown.high / unknown.low >= known.high / known.low


def test_held_out_pair_folds_never_train_on_their_test_pairs(gavel: TrainingData) -> None:
    folds = pair_holdout_folds(gavel.alone)
    assert len(folds) == 26
    seen: set[tuple[str, str]] = set()
    for train, test in folds:
        test_pairs = {(str(o.job), o.gpu_type) for o in test}
        assert not test_pairs & {(str(o.job), o.gpu_type) for o in train}
        # one pair per GPU type, each of a different job, each job keeping its other GPUs
        assert len({job for job, _ in test_pairs}) == len(test_pairs)
        assert len({gpu for _, gpu in test_pairs}) == len(test_pairs)
        seen |= test_pairs
    # 26 jobs x 3 GPU types, less ResNet-50 at batch 128 on the K80 (it did not fit)
    assert len(seen) == 77


def test_colocation_folds_hold_out_whole_pairs(gavel: TrainingData) -> None:
    for train, test in pair_folds(gavel.colocated, 5):
        held = {pair_key(o.job, o.partner) for o in test}
        assert not held & {pair_key(o.job, o.partner) for o in train}


def test_colocation_fraction_and_interval(gavel: TrainingData) -> None:
    train, test = pair_folds(gavel.colocated, 5)[0]
    learned = LearnedColocation("gb", calibration_folds=0)
    learned.fit(train)
    baseline = BaselineColocation()
    baseline.fit(train)
    alone = alone_index(gavel.colocated)
    queries = [query_of(o, alone) for o in test]
    for estimate in learned.predict(queries):
        assert 0 < estimate.low <= estimate.fraction <= estimate.high <= 1.05
        assert estimate.slowdown == pytest.approx(1 / estimate.fraction)
    learned_error = figures(
        [o.fraction for o in test],
        [e.fraction for e in learned.predict(queries)],
        [True] * len(test),
    )
    baseline_error = figures(
        [o.fraction for o in test],
        [e.fraction for e in baseline.predict(queries)],
        [True] * len(test),
    )
    assert learned_error.mape < baseline_error.mape


def test_figures() -> None:
    f = figures([10.0, 20.0, 40.0], [11.0, 20.0, 20.0], [True, True, False])
    assert f.mape == pytest.approx((0.1 + 0 + 0.5) / 3)
    assert f.median_ape == pytest.approx(0.1)
    assert f.coverage == pytest.approx(2 / 3)
    assert math.isnan(figures([], [], []).mape)
