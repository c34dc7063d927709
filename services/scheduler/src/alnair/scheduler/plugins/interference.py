"""Co-location interference: where a fraction would slow itself or its neighbours too much.

Seed 000's first finding is that jobs sharing a GPU slow each other by amounts that depend on
the pair, and its packing rule is "GPU util no more than 70%". Two caps follow, applied to a
fractional pod joining a GPU that already holds other fractions:

- **slowdown**: the predictor's co-location table (`alnair.common.colocation`, refreshed on
  each retrain, read in memory: no request per cycle) gives how much each workload keeps next
  to each other on the GPU's type. A GPU is refused when the new pod, or any pod already there,
  would run more than `max_slowdown` times slower than alone (several sharers add up in excess
  slowdown, as the table's module says). Pairs the table does not know are not refused.
- **utilization**: a GPU whose measured use (the sum of its pods' shares, from the profiler)
  is at or past `max_util_pct` takes no further sharer.

`Interference` is a Filter (a node passes when at least one GPU that fits the pod is not
refused), a Score (the node's best acceptable shared GPU by predicted cost: the new pod's
excess slowdown plus what it adds to each pod already there; a node offering only idle GPUs
scores as the best share, so packing against spreading stays the policy's call) and, through
`InterferenceAwareGpus`, the GPU choice: the policy's own pick when it is acceptable, else the
acceptable GPU of least cost. The simulator registers the same plugin with a table of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from alnair.common.colocation import ColocationTable
from alnair.scheduler.cluster.requests import BoolArray, FloatArray, IntArray, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import CycleState, GpuSelector, NodeVerdicts
from alnair.scheduler.framework.status import SKIP, SUCCESS, Status

DEFAULT_MAX_SLOWDOWN = 2.5
"""Equal time-slicing of two saturating jobs is 2.0x; past 2.5x a pair hurts more than sharing
fairly would (the measured pairs reach 100x: a recommendation model next to ResNet-50)."""
DEFAULT_MAX_UTIL_PCT = 70.0
"""Seed 000: "GPU util no more than 70%"."""
UNKNOWN_EXCESS = 1.0
"""Cost of a pair the table does not know, in excess slowdown: as equal time-slicing."""

_STATE_KEY = "Interference"


@dataclass
class ColocationBook:
    """The table in force (replaced as the predictor publishes new ones; None: none yet)."""

    table: ColocationTable | None = None


@dataclass(frozen=True, slots=True)
class GpuJudgement:
    """One GPU that fits the pod: whether it may take it and what sharing would cost."""

    gpu: int
    refused: str | None
    cost: float


class Interference:
    NAME: ClassVar[str] = "Interference"

    def __init__(
        self,
        book: ColocationBook,
        max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
        max_util_pct: float = DEFAULT_MAX_UTIL_PCT,
    ) -> None:
        self.book = book
        self.max_slowdown = max_slowdown
        self.max_util_pct = max_util_pct
        self.slow_reason = f"co-location predicted past {max_slowdown:g}x slowdown"
        self.busy_reason = f"GPU use past the {max_util_pct:g}% sharing cap"

    def _applies(self, pod: PodRequest, snapshot: ClusterSnapshot) -> bool:
        return pod.is_fractional and bool(snapshot.sharers)

    def judge(self, pod: PodRequest, snapshot: ClusterSnapshot, n: int) -> list[GpuJudgement]:
        """Every GPU of node `n` that fits `pod`, judged."""
        table = self.book.table
        label = snapshot.models[int(snapshot.model_id[n])]
        count = int(snapshot.gpu_count[n])
        out = []
        for g in np.flatnonzero(snapshot.gpu_free[n, :count] >= pod.gpu_milli).tolist():
            there = [w for key, w in snapshot.sharers.get((n, g), {}).items() if key != pod.key]
            if not there:
                out.append(GpuJudgement(g, None, 0.0))
                continue
            if snapshot.gpu_util.size and snapshot.gpu_util[n, g] >= self.max_util_pct:
                out.append(GpuJudgement(g, self.busy_reason, float("inf")))
                continue
            refused, cost = self._sharing(table, pod.workload, there, label)
            out.append(GpuJudgement(g, refused, cost))
        return out

    def _sharing(
        self, table: ColocationTable | None, workload: str, there: list[str], label: str
    ) -> tuple[str | None, float]:
        if table is None:
            return None, UNKNOWN_EXCESS * len(there)
        joining = table.join(workload, there, label)
        refused = joining.refused(self.max_slowdown)
        return (self.slow_reason if refused else None), joining.excess(UNKNOWN_EXCESS)

    def _judged(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, n: int
    ) -> list[GpuJudgement]:
        memo = state.data.setdefault(_STATE_KEY, {})
        assert isinstance(memo, dict)
        found = memo.get(n)
        if found is None:
            found = memo[n] = self.judge(pod, snapshot, n)
        return found

    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        return SUCCESS if self._applies(pod, snapshot) else SKIP

    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        shared = {n for n, _g in snapshot.sharers}
        slow: BoolArray = np.zeros(nodes.size, dtype=np.bool_)
        busy: BoolArray = np.zeros(nodes.size, dtype=np.bool_)
        for i, n in enumerate(nodes.tolist()):
            if n not in shared:
                continue
            judged = self._judged(pod, snapshot, state, n)
            if not judged or any(j.refused is None for j in judged):
                continue
            if any(j.refused == self.slow_reason for j in judged):
                slow[i] = True
            else:
                busy[i] = True
        return NodeVerdicts(
            passed=~(slow | busy), failures=((self.slow_reason, slow), (self.busy_reason, busy))
        )

    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        return SUCCESS if self._applies(pod, snapshot) else SKIP

    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        shared = {n for n, _g in snapshot.sharers}
        scale = max(self.max_slowdown - 1.0, 1e-6)
        scores: FloatArray = np.full(nodes.size, np.nan)
        for i, n in enumerate(nodes.tolist()):
            if n not in shared:
                continue
            costs = [
                j.cost
                for j in self._judged(pod, snapshot, state, n)
                if j.refused is None and (n, j.gpu) in snapshot.sharers
            ]
            if costs:
                scores[i] = 100.0 * max(0.0, 1.0 - min(costs) / scale)
        # Only sharing is ranked here: a node offering an idle GPU scores as the best share,
        # so whether to pack or to spread stays the policy's choice (scoring idle GPUs higher
        # spread fractions and left whole-GPU jobs without a GPU in the benchmark).
        best = float(np.nanmax(scores)) if np.isfinite(scores).any() else 100.0
        out: FloatArray = np.where(np.isnan(scores), best, scores)
        return out

    def choose(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, n: int, picked: int
    ) -> int | None:
        """The GPU to use on node `n` given the policy's pick: the pick when acceptable, else
        the acceptable GPU of least cost (the fullest first on ties); None when none is."""
        judged = [j for j in self._judged(pod, snapshot, state, n) if j.refused is None]
        if any(j.gpu == picked for j in judged):
            return picked
        if not judged:
            return None
        best = min(judged, key=lambda j: (j.cost, int(snapshot.gpu_free[n, j.gpu]), j.gpu))
        return best.gpu


class InterferenceAwareGpus:
    """GPU selector: the base selector's choice, moved off a GPU `Interference` refuses."""

    NAME: ClassVar[str] = "InterferenceAwareGpus"

    def __init__(self, base: GpuSelector, plugin: Interference) -> None:
        self.base = base
        self.plugin = plugin

    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        picked = self.base.select_gpus(pod, snapshot, state, node)
        if picked is None or not pod.is_fractional or not snapshot.sharers:
            return picked
        chosen = self.plugin.choose(pod, snapshot, state, node, picked[0])
        return None if chosen is None else (chosen,)
