"""The registry: every placement policy by name, as a profile of plugins.

One explicit list (no discovery magic), as upstream scheduler-plugins keeps it. Each policy is
the default filters (CPU/memory fit, GPU model, GPU fit) plus one Score plugin and the GPU
selector that policy implies. Policies that measure fragmentation need the workload's typical
pods, so building a profile takes the workload (the trace in the simulator, recent pods live).

Names are case-insensitive and accept the paper's spellings (`DotProd`, `BestFit`, `FGD`).

`build_profile` is the one way to a runnable profile, for the simulator and the live binder
alike: the policy's plugins plus the cluster plugins (taints, node and pod affinity, topology
spread, other resources, node reservations, GPU health, utilization, co-location interference
when a table is given, topology-aware GPUs, coscheduling, preemption, nominated pods' room). On
a snapshot without labels, taints, terms, gangs or priorities the cluster plugins return SKIP
from PreFilter/PreScore, so a trace replays as the policy alone.
`ProfileOptions` carries what differs: the utilization weight, the starvation guard, the
clock, and plugins a deployment adds (the live Binding; DRA's DynamicResources at PreFilter,
Filter, GPU choice, Reserve and PreBind).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.framework.interface import (
    BindPlugin,
    FilterPlugin,
    GpuSelector,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScorePlugin,
)
from alnair.scheduler.framework.runtime import Framework, Profile, WeightedScore
from alnair.scheduler.placement import BestFitGpu, RandomGpu, WorstFitGpu
from alnair.scheduler.plugins.allocation import BinpackScore, SpreadScore
from alnair.scheduler.plugins.alnair_policy import AlnairScore
from alnair.scheduler.plugins.alnair_policy import typical_pods as alnair_typical_pods
from alnair.scheduler.plugins.best_fit import BestFitScore
from alnair.scheduler.plugins.constraints import (
    InterPodAffinity,
    NodeAffinity,
    NodeSelector,
    PodTopologySpread,
    PreferredInterPodAffinity,
    PreferredNodeAffinity,
    TaintToleration,
)
from alnair.scheduler.plugins.coscheduling import Coscheduling
from alnair.scheduler.plugins.dot_product import DotProductScore
from alnair.scheduler.plugins.fgd import FGDScore
from alnair.scheduler.plugins.fit import DEFAULT_FILTERS, GpuFit
from alnair.scheduler.plugins.fragmentation import TypicalPods
from alnair.scheduler.plugins.gpu_clustering import GpuClusteringScore
from alnair.scheduler.plugins.gpu_packing import GpuPackingScore
from alnair.scheduler.plugins.interference import (
    DEFAULT_MAX_SLOWDOWN,
    DEFAULT_MAX_UTIL_PCT,
    ColocationBook,
    Interference,
    InterferenceAwareGpus,
)
from alnair.scheduler.plugins.node_state import (
    GpuHealth,
    GpuUtilization,
    NodeResourcesExtra,
    TopologyAwareGpus,
)
from alnair.scheduler.plugins.preemption import DefaultPreemption, NominatedPods
from alnair.scheduler.plugins.random_score import RandomScore
from alnair.scheduler.plugins.reservation import NodeReservation


@dataclass(frozen=True)
class Policy:
    name: str
    """Canonical name (the paper's where it has one)."""
    summary: str
    build: Callable[[Sequence[PodRequest]], Profile]
    baseline: bool = False
    """Published in the FGD paper, so `fgd_reference.csv` has its numbers."""


def _profile(
    name: str,
    score: ScorePlugin,
    selector: GpuSelector,
    pre_score: Sequence[PreScorePlugin] = (),
) -> Profile:
    return Profile(
        name=name,
        filter=DEFAULT_FILTERS,
        score=(WeightedScore(score),),
        gpu_selector=selector,
        pre_score=pre_score,
    )


def _random(_: Sequence[PodRequest]) -> Profile:
    plugin = RandomScore()
    return _profile("Random", plugin, RandomGpu(), pre_score=(plugin,))


def _fgd(workload: Sequence[PodRequest]) -> Profile:
    plugin = FGDScore(TypicalPods.from_pods(workload))
    return _profile("FGD", plugin, plugin)


def _alnair(workload: Sequence[PodRequest]) -> Profile:
    plugin = AlnairScore(alnair_typical_pods(list(workload)))
    return _profile("alnair", plugin, plugin)


POLICIES: tuple[Policy, ...] = (
    Policy("Random", "uniformly random feasible node and GPU", _random, baseline=True),
    Policy(
        "DotProd",
        "Tetris dot product of free and requested CPU/GPU",
        lambda _: _profile("DotProd", DotProductScore(), BestFitGpu()),
        baseline=True,
    ),
    Policy(
        "GpuClustering",
        "keep pods of one GPU kind together",
        lambda _: _profile("GpuClustering", GpuClusteringScore(), BestFitGpu()),
        baseline=True,
    ),
    Policy(
        "GpuPacking",
        "shared GPUs first, then used nodes, then idle nodes",
        lambda _: _profile("GpuPacking", GpuPackingScore(), BestFitGpu()),
        baseline=True,
    ),
    Policy(
        "BestFit",
        "least CPU and GPU left after placement",
        lambda _: _profile("BestFit", BestFitScore(), BestFitGpu()),
        baseline=True,
    ),
    Policy("FGD", "fragmentation gradient descent (ATC'23)", _fgd, baseline=True),
    Policy(
        "binpack",
        "most allocated CPU, memory and GPU",
        lambda _: _profile("binpack", BinpackScore(), BestFitGpu()),
    ),
    Policy(
        "spread",
        "least allocated CPU, memory and GPU",
        lambda _: _profile("spread", SpreadScore(), WorstFitGpu()),
    ),
    Policy("alnair", "fragmentation gradient descent that also sees memory", _alnair),
)

_ALIASES = {"dotproduct": "DotProd", "dot": "DotProd", "best-fit": "BestFit"}


def policy(name: str) -> Policy:
    """The policy called `name` (case-insensitive; the paper's spellings work)."""
    wanted = _ALIASES.get(name.lower(), name).lower()
    for candidate in POLICIES:
        if candidate.name.lower() == wanted:
            return candidate
    known = ", ".join(p.name for p in POLICIES)
    raise InvalidValueError("policy", name, f"unknown policy (known: {known})")


@dataclass(frozen=True)
class ProfileOptions:
    """What a profile's user chooses beyond the policy (see `build_profile`)."""

    utilization_weight: float = 0.0
    """Weight of the measured-GPU-use score (0: not in the profile)."""
    starvation_after_s: float = 0.0
    """A pod pending this long reserves a node (0: never)."""
    max_reserved_nodes: int = 0
    clock: Callable[[], float] = time.time
    """Seconds since the epoch, or the simulation's time."""
    pre_filter: Sequence[PreFilterPlugin] = ()
    """Run after the cluster PreFilters (DRA's DynamicResources)."""
    filter: Sequence[FilterPlugin] = ()
    """Run after every other Filter, once the cheaper ones have narrowed the nodes."""
    colocation: ColocationBook | None = None
    """The predictor's co-location table in force; None: no interference plugin."""
    max_colocation_slowdown: float = DEFAULT_MAX_SLOWDOWN
    max_sharing_util_pct: float = DEFAULT_MAX_UTIL_PCT
    interference_weight: float = 1.0
    """Weight of the co-location score (the caps filter regardless)."""
    gpu_selector: Callable[[GpuSelector], GpuSelector] | None = None
    """Wraps the profile's GPU choice (DRA holds it to the devices that can take the claim)."""
    reserve: Sequence[ReservePlugin] = ()
    pre_bind: Sequence[PreBindPlugin] = ()
    bind: Sequence[BindPlugin] = ()


def build_profile(
    name: str, workload: Sequence[PodRequest], options: ProfileOptions | None = None
) -> Profile:
    """The named policy's profile with every cluster plugin registered (module docstring)."""
    opts = options or ProfileOptions()
    base = policy(name).build(workload)
    gang = Coscheduling()
    reservation = NodeReservation(opts.starvation_after_s, opts.max_reserved_nodes, opts.clock)
    spread = PodTopologySpread()
    health = GpuHealth()
    extra = NodeResourcesExtra()
    taints, selector, affinity, pods = (
        TaintToleration(),
        NodeSelector(),
        NodeAffinity(),
        InterPodAffinity(),
    )
    filters: list[FilterPlugin] = [taints, selector, affinity, pods, spread, reservation]
    for f in base.filter:
        if isinstance(f, GpuFit):
            filters.append(health)
        filters.append(f)
    nominated = NominatedPods()
    filters.extend((extra, nominated))
    filters.extend(opts.filter)
    pre_filters: list[PreFilterPlugin] = [
        *base.pre_filter,
        *(taints, selector, affinity, pods, spread, reservation, health, extra, nominated, gang),
        *opts.pre_filter,
    ]
    node_affinity, pod_affinity = PreferredNodeAffinity(), PreferredInterPodAffinity()
    scores = [
        *base.score,
        WeightedScore(node_affinity),
        WeightedScore(pod_affinity),
        WeightedScore(spread),
    ]
    pre_scores: list[PreScorePlugin] = [*base.pre_score, node_affinity, pod_affinity, spread]
    if opts.utilization_weight > 0:
        utilization = GpuUtilization()
        scores.append(WeightedScore(utilization, opts.utilization_weight))
        pre_scores.append(utilization)
    gpus: GpuSelector = TopologyAwareGpus(base.gpu_selector)
    if opts.colocation is not None:
        interference = Interference(
            opts.colocation, opts.max_colocation_slowdown, opts.max_sharing_util_pct
        )
        filters.append(interference)
        pre_filters.append(interference)
        pre_scores.append(interference)
        if opts.interference_weight > 0:
            scores.append(WeightedScore(interference, opts.interference_weight))
        gpus = InterferenceAwareGpus(gpus, interference)
    if opts.gpu_selector is not None:
        gpus = opts.gpu_selector(gpus)
    return Profile(
        name=base.name,
        pre_filter=tuple(pre_filters),
        filter=tuple(filters),
        post_filter=(*base.post_filter, DefaultPreemption(opts.clock), reservation),
        pre_score=tuple(pre_scores),
        score=tuple(scores),
        gpu_selector=gpus,
        reserve=(*base.reserve, reservation, *opts.reserve),
        permit=(*base.permit, gang),
        pre_bind=(*base.pre_bind, *opts.pre_bind),
        bind=(*base.bind, *opts.bind),
    )


def framework(
    name: str,
    workload: Sequence[PodRequest],
    *,
    tie_break: str = "random",
    options: ProfileOptions | None = None,
) -> Framework:
    """A Framework running the named policy, tuned to `workload`'s typical pods."""
    return Framework(build_profile(name, workload, options), tie_break=tie_break)
