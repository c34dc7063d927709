"""Building a throughput model by name."""

from __future__ import annotations

from alnair.predictor.learned import BaselineThroughput, LearnedThroughput
from alnair.predictor.ratio import RatioThroughput
from alnair.predictor.throughput import ModelKind, ThroughputModel


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
        return RatioThroughput(
            level, calibration_folds, features_model=features_model, on_type=on_type
        )
    return LearnedThroughput(kind, level, calibration_folds, features_model=features_model)
