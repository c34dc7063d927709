"""One reader for a job's model annotations, in Alnair's spelling or the seeds'."""

from __future__ import annotations

import pytest

from alnair.common import resources as r
from alnair.common.annotations import MODEL_ANNOTATION_KEYS, JobModel, job_model, object_model

SEEDS = {"model_name": "densenet121", "data_size": "20", "epoch": "100"}
PREFIXED = {
    r.ANN_MODEL_NAME: "resnet50",
    r.ANN_BATCH_SIZE: "128",
    r.ANN_DATA_SIZE: "1281167",
    r.ANN_EPOCH: "3",
}


def test_seed_spelling_is_read() -> None:
    assert job_model(SEEDS) == JobModel(model_name="densenet121", data_size="20", epoch="100")


def test_prefixed_spelling_is_read() -> None:
    assert job_model(PREFIXED) == JobModel("resnet50", "128", "1281167", "3")


def test_prefixed_wins_field_by_field() -> None:
    mixed = {**SEEDS, r.ANN_MODEL_NAME: "resnet50", "batch_size": "16"}
    assert job_model(mixed) == JobModel(
        model_name="resnet50", batch_size="16", data_size="20", epoch="100"
    )


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_values_count_as_absent(blank: str) -> None:
    model = job_model({r.ANN_MODEL_NAME: blank, "model_name": " vgg16 ", "epoch": blank})
    assert (model.model_name, model.epoch) == ("vgg16", None)


def test_first_source_wins_and_missing_sources_are_skipped() -> None:
    model = job_model(None, {"model_name": "bert"}, {r.ANN_MODEL_NAME: "gpt2", "epoch": "4"})
    assert model.present() == {"model_name": "bert", "epoch": "4"}
    assert job_model() == JobModel()
    assert job_model(None, {}).present() == {}


def test_object_reads_its_own_annotations_before_its_templates() -> None:
    job = {
        "metadata": {"annotations": {"model_name": "resnet50"}},
        "spec": {"template": {"metadata": {"annotations": {"model_name": "x", "epoch": "7"}}}},
    }
    assert object_model(job).present() == {"model_name": "resnet50", "epoch": "7"}
    assert object_model({"metadata": {}, "spec": {"template": {}}}) == JobModel()
    assert object_model({}) == JobModel()


def test_every_spelling_is_listed_for_copying() -> None:
    assert set(MODEL_ANNOTATION_KEYS) == set(PREFIXED) | set(SEEDS) | {"batch_size"}
