"""Cold start: one measurement of a job on a GPU type (a TrialJob's run) anchors its other counts.

The cold-start question (issue 13's protocol a'): a (job, GPU type) pair keeps only its
smallest-count measurement and its other counts are predicted. `ratio` answers such queries
with its on-type members (`basis: "on_type"`), the baseline scales the trial linearly, and the
service marks predictions that rest on no measurement on their GPU type as low-confidence, so
a dispatcher knows when a trial is worth running.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from alnair.predictor.datasets import JobKey, Observation, TrainingData, load_gavel
from alnair.predictor.evaluation import error_split, evaluate_throughput
from alnair.predictor.gpus import lookup_gpu
from alnair.predictor.learned import BaselineThroughput
from alnair.predictor.predictor import (
    ModelBundle,
    predict,
    train_bundle,
    validate_candidate,
    with_measurements,
)
from alnair.predictor.ratio import ON_TYPE_MEMBERS, RatioThroughput, on_type_members
from alnair.predictor.schemas import JobSpec, PredictRequest
from alnair.predictor.throughput import (
    ObservationTable,
    ThroughputQuery,
    linear_scaling_residuals,
    on_type_folds,
)

GPUS = ("K80", "P100", "V100")
COUNTS = (1, 2, 4, 8)
# log speed-up of each (GPU, count) column: count scaling differs per GPU type on purpose.
COLUMN = {
    (gpu, count): g + c * s
    for (gpu, g, s), (count, c) in product(
        zip(GPUS, (0.0, 1.4, 1.9), (1.0, 0.8, 0.6), strict=True),
        zip(COUNTS, (0.0, 0.6, 1.1, 1.5), strict=True),
    )
}
MODELS = {"resnet50": 0.5, "transformer": -0.7, "lm": 2.0}
BATCHES = (16, 32, 64, 128)


def _additive() -> list[Observation]:
    """log thr = job level + column effect: every job moves between columns alike."""
    return [
        Observation(
            JobKey(model, batch),
            gpu,
            count,
            math.exp(level - 0.8 * math.log(batch) + COLUMN[(gpu, count)]),
        )
        for model, level in MODELS.items()
        for batch in BATCHES
        for (gpu, count) in COLUMN
    ]


def _query(obs: Observation) -> ThroughputQuery:
    return ThroughputQuery(obs.job, lookup_gpu(obs.gpu_type), obs.gpu_count)


def test_on_type_folds_keep_the_smallest_count_and_hold_out_the_rest() -> None:
    gavel = load_gavel()
    folds = on_type_folds(gavel.alone)
    # 56 of Gavel's 77 (job, GPU type) pairs were measured at 1, 2, 4 and 8 GPUs.
    assert len(folds) == 56
    assert sum(len(test) for _, test in folds) == 168
    for train, test in folds:
        ((job, gpu),) = {(o.job, o.gpu_type) for o in test}
        assert sorted(o.gpu_count for o in test) == [2, 4, 8]
        kept = [o.gpu_count for o in train if (o.job, o.gpu_type) == (job, gpu)]
        assert kept == [1]
        assert len(train) + len(test) == len(gavel.alone)


def test_on_type_members_recover_an_additive_structure_exactly() -> None:
    observations = _additive()
    for train, test in on_type_folds(observations)[::5]:
        model = RatioThroughput(calibration_folds=3, features_model=False)
        model.fit(train)
        for obs, estimate in zip(test, model.predict([_query(o) for o in test]), strict=True):
            assert estimate.basis == "on_type"
            assert not estimate.low_confidence
            assert estimate.steps_per_s == pytest.approx(obs.throughput, rel=1e-9)
    # Every on-type member is exact here, so are their held-out residuals.
    assert model.halfwidth["on_type"] == pytest.approx(0.0, abs=1e-9)
    assert len(model.on_type_weights) == len(ON_TYPE_MEMBERS)
    assert sum(model.on_type_weights) == pytest.approx(1.0)


def test_on_type_members_follow_the_trial_level() -> None:
    observations = _additive()
    held = (JobKey("lm", 32), "V100")
    base = [o for o in observations if (o.job, o.gpu_type) != held]
    trial = next(o for o in observations if (o.job, o.gpu_type, o.gpu_count) == (*held, 1))
    query = ThroughputQuery(held[0], lookup_gpu("V100"), 4)
    answers = []
    for factor in (0.5, 1.0, 2.0):
        table = ObservationTable(
            [*base, Observation(trial.job, "V100", 1, trial.throughput * factor)]
        )
        members = on_type_members(table, query, (0.0, 0.0, 0.3, 0.0, 0.5, 0.2))
        assert members is not None
        answers.append(members)
    # Members anchored on the trial move with it exactly; `cross` ignores it.
    for name in ("prior", "similar2", "similar5", "cross_shift"):
        i = ON_TYPE_MEMBERS.index(name)
        assert answers[2][i] - answers[1][i] == pytest.approx(math.log(2.0), abs=1e-9)
        assert answers[1][i] - answers[0][i] == pytest.approx(math.log(2.0), abs=1e-9)
    cross = ON_TYPE_MEMBERS.index("cross")
    assert answers[0][cross] == pytest.approx(answers[2][cross], abs=1e-12)
    # Without a measurement on V100 at another count there is no on-type answer.
    assert on_type_members(ObservationTable(base), query, (1.0, 0, 0, 0, 0, 0)) is None


def test_baseline_scales_the_trial_linearly_with_the_gpu_count() -> None:
    observations = [
        Observation(JobKey("resnet50", 64), "P100", 1, 2.0),
        Observation(JobKey("resnet50", 64), "V100", 1, 4.0),
        Observation(JobKey("resnet50", 64), "V100", 2, 6.0),
        Observation(JobKey("resnet50", 32), "V100", 1, 5.0),
        Observation(JobKey("resnet50", 32), "V100", 4, 10.0),
    ]
    model = BaselineThroughput(calibration_folds=0)
    model.fit(observations[:2])
    (four,) = model.predict([ThroughputQuery(JobKey("resnet50", 64), lookup_gpu("V100"), 4)])
    assert four.basis == "on_type"
    assert four.steps_per_s == pytest.approx(16.0)
    # Residuals of linear scaling from each pair's smallest count: log(8/6), log(20/10).
    assert sorted(linear_scaling_residuals(observations)) == pytest.approx(
        [math.log(8.0 / 6.0), math.log(2.0)]
    )


def test_error_split_separates_the_speedup_from_the_count_shape() -> None:
    test = [
        Observation(JobKey("lm", 5), "V100", 2, 10.0),
        Observation(JobKey("lm", 5), "V100", 4, 10.0),
        Observation(JobKey("lm", 10), "V100", 2, 10.0),
        Observation(JobKey("lm", 10), "V100", 4, 10.0),
    ]
    # lm@5: both counts 2x too high (its speed-up is wrong, its shape right);
    # lm@10: one count e^0.2 high, the other e^-0.2 low (right speed-up, wrong shape).
    predicted = [20.0, 20.0, 10.0 * math.exp(0.2), 10.0 * math.exp(-0.2)]
    split = error_split(test, predicted)
    shape_error = (math.expm1(0.2) + -math.expm1(-0.2)) / 2
    assert split["mape_speedup_known"] == pytest.approx(shape_error / 2)
    assert split["mape_shape_known"] == pytest.approx((1.0 + 1.0 + 0.0 + 0.0) / 4)
    assert split["mape_2_gpus"] == pytest.approx((1.0 + math.expm1(0.2)) / 2)
    assert split["mape_4_gpus"] == pytest.approx((1.0 - math.expm1(-0.2)) / 2)


@pytest.fixture(scope="module")
def gavel() -> TrainingData:
    return load_gavel()


def test_cold_start_on_gavel_beats_linear_scaling_with_near_nominal_coverage(
    gavel: TrainingData,
) -> None:
    ratio = evaluate_throughput(gavel, "ratio", 0.9, 3, trial=True)
    baseline = evaluate_throughput(gavel, "baseline", 0.9, 3, trial=True)
    assert ratio.n == baseline.n == 168
    # Figures of this commit (docs/notes/issue-13.md): 8.31% MAPE, 89.9% coverage; the
    # linear-scaling baseline 62.9%. The goal is 6%.
    assert ratio.mape < 0.09
    assert ratio.mape < baseline.mape / 5
    assert 0.85 <= ratio.coverage <= 0.95
    assert ratio.split is not None
    assert ratio.split["mape_speedup_known"] < ratio.mape
    assert set(ratio.split) >= {"mape_2_gpus", "mape_4_gpus", "mape_8_gpus"}


HELD = (JobKey("transformer", 128), "V100")


@pytest.fixture(scope="module")
def unseen(gavel: TrainingData) -> ModelBundle:
    """The service's model with one (job, GPU type) pair never measured."""
    data = TrainingData(
        tuple(o for o in gavel.alone if (o.job, o.gpu_type) != HELD), gavel.colocated[:200]
    )
    return train_bundle(data, [], "ratio", 0.9, calibration_folds=2)


