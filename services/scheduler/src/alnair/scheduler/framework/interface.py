"""The extension points: one protocol per point of the upstream scheduling cycle.

A pod goes PreFilter -> Filter -> (PostFilter when PreFilter or Filter rejects it) -> PreScore ->
Score -> NormalizeScore -> node selection -> GPU choice -> Reserve -> Permit; its binding cycle
is PreBind -> Bind (Unreserve when anything after Reserve fails). The simulator runs the same
cycle and "binds" by assuming the placement in its snapshot; the live binder binds through the
API server. A PreFilter or PreScore plugin that returns SKIP is not run at the matching Filter
or Score point for that pod (upstream's rule), which is how plugins whose data a pod or a
snapshot lacks (labels, taints, pod terms, gangs) cost nothing.

Plugins are pure functions of (pod, snapshot): they read the `ClusterSnapshot` and return a
`Status`, a per-node verdict or per-node scores, and never change the snapshot. Unlike upstream,
Filter and Score see all candidate nodes at once (numpy arrays over node indices) instead of
one node per call: the answers are the same, and a 1,000-node cluster costs one vector
operation instead of a thousand Python calls. Anything a plugin computes in one point and
needs in a later one (the random node of RandomScore, FGD's best GPU per node) goes in the
`CycleState`, which lives for one pod's cycle only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from alnair.scheduler.cluster.requests import BoolArray, FloatArray, IntArray, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.status import Code, Status

MAX_NODE_SCORE = 100.0
MIN_NODE_SCORE = 0.0


@dataclass(slots=True)
class CycleState:
    """Scratch space for one pod's scheduling cycle, plus its random source.

    The random generator is here, not global, so a seeded simulation replays exactly and two
    concurrent cycles never share a stream.
    """

    rng: np.random.Generator
    data: dict[str, object] = field(default_factory=dict)
    skip_filter: set[str] = field(default_factory=set)
    """Plugins whose PreFilter said SKIP: their Filter is not run for this pod."""
    skip_score: set[str] = field(default_factory=set)
    """Plugins whose PreScore said SKIP: their Score is not run for this pod."""
    what_if: bool = False
    """A trial placement (explanation, a gang's or a preemption's what-if): PostFilter, Reserve
    and Permit do not run, and plugins that plan over several pods do not recurse."""
    handle: Handle | None = None
    """The framework running this cycle, for plugins that need a trial placement."""


class Handle(Protocol):
    """What a plugin may ask of the framework running it (upstream's `framework.Handle`)."""

    def schedule(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        rng: np.random.Generator,
        *,
        explain: bool = False,
        what_if: bool = False,
    ) -> ScheduleResult: ...


@dataclass(frozen=True, slots=True)
class Filtered:
    """Why PreFilter or Filter left no node: reason counts, and the nodes behind each reason."""

    counts: dict[str, int]
    by_reason: tuple[tuple[str, IntArray], ...] = ()

    def nodes_where(self, keep: Callable[[str], bool]) -> list[int]:
        """Snapshot indices of the nodes rejected for a reason `keep` accepts."""
        return sorted(int(n) for reason, nodes in self.by_reason if keep(reason) for n in nodes)


@dataclass(frozen=True, slots=True)
class Nomination:
    """What a PostFilter plugin proposes so that the pod fits later: pods to evict (preemption;
    `node_name` is "" when they span several nodes, as for a gang) or a node held for it."""

    node_name: str = ""
    victims: tuple[str, ...] = ()
    """Keys (uids) of the pods to evict."""
    highest_priority: int = 0
    budget_violations: int = 0
    """How many victims are evicted against a PodDisruptionBudget."""
    graceful: tuple[str, ...] = ()
    """Victims that are elastic surplus: deleted with their own grace period."""
    gang: str | None = None
    """Set when the victims make room for a whole gang."""
    message: str = ""
    awaiting: tuple[str, ...] = ()
    """Pods already being evicted on `node_name` (for another preemptor) whose room, beyond
    what is promised to the pods nominated there, this pod waits for (live only)."""

    def describe(self) -> str:
        text = f"preempting {len(self.victims)} pod(s) on {self.node_name}"
        if self.budget_violations:
            text += f" ({self.budget_violations} against a PodDisruptionBudget)"
        return text


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    status: Status
    nomination: Nomination | None = None


@dataclass(frozen=True, slots=True)
class NodeVerdicts:
    """One Filter plugin's answer for every candidate node.

    `passed[i]` says whether candidate i fits; `failures` names the reasons, each with the mask
    of candidates failing for it (the first reason that matches a node is the one reported).
    """

    passed: BoolArray
    failures: tuple[tuple[str, BoolArray], ...] = ()


@runtime_checkable
class Plugin(Protocol):
    NAME: ClassVar[str]


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState) -> Status:
        """Check the pod itself (or precompute for Filter); SKIP when irrelevant."""
        ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> NodeVerdicts:
        """Which of `nodes` (snapshot row indices) can hold the pod, and why not."""
        ...


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        state: CycleState,
        filtered: Filtered,
    ) -> PostFilterResult:
        """Called when PreFilter or Filter left no node (preemption, node holds); the first
        plugin that nominates something ends the point."""
        ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> Status:
        """Precompute over the feasible `nodes` before Score."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, nodes: IntArray
    ) -> FloatArray:
        """One score per feasible node, higher is better, in [0, 100] after normalization."""
        ...


@runtime_checkable
class NormalizeScorePlugin(Plugin, Protocol):
    def normalize_score(self, pod: PodRequest, state: CycleState, scores: FloatArray) -> FloatArray:
        """Rescale this plugin's raw scores (the upstream ScoreExtensions)."""
        ...


