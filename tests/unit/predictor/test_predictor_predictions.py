"""What the service answers: runtimes, memory, confidence flags and co-location slowdowns."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from alnair.predictor.datasets import JobKey, Observation, load_gavel
from alnair.predictor.memory import MemoryModel
from alnair.predictor.predictor import (
    ModelBundle,
    colocation,
    predict,
    train_bundle,
    validate_candidate,
)
from alnair.predictor.schemas import ColocationRequest, JobSpec, PredictRequest


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return train_bundle(load_gavel(), [], "gb", 0.9, calibration_folds=2)


def test_runtime_is_steps_over_throughput(bundle: ModelBundle) -> None:
    reply = predict(
        bundle,
        PredictRequest(
            job=JobSpec(model_name="ResNet-50", batch_size=64, data_size=6400, epoch=3),
            gpu_types=["v100", "K80"],
            gpu_counts=[4, 1],
        ),
    )
    assert [(p.gpu_type, p.gpu_count) for p in reply.predictions] == [
        ("V100", 1),
        ("V100", 4),
        ("K80", 1),
        ("K80", 4),
    ]
    for p in reply.predictions:
        assert p.runtime_s == pytest.approx(300 / p.throughput_steps_per_s, rel=1e-3)
        assert p.runtime_interval_s is not None
        assert p.runtime_interval_s.low <= p.runtime_s <= p.runtime_interval_s.high
        assert p.basis == "measured"
    assert reply.known_model
    assert not reply.low_confidence


def test_unknown_model_and_unmeasured_gpu_are_low_confidence(bundle: ModelBundle) -> None:
    reply = predict(
        bundle,
        PredictRequest(job=JobSpec(model_name="mystery-model", batch_size=8), gpu_counts=[1]),
    )
    assert not reply.known_model
    assert reply.low_confidence
    assert {p.gpu_type for p in reply.predictions} == {
        "K80",
        "P100",
        "T4",
        "V100",
        "A10",
        "A100",
        "H100",
    }
    assert all(p.runtime_s is None for p in reply.predictions)
    by_gpu = {p.gpu_type: p for p in reply.predictions}
    assert by_gpu["H100"].basis == "extrapolated"
    assert by_gpu["V100"].basis == "features"
    # extrapolating by specification keeps the generations in order
    assert by_gpu["H100"].throughput_steps_per_s > by_gpu["A100"].throughput_steps_per_s
    assert by_gpu["A100"].throughput_steps_per_s > by_gpu["V100"].throughput_steps_per_s


def test_memory_fit_and_records_override() -> None:
    memory = MemoryModel()
    big = memory.predict(JobKey("resnet50", 256))
    assert big.basis == "catalog"
    assert big.peak_mib > 16 * 1024
    memory.fit(
        [Observation(JobKey("resnet50", 64), "V100", 1, 5.0, "record", peak_gpu_mem_mib=3000.0)]
    )
    learned = memory.predict(JobKey("resnet50", 256))
    assert learned.basis == "records"
    assert learned.peak_mib < big.peak_mib


def test_colocation_reply(bundle: ModelBundle) -> None:
    reply = colocation(
        bundle,
        ColocationRequest(
            job_a=JobSpec(model_name="resnet50", batch_size=64),
            job_b=JobSpec(model_name="recommendation", batch_size=2048),
            gpu_type="P100",
        ),
    )
    for side in (reply.job_a, reply.job_b):
        assert side.throughput_colocated_steps_per_s <= side.throughput_alone_steps_per_s * 1.06
        assert side.slowdown_interval.low <= side.slowdown <= side.slowdown_interval.high
    assert not reply.low_confidence


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"job": {"model_name": "x", "batch_size": 0}}, ("job", "batch_size")),
        ({"job": {"model_name": "   "}}, ("job", "model_name")),
        ({"job": {"model_name": "x"}, "gpu_types": ["V100", "Z9"]}, ("gpu_types",)),
        ({"job": {"model_name": "x"}, "gpu_counts": [0]}, ("gpu_counts",)),
        ({"job": {"model_name": "x", "colour": "red"}}, ("job", "colour")),
    ],
)
def test_nonsense_is_refused_naming_the_field(
    body: dict[str, object], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate(body)
    assert info.value.errors()[0]["loc"] == loc


def test_seed_annotations_are_accepted() -> None:
    seeds = JobSpec.from_annotations(
        {"model_name": "densenet121", "data_size": "20", "epoch": "100"}
    )
    assert seeds.model_name == "densenet121"
    assert seeds.steps() == 100 * 1
    alnair = JobSpec.from_annotations(
        {"alnair.io/model-name": "resnet50", "alnair.io/batch-size": "128", "alnair.io/epoch": "2"}
    )
    assert alnair.batch_size == 128
    assert alnair.steps() is None


def test_validation_rejects_a_worse_candidate_and_accepts_a_good_one(bundle: ModelBundle) -> None:
    gavel = load_gavel()
    consistent = [
        Observation(JobKey("vgg16", 32), gpu, 1, speed, "record")
        for gpu, speed in [("V100", 8.0), ("P100", 4.0), ("K80", 1.0)] * 3
    ]
    accepted = validate_candidate(gavel, consistent, bundle, "gb", 0.9)
    assert accepted.accepted, accepted.reason
    assert accepted.holdout_records == 1
    few = validate_candidate(gavel, consistent[:3], bundle, "gb", 0.9)
    assert few.accepted
    assert few.holdout_records == 0


def test_a_job_without_a_batch_size_runs_with_its_models_usual_one(bundle: ModelBundle) -> None:
    """CycleGAN as the Philly trace names it (no batch size): Gavel's measured job at one
    sample per step, fitting a 16 GB GPU, not 32 samples that fit no GPU (the live demo held
    every CycleGAN job for a predicted 49 GB)."""
    assert JobSpec(model_name="CycleGAN").batch_size == 1
    assert JobSpec(model_name="A3C").batch_size == 1
    assert JobSpec(model_name="ResNet-50").batch_size == 32
    assert JobSpec(model_name="CycleGAN", batch_size=4).batch_size == 4  # stated: kept
    reply = predict(bundle, PredictRequest(job=JobSpec(model_name="CycleGAN", total_steps=100),
                                           gpu_types=["V100"], gpu_counts=[1]))  # fmt: skip
    (p,) = reply.predictions
    assert p.basis == "measured" and not reply.low_confidence
    assert p.peak_gpu_mem_mib < 16 * 1024
