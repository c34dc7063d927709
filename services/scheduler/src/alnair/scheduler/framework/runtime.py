"""The Framework: runs one pod through a profile's plugins and explains the outcome.

`Framework(profile).schedule(pod, snapshot, rng)` returns a `ScheduleResult`: the chosen node and
GPUs (a `Placement`), or the reasons no node fits, plus the per-node scores for explanation. It
never changes the snapshot; the caller decides what to do with the placement:

- the simulator calls `snapshot.assume(pod, placement)` at once (pods never fail to bind);
- the live binder does the same before its asynchronous binding cycle (`pre_bind`, `bind`),
  like the upstream scheduler cache, and calls `unreserve` and `snapshot.forget(pod.key)` if
  the binding fails. It writes `ScheduleResult.message()` into the pod's condition and Event
  when the status is UNSCHEDULABLE. Bind plugins run only there.

Both act on `ScheduleResult.nomination` (a PostFilter's victims to evict, or a node held for
the pod) and on a WAIT from Permit (the pod is assumed and waits for its gang; `Coscheduling`).
A `what_if` (or `explain`) call is a trial: PostFilter, Reserve and Permit do not run.

Node selection follows upstream `selectHost`: the highest weighted sum of normalized scores
wins, and ties are broken uniformly at random with the cycle's generator (so a seeded run
replays exactly).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.requests import FloatArray, IntArray, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import (
    BindPlugin,
    CycleState,
    Filtered,
    FilterPlugin,
    GpuSelector,
    Nomination,
    NormalizeScorePlugin,
    PermitPlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScheduleResult,
    ScorePlugin,
)
from alnair.scheduler.framework.status import SKIP, Code, Status, error, unschedulable

TIE_BREAKS = ("random", "first")
"""How equal best scores are resolved: uniformly at random (upstream `selectHost`), or the
first node in snapshot order (deterministic; the paper's simulator behaves this way)."""


@dataclass(frozen=True, slots=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: float = 1.0


@dataclass(frozen=True)
class Profile:
    """The plugins enabled at each extension point, in order (a scheduler profile)."""

    name: str
    filter: Sequence[FilterPlugin]
    score: Sequence[WeightedScore]
    gpu_selector: GpuSelector
    pre_filter: Sequence[PreFilterPlugin] = ()
    post_filter: Sequence[PostFilterPlugin] = ()
    pre_score: Sequence[PreScorePlugin] = ()
    reserve: Sequence[ReservePlugin] = ()
    permit: Sequence[PermitPlugin] = ()
    pre_bind: Sequence[PreBindPlugin] = ()
    bind: Sequence[BindPlugin] = ()


class Framework:
    """Runs pods through one `Profile`."""

    def __init__(self, profile: Profile, *, tie_break: str = "random") -> None:
        if tie_break not in TIE_BREAKS:
            raise InvalidValueError("tie_break", tie_break, f"known: {', '.join(TIE_BREAKS)}")
        self.profile = profile
        self.tie_break = tie_break
        # Protocol isinstance checks are slow; decide once which plugins normalize.
        self._normalizers = {
            id(w.plugin): w.plugin
            for w in profile.score
            if isinstance(w.plugin, NormalizeScorePlugin)
        }

    @property
    def name(self) -> str:
        return self.profile.name

    def schedule(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        rng: np.random.Generator,
        *,
        explain: bool = False,
        what_if: bool = False,
    ) -> ScheduleResult:
        """Choose a node and GPUs for `pod` on `snapshot` (which is not modified)."""
        profile = self.profile
        trial = what_if or explain
        state = CycleState(rng=rng, what_if=trial, handle=self)
        total = len(snapshot)

        for pre in profile.pre_filter:
            status = pre.pre_filter(pod, snapshot, state)
            if status.code is Code.SKIP:
                state.skip_filter.add(pre.NAME)
            elif not status.ok:
                status = status.with_plugin(pre.NAME)
                result = ScheduleResult(status, nodes_total=total, state=state, pre_filtered=True)
                if status.code is Code.UNSCHEDULABLE and not trial:
                    result.nomination = self._post_filter(pod, snapshot, state, Filtered({}))
                return result

        nodes = np.arange(total, dtype=np.int64)
        reasons: Counter[str] = Counter()
        by_reason: list[tuple[str, IntArray]] = []
        node_reasons: dict[int, str] = {}
        for plug in profile.filter:
            if nodes.size == 0:
                break
            if plug.NAME in state.skip_filter:
                continue
            verdict = plug.filter(pod, snapshot, state, nodes)
            failed = ~verdict.passed
            if failed.any():
                unexplained = failed.copy()
                for reason, mask in verdict.failures:
                    hit = unexplained & mask
                    count = int(hit.sum())
                    if count:
                        reasons[reason] += count
                        by_reason.append((reason, nodes[hit]))
                        if explain:
                            node_reasons.update((int(n), reason) for n in nodes[hit])
                        unexplained &= ~mask
                rest = int(unexplained.sum())
                if rest:
                    reasons[plug.NAME] += rest
                    by_reason.append((plug.NAME, nodes[unexplained]))
                    if explain:
                        node_reasons.update((int(n), plug.NAME) for n in nodes[unexplained])
                nodes = nodes[verdict.passed]

        if nodes.size == 0:
            counts = dict(reasons)
            result = ScheduleResult(
                unschedulable("no node fits", "Filter"),
                nodes_total=total,
                reasons=counts,
                node_reasons=node_reasons,
                state=state,
            )
            if not trial:
                filtered = Filtered(counts, tuple(by_reason))
                result.nomination = self._post_filter(pod, snapshot, state, filtered)
            return result

        for pre_score in profile.pre_score:
            status = pre_score.pre_score(pod, snapshot, state, nodes)
            if status.code is Code.SKIP:
                state.skip_score.add(pre_score.NAME)
            elif not status.ok:
                return ScheduleResult(
                    status.with_plugin(pre_score.NAME), nodes_total=total, state=state
                )

        totals = np.zeros(nodes.size, dtype=np.float64)
        per_plugin: dict[str, FloatArray] = {}
        for weighted in profile.score:
            if weighted.plugin.NAME in state.skip_score:
                continue
            raw = weighted.plugin.score(pod, snapshot, state, nodes)
            normalizer = self._normalizers.get(id(weighted.plugin))
            if normalizer is not None:
                raw = normalizer.normalize_score(pod, state, raw)
            per_plugin[weighted.plugin.NAME] = raw
            totals += weighted.weight * raw

        best = np.flatnonzero(totals == totals.max())
        if best.size == 1 or self.tie_break == "first":
            pick = int(best[0])
        else:
            pick = int(best[rng.integers(best.size)])
        node = int(nodes[pick])

        gpus: tuple[int, ...] = ()
        if pod.num_gpu:
            chosen = profile.gpu_selector.select_gpus(pod, snapshot, state, node)
            if chosen is None:
                return ScheduleResult(
                    unschedulable("no GPU fits on the chosen node", profile.gpu_selector.NAME),
                    nodes_total=total,
                    state=state,
                )
            gpus = chosen
        placement = Placement(
            node=node, node_name=snapshot.names[node], gpu_indices=gpus, gpu_milli=pod.gpu_milli
        )
        result = ScheduleResult(
            Status(),
            placement=placement,
            nodes_total=total,
            feasible=nodes,
            scores=totals,
            plugin_scores=per_plugin,
            reasons=dict(reasons),
            node_reasons=node_reasons,
            state=state,
        )
        if trial:
            return result

        reserved: list[ReservePlugin] = []
        for res in profile.reserve:
            status = res.reserve(pod, snapshot, state, placement)
            if not status.ok:
                for done in reversed(reserved):
                    done.unreserve(pod, snapshot, state, placement)
                return ScheduleResult(status.with_plugin(res.NAME), nodes_total=total, state=state)
            reserved.append(res)
        for permit in profile.permit:
            status = permit.permit(pod, snapshot, state, placement)
            if status.code is Code.WAIT:
                result.status = status.with_plugin(permit.NAME)
            elif not status.ok:
                for done in reversed(reserved):
                    done.unreserve(pod, snapshot, state, placement)
                return ScheduleResult(
                    status.with_plugin(permit.NAME), nodes_total=total, state=state
                )
        return result

    def _post_filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, filtered: Filtered
    ) -> Nomination | None:
        for post in self.profile.post_filter:
            answer = post.post_filter(pod, snapshot, state, filtered)
            if answer.nomination is not None:
                return answer.nomination
        return None

    def unreserve(self, pod: PodRequest, snapshot: ClusterSnapshot, result: ScheduleResult) -> None:
        """Undo every Reserve of `result` (a binding that failed, a gang that timed out)."""
        if result.placement is None:
            return
        state = result.state or CycleState(rng=np.random.default_rng(0), handle=self)
        for res in reversed(self.profile.reserve):
            res.unreserve(pod, snapshot, state, result.placement)

    async def pre_bind(
        self, pod: PodRequest, snapshot: ClusterSnapshot, result: ScheduleResult
    ) -> Status:
        """PreBind: what the Binding needs made real first; the first failure is returned."""
        assert result.placement is not None
        assert result.state is not None
        for plugin in self.profile.pre_bind:
            status = await plugin.pre_bind(pod, snapshot, result.state, result.placement)
            if not status.ok:
                return status.with_plugin(plugin.NAME)
        return Status()

    async def bind(self, pod: PodRequest, result: ScheduleResult) -> Status:
        """Bind: the first plugin that does not SKIP makes the placement real."""
        assert result.placement is not None
        assert result.state is not None
        for plugin in self.profile.bind:
            status = await plugin.bind(pod, result.state, result.placement)
            if status.code is not Code.SKIP:
                return status.with_plugin(plugin.NAME)
        return error("no Bind plugin took the pod") if self.profile.bind else SKIP
