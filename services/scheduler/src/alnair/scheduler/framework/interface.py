"""The extension points: one protocol per point of the upstream scheduling cycle.

A pod goes PreFilter -> Filter -> (PostFilter when nothing fits) -> PreScore -> Score ->
NormalizeScore -> node selection -> GPU choice -> Reserve -> Permit, then Bind (live binder only).

Plugins are pure functions of (pod, snapshot): they read the `ClusterSnapshot` and return a
`Status`, a per-node verdict or per-node scores, and never change the snapshot. Unlike upstream,
Filter and Score see all candidate nodes at once (numpy arrays over node indices) instead of
one node per call: the answers are the same, and a 1,000-node cluster costs one vector
operation instead of a thousand Python calls. Anything a plugin computes in one point and
needs in a later one (the random node of RandomScore, FGD's best GPU per node) goes in the
`CycleState`, which lives for one pod's cycle only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from alnair.scheduler.framework.status import Status
from alnair.scheduler.snapshot import (
    BoolArray,
    ClusterSnapshot,
    FloatArray,
    IntArray,
    Placement,
    PodRequest,
)

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
        reasons: dict[str, int],
    ) -> Status:
        """Called when no node passed Filter (preemption lives here); `reasons` are counts."""
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
class BindPlugin(Plugin, Protocol):
    async def bind(self, pod: PodRequest, placement: Placement) -> Status:
        """Make the placement real (the live binder's Kubernetes Binding); SKIP to pass on."""
        ...