def _request() -> PredictRequest:
    return PredictRequest(
        job=JobSpec(model_name="Transformer", batch_size=128, total_steps=1000),
        gpu_types=["V100", "P100"],
        gpu_counts=[1, 2, 4, 8],
    )


def test_unseen_pair_is_low_confidence_until_a_trial_anchors_it(
    unseen: ModelBundle, gavel: TrainingData
) -> None:
    truth = {o.gpu_count: o.throughput for o in gavel.alone if (o.job, o.gpu_type) == HELD}
    before = predict(unseen, _request())
    on_v100 = [p for p in before.predictions if p.gpu_type == "V100"]
    assert {p.basis for p in on_v100} == {"anchored"}
    assert {p.confidence for p in on_v100} == {"low"}
    assert before.confidence == "low"
    assert before.unmeasured_gpu_types == ["V100"]
    # The old flag keeps its meaning: the job is measured (on P100 and K80), not a guess.
    assert before.low_confidence is False
    assert {p.confidence for p in before.predictions if p.gpu_type == "P100"} == {"high"}

    trial = Observation(HELD[0], "V100", 1, truth[1], source="record")
    after_bundle = with_measurements(unseen, [trial])
    assert after_bundle is not None
    assert after_bundle.absorbed == {(HELD[0], "V100", 1)}
    assert after_bundle.training_size["absorbed"] == 1
    after = predict(after_bundle, _request())
    assert after.confidence == "high"
    assert after.unmeasured_gpu_types == []
    by_count = {p.gpu_count: p for p in after.predictions if p.gpu_type == "V100"}
    assert by_count[1].basis == "measured"
    assert by_count[1].throughput_steps_per_s == pytest.approx(truth[1], rel=1e-5)
    widths_before = {
        p.gpu_count: p.throughput_interval.high / p.throughput_interval.low for p in on_v100
    }
    for count in (2, 4, 8):
        p = by_count[count]
        assert p.basis == "on_type" and p.confidence == "high"
        assert p.throughput_interval.low <= truth[count] <= p.throughput_interval.high
        assert abs(p.throughput_steps_per_s / truth[count] - 1.0) < 0.10
        assert p.throughput_interval.high / p.throughput_interval.low < widths_before[count]
    # The same measurement again changes nothing (a redelivered completion event).
    assert with_measurements(after_bundle, [trial]) is None
    # Nothing was refitted: the same fitted stacking weights serve.
    assert getattr(after_bundle.throughput, "weights", None) == getattr(
        unseen.throughput, "weights", None
    )


def test_absorbed_cells_are_no_evidence_for_the_serving_model_in_validation(
    unseen: ModelBundle, gavel: TrainingData
) -> None:
    truth = {o.gpu_count: o.throughput for o in gavel.alone if (o.job, o.gpu_type) == HELD}
    records = [Observation(HELD[0], "V100", c, truth[c], source="record") for c in (1, 2, 4, 8)]
    serving = with_measurements(unseen, records)
    assert serving is not None
    data = TrainingData(
        tuple(o for o in gavel.alone if (o.job, o.gpu_type) != HELD), gavel.colocated[:10]
    )
    validation = validate_candidate(data, records * 2, serving, "ratio", 0.9)
    # Had the absorbed cells counted, the serving model's holdout MAPE would be exactly 0.
    assert validation.current_mape is not None and validation.current_mape > 0.0
    assert np.isfinite(validation.current_mape)
