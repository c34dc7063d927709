"""Where the chosen predictor's error on unseen (job, GPU type) pairs comes from. Prints JSON.

    python bench/predictor_error_split.py

Protocol (a') of `alnair predictor evaluate`: every (job, GPU type) pair of the Gavel table,
all its GPU counts, is held out on its own and the `ratio` model (nested stacking weights, as
the evaluation fits it) predicts it from everything else. Each held-out pair's error is split
in two, in log space:

- level: the geometric mean of the pair's predictions over its GPU counts against that of its
  measurements (how fast the job is on that GPU type overall);
- shape: how the predictions move from count to count around their level, against the
  measurements.

`true_level_model_shape` gives the model the pair's true level (information no held-out model
has) and keeps its count shape; `model_level_true_shape` keeps its level and gives it the true
shape. The issue's goal is a MAPE of 10%; these two figures say which part stands in the way.
For comparison, `true_level_sibling_shape` and `true_level_other_jobs_shape` take the shape
from the same model's batch-size siblings on that GPU, or from all other jobs (medians).
Pairs measured at one GPU count only have no shape: their error is all level.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict

from alnair.predictor.datasets import JobKey, Observation, load_gavel
from alnair.predictor.evaluation import single_pair_folds
from alnair.predictor.gpus import lookup_gpu
from alnair.predictor.ratio import RatioThroughput
from alnair.predictor.throughput import ThroughputQuery

Table = dict[JobKey, dict[tuple[str, int], float]]


def _centred(values: dict[int, float]) -> dict[int, float]:
    mean = math.fsum(values.values()) / len(values)
    return {c: v - mean for c, v in values.items()}


def _median_shape(
    table: Table, jobs: list[JobKey], gpu: str, counts: list[int]
) -> dict[int, float] | None:
    shapes = [
        _centred({c: table[j][(gpu, c)] for c in counts})
        for j in jobs
        if all((gpu, c) in table[j] for c in counts)
    ]
    if not shapes:
        return None
    return {c: statistics.median(s[c] for s in shapes) for c in counts}


def _ape(log_prediction: float, truth: float) -> float:
    return abs(math.exp(log_prediction) - truth) / truth


def split(observations: list[Observation]) -> dict[str, dict[str, float | int]]:
    table: Table = defaultdict(dict)
    for obs in observations:
        table[obs.job][(obs.gpu_type, obs.gpu_count)] = math.log(obs.throughput)
    errors: dict[str, list[float]] = defaultdict(list)
    for train, test in single_pair_folds(observations):
        model = RatioThroughput(features_model=False)
        model.fit(train)
        queries = [ThroughputQuery(o.job, lookup_gpu(o.gpu_type), o.gpu_count) for o in test]
        predicted = {
            o.gpu_count: log
            for o, (log, _basis) in zip(test, model.predict_log(queries), strict=True)
        }
        job, gpu = test[0].job, test[0].gpu_type
        counts = sorted(predicted)
        truth = {c: table[job][(gpu, c)] for c in counts}
        level_true = math.fsum(truth.values()) / len(truth)
        level_model = math.fsum(predicted.values()) / len(predicted)
        shape_model, shape_true = _centred(predicted), _centred(truth)
        others = [j for j in table if j != job]
        everyone = _median_shape(table, others, gpu, counts) or dict.fromkeys(counts, 0.0)
        siblings = [j for j in others if j.model_name == job.model_name]
        sibling = _median_shape(table, siblings, gpu, counts) or everyone
        for c in counts:
            actual = math.exp(truth[c])
            errors["model"].append(_ape(predicted[c], actual))
            errors["true_level_model_shape"].append(_ape(level_true + shape_model[c], actual))
            errors["model_level_true_shape"].append(_ape(level_model + shape_true[c], actual))
            errors["true_level_sibling_shape"].append(_ape(level_true + sibling[c], actual))
            errors["true_level_other_jobs_shape"].append(_ape(level_true + everyone[c], actual))
    return {
        name: {
            "mape": round(statistics.fmean(v), 4),
            "median_ape": round(statistics.median(v), 4),
            "n": len(v),
        }
        for name, v in errors.items()
    }


def main() -> int:
    started = time.perf_counter()
    figures = split(list(load_gavel().alone))
    print(
        json.dumps(
            {
                "benchmark": "predictor-error-split",
                "protocol": "a_single_pair",
                "model": "ratio",
                "goal_mape": 0.10,
                "figures": figures,
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
