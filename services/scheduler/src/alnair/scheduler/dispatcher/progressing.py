"""A workload's training progress as the queue plans with it (`alnair.common.progress`).

The aggregator keeps the furthest progress a workload's pods reported on the workload (step,
total steps, last checkpoint). The queue uses two things from it:

- **remaining time**: a job's predicted runtime is for the whole job; a job that resumes
  keeps what its last checkpoint holds, so it is planned with `runtime x (1 - kept)`. The
  share kept is fixed when a run starts (`alnair.io/resumed-from-step`, written with the
  admission), since a running job's planned end is its start plus what was left then.
- **what a stop costs**: the restart cost of the job (reload and warm up) plus the time of
  the steps done since its last checkpoint, which a preemption or a move does again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from alnair.common.progress import Progress, from_annotations
from alnair.scheduler.queueing.model import RuntimeEstimate

ANN_RESUMED_STEP = "alnair.io/resumed-from-step"
"""The checkpoint step the current run started from (written with the admission)."""


@dataclass(frozen=True, slots=True)
class PlannedProgress:
    """Progress as planned: what was reported, the share a run keeps, the time a stop loses."""

    reported: Progress | None
    kept: float
    """Share of the job done before this run (running) or kept by a restart (waiting)."""
    lost_s: float
    """Seconds of work a stop now would do again (steps since the last checkpoint)."""

    def describe(self) -> dict[str, object] | None:
        if self.reported is None:
            return None
        p = self.reported
        return {
            "step": p.step,
            "total_steps": p.total,
            "checkpoint_step": p.checkpoint,
            "source": p.source,
            "done_pct": None if p.fraction is None else round(100 * p.fraction, 1),
            "kept_pct": round(100 * self.kept, 1),
            "lost_on_stop_s": round(self.lost_s, 1),
        }


def _step(raw: str | None) -> int | None:
    try:
        value = int(raw or "")
    except ValueError:
        return None
    return value if value >= 0 else None


def planned_progress(
    annotations: Mapping[str, str], runtime: Mapping[str, RuntimeEstimate], running_on: str | None
) -> PlannedProgress:
    """The workload's progress for planning (module docstring); `running_on` is the GPU type
    of its current run, None while it waits."""
    reported = from_annotations(annotations)
    if reported is None or not reported.total:
        return PlannedProgress(reported, 0.0, 0.0)
    if running_on is not None:
        resumed = _step(annotations.get(ANN_RESUMED_STEP)) or 0
        kept = min(1.0, resumed / reported.total)
    else:
        kept = reported.kept_fraction
    lost_s = 0.0
    full = runtime.get(running_on) if running_on else None
    if full is None and runtime:
        full = min(runtime.values(), key=lambda e: e.expected_s)
    if running_on is not None and full is not None:
        lost_s = reported.lost_steps * full.expected_s / reported.total
    return PlannedProgress(reported, kept, lost_s)


def remaining(runtime: Mapping[str, RuntimeEstimate], kept: float) -> dict[str, RuntimeEstimate]:
    """The whole-job runtimes scaled to the share not yet kept."""
    left = max(0.0, 1.0 - kept)
    if left >= 1.0:
        return dict(runtime)
    return {
        t: RuntimeEstimate(max(e.expected_s * left, 1.0), max(e.upper_s * left, 1.0))
        for t, e in runtime.items()
    }