@runtime_checkable
class GpuSelector(Plugin, Protocol):
    def select_gpus(
        self, pod: PodRequest, snapshot: ClusterSnapshot, state: CycleState, node: int
    ) -> tuple[int, ...] | None:
        """Which GPUs of the chosen node the pod gets (None: none fit, which Filter prevents)."""
        ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        state: CycleState,
        placement: Placement,
    ) -> Status:
        """Claim resources for the placement before binding; undone by `unreserve`."""
        ...

    def unreserve(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        state: CycleState,
        placement: Placement,
    ) -> None: ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        state: CycleState,
        placement: Placement,
    ) -> Status:
        """SUCCESS to bind now, WAIT to hold (gang), UNSCHEDULABLE to reject."""
        ...


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    async def pre_bind(
        self,
        pod: PodRequest,
        snapshot: ClusterSnapshot,
        state: CycleState,
        placement: Placement,
    ) -> Status:
        """Make what the binding needs real first (a claim's allocation); not OK: Unreserve."""
        ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    async def bind(self, pod: PodRequest, state: CycleState, placement: Placement) -> Status:
        """Make the placement real (the live binder's Kubernetes Binding); SKIP to pass on."""
        ...


@dataclass
class ScheduleResult:
    """What happened to one pod, with enough detail to explain it."""

    status: Status
    placement: Placement | None = None
    nodes_total: int = 0
    feasible: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Snapshot indices of the nodes that passed Filter."""
    scores: FloatArray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    """Weighted total score of each feasible node (aligned with `feasible`)."""
    plugin_scores: dict[str, FloatArray] = field(default_factory=dict)
    """Normalized score per Score plugin (aligned with `feasible`)."""
    reasons: dict[str, int] = field(default_factory=dict)
    """How many nodes each Filter reason rejected."""
    node_reasons: dict[int, str] = field(default_factory=dict)
    """Filter reason per rejected node index (only with `explain=True`)."""
    nomination: Nomination | None = None
    """What a PostFilter plugin proposed (victims to evict, a node held for the pod)."""
    state: CycleState | None = None
    """The cycle's state, which the binding cycle (PreBind, Bind, Unreserve) continues."""
    pre_filtered: bool = False
    """A PreFilter rejected the pod as a whole (its reason is the message)."""

    def message(self) -> str:
        """The sentence users read on the pod, in the upstream shape."""
        if self.pre_filtered and self.status.reason:
            return self.status.reason
        if self.placement is not None:
            gpus = self.placement.annotation_indices()
            where = self.placement.node_name + (f" (GPUs {gpus})" if gpus else "")
            return f"placed on {where}"
        parts = ", ".join(
            f"{n} {r}" for r, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        text = f"0/{self.nodes_total} nodes are available"
        text += f": {parts}." if parts else "."
        if self.status.reason and self.status.code is not Code.UNSCHEDULABLE:
            text += f" {self.status}"
        return text
