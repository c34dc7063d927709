"""The scheduling framework shared by the live binder and the trace simulator.

Import from here: `Framework`, `Profile`, `ScheduleResult`, the extension-point protocols, and
`Status`/`Code`. See `runtime` for how a live binder drives it and `interface` for the contract
a plugin implements.
"""

from alnair.scheduler.framework.interface import (
    MAX_NODE_SCORE,
    MIN_NODE_SCORE,
    BindPlugin,
    CycleState,
    Filtered,
    FilterPlugin,
    GpuSelector,
    Handle,
    NodeVerdicts,
    Nomination,
    NormalizeScorePlugin,
    PermitPlugin,
    Plugin,
    PostFilterPlugin,
    PostFilterResult,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScheduleResult,
    ScorePlugin,
)
from alnair.scheduler.framework.runtime import Framework, Profile, WeightedScore
from alnair.scheduler.framework.status import Code, Status

__all__ = [
    "MAX_NODE_SCORE",
    "MIN_NODE_SCORE",
    "BindPlugin",
    "Code",
    "CycleState",
    "FilterPlugin",
    "Filtered",
    "Framework",
    "GpuSelector",
    "Handle",
    "NodeVerdicts",
    "Nomination",
    "NormalizeScorePlugin",
    "PermitPlugin",
    "Plugin",
    "PostFilterPlugin",
    "PostFilterResult",
    "PreBindPlugin",
    "PreFilterPlugin",
    "PreScorePlugin",
    "Profile",
    "ReservePlugin",
    "ScheduleResult",
    "ScorePlugin",
    "Status",
    "WeightedScore",
]
