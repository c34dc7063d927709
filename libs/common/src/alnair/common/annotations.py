"""The one reader of a job's model annotations, in Alnair's spelling or the seeds'.

Users describe what a job trains with annotations: Alnair's prefixed names
(`alnair.io/model-name`, `alnair.io/batch-size`, `alnair.io/data-size`, `alnair.io/epoch`) or the
bare names the original system's manifests use (`model_name`, `batch_size`, `data_size`,
`epoch`). The profiler's execution records, the sim backend, TrialJob's trial Jobs and the
predictor all read them through `job_model`, so a job annotated either way is understood the same
everywhere. When both spellings are present the prefixed one wins; an empty value counts as
absent. Values stay strings as written: the record keeps them as given and the predictor's
schema is where a non-number is refused, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from alnair.common.resources import ANN_BATCH_SIZE, ANN_DATA_SIZE, ANN_EPOCH, ANN_MODEL_NAME

SPELLINGS: Mapping[str, tuple[str, str]] = {
    "model_name": (ANN_MODEL_NAME, "model_name"),
    "batch_size": (ANN_BATCH_SIZE, "batch_size"),
    "data_size": (ANN_DATA_SIZE, "data_size"),
    "epoch": (ANN_EPOCH, "epoch"),
}
"""Field -> its annotation names, the winning (prefixed) one first."""

MODEL_ANNOTATION_KEYS: tuple[str, ...] = tuple(k for names in SPELLINGS.values() for k in names)
"""Every annotation name `job_model` reads (for code that copies them from object to object)."""


@dataclass(frozen=True)
class JobModel:
    """What a job trains, as annotated; None where the job does not say."""

    model_name: str | None = None
    batch_size: str | None = None
    data_size: str | None = None
    epoch: str | None = None

    def present(self) -> dict[str, str]:
        """The fields that are set, by field name (`model_name`, ...)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def _pick(sources: tuple[Mapping[str, Any], ...], names: tuple[str, ...]) -> str | None:
    for source in sources:
        for name in names:
            value = source.get(name)
            if value is not None and str(value).strip():
                return str(value).strip()
    return None


def job_model(*sources: Mapping[str, Any] | None) -> JobModel:
    """The model fields from annotation maps, the first map that has a field winning.

    Within one map the prefixed spelling beats the bare one. Pass an object's annotations
    before its pod template's (see `object_model`).
    """
    maps = tuple(s for s in sources if s)
    return JobModel(**{field: _pick(maps, names) for field, names in SPELLINGS.items()})


def object_model(obj: Mapping[str, Any]) -> JobModel:
    """The model fields of a workload object: its own annotations, then its pod template's."""
    own = (obj.get("metadata") or {}).get("annotations")
    template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return job_model(own, template.get("annotations"))
