"""How far a training job is, and where its last checkpoint is: read from the job, kept on it.

A job reports progress in one of three ways, read by the profiler's node agent in this order
of preference (the first that answers wins, and is named as the source):

1. **metric**: its pod says where its Prometheus metrics are (annotation
   `alnair.io/progress-metrics: "<port>[/<path>]"`, path `/metrics` by default) and exposes
   the gauges `alnair_train_step`, `alnair_train_total_steps` and
   `alnair_train_checkpoint_step`;
2. **log**: its namespace is one the platform opted in (the agent's
   `progress_log_namespaces`: reading logs is not a cluster-wide grant), and its log lines
   match a pattern (`alnair.io/progress-log-pattern` on the pod, else `DEFAULT_LOG_PATTERN`,
   which reads "step 120/400" and "checkpoint at step 100" in the shapes most trainers print);
3. **annotation**: the trainer keeps `alnair.io/progress-step`, `alnair.io/total-steps` and
   `alnair.io/checkpoint-step` on its own pod.

The aggregator keeps the furthest progress of a workload's pods on the workload itself, in the
same three annotations plus `alnair.io/progress-source`; the dispatcher reads them there: a
job's predicted remaining time is its predicted runtime times the share not yet done, and a
preemption or move loses the steps since the last checkpoint (`lost_steps`).

Moves are announced the Kubernetes way: the pods are deleted with their termination grace
period, so a trainer checkpoints on SIGTERM (`examples/checkpointing/trainer.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

ANN_METRICS: Final = "alnair.io/progress-metrics"
ANN_LOG_PATTERN: Final = "alnair.io/progress-log-pattern"
ANN_STEP: Final = "alnair.io/progress-step"
ANN_TOTAL: Final = "alnair.io/total-steps"
ANN_CHECKPOINT: Final = "alnair.io/checkpoint-step"
ANN_SOURCE: Final = "alnair.io/progress-source"
ANNOTATIONS: Final = (ANN_STEP, ANN_TOTAL, ANN_CHECKPOINT, ANN_SOURCE)
ANN_PREEMPTIONS: Final = "alnair.io/preemptions"
"""How often the dispatcher stopped the workload (written by the dispatcher)."""

METRIC_STEP: Final = "alnair_train_step"
METRIC_TOTAL: Final = "alnair_train_total_steps"
METRIC_CHECKPOINT: Final = "alnair_train_checkpoint_step"

DEFAULT_LOG_PATTERN: Final = (
    r"(?i)\bstep[\s:=]+(?P<step>\d+)(?:\s*(?:/|of)\s*(?P<total>\d+))?"
    r"|\bcheckpoint\w*\b[^\d\n]*?(?P<checkpoint>\d+)"
)
"""Matches "step 120/400", "Step: 120 of 400", "step=120" and "saved checkpoint at step 100".
A custom pattern names the same groups (`step`, `total`, `checkpoint`); any may be absent."""

Source = Literal["metric", "log", "annotation"]


@dataclass(frozen=True, slots=True)
class Progress:
    """Steps done, steps in all (None: unknown), the last checkpoint's step (None: none)."""

    step: int
    total: int | None = None
    checkpoint: int | None = None
    source: Source = "annotation"

    @property
    def fraction(self) -> float | None:
        """Share of the job done, 0..1; None when the total is unknown."""
        if not self.total:
            return None
        return min(1.0, max(0.0, self.step / self.total))

    @property
    def kept_fraction(self) -> float:
        """Share of the job a restart keeps (up to the last checkpoint), 0 when unknown."""
        if not self.total or self.checkpoint is None:
            return 0.0
        return min(1.0, max(0.0, self.checkpoint / self.total))

    @property
    def lost_steps(self) -> int:
        """Steps a restart now would do again (done since the last checkpoint)."""
        return max(0, self.step - (self.checkpoint or 0))

    def furthest(self, other: Progress | None) -> Progress:
        """The further of two reports (data-parallel workers report one global step)."""
        if other is None:
            return self
        if (other.step, other.checkpoint or -1) > (self.step, self.checkpoint or -1):
            return other
        return self

    def annotations(self) -> dict[str, str]:
        out = {ANN_STEP: str(self.step), ANN_SOURCE: self.source}
        if self.total is not None:
            out[ANN_TOTAL] = str(self.total)
        if self.checkpoint is not None:
            out[ANN_CHECKPOINT] = str(self.checkpoint)
        return out


def _count(raw: Any) -> int | None:
    if raw is None:
        return None
    try:
        value = float(str(raw).strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _checked(
    step: int | None, total: int | None, ckpt: int | None, source: Source
) -> Progress | None:
    if step is None and ckpt is None:
        return None
    step = max(step or 0, ckpt or 0)
    if total is not None and total <= 0:
        total = None
    return Progress(step, total, ckpt, source)


def from_annotations(annotations: Mapping[str, Any] | None) -> Progress | None:
    """Progress kept in annotations (a trainer's pod, or the workload); None when absent or
    not counts."""
    ann = annotations or {}
    source = ann.get(ANN_SOURCE)
    return _checked(
        _count(ann.get(ANN_STEP)),
        _count(ann.get(ANN_TOTAL)),
        _count(ann.get(ANN_CHECKPOINT)),
        source if source in ("metric", "log", "annotation") else "annotation",
    )


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def from_metrics(text: str) -> Progress | None:
    """Progress in a Prometheus text exposition (the gauges named in the module); the largest
    value of each across label sets."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in (METRIC_STEP, METRIC_TOTAL, METRIC_CHECKPOINT):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            found[match["name"]] = max(found.get(match["name"], 0.0), value)

    def get(name: str) -> int | None:
        return int(found[name]) if name in found else None

    return _checked(get(METRIC_STEP), get(METRIC_TOTAL), get(METRIC_CHECKPOINT), "metric")


def log_pattern(raw: str | None) -> re.Pattern[str]:
    """The pattern a pod asks for, or the default; raises ValueError naming a bad one."""
    if not raw:
        return re.compile(DEFAULT_LOG_PATTERN)
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise ValueError(f"{ANN_LOG_PATTERN}={raw!r}: {exc}") from None
    if not {"step", "checkpoint"} & set(pattern.groupindex):
        raise ValueError(f"{ANN_LOG_PATTERN}={raw!r}: names neither a step nor a checkpoint group")
    return pattern


def from_log(lines: Iterable[str], pattern: re.Pattern[str]) -> Progress | None:
    """The last step, total and checkpoint the log lines mention."""
    step = total = ckpt = None
    for line in lines:
        for match in pattern.finditer(line):
            groups = match.groupdict()
            if groups.get("step") is not None:
                step = int(groups["step"])
            if groups.get("total") is not None:
                total = int(groups["total"])
            if groups.get("checkpoint") is not None:
                ckpt = int(groups["checkpoint"])
    return _checked(step, total, ckpt, "log")
