"""Job queueing: which pending jobs start now, on which GPU type, and why the others wait.

Pure policies over a `QueueSnapshot` (see `model`), shared by the live dispatcher and the job
simulator (`alnair.scheduler.jobsim`). `quota` is the one implementation of Kueue-style
quotas, cohorts, borrowing and lending every policy uses; `plan` holds the per-decision checks
(constraint, memory, quota, room); `baselines` are `fifo`, `sjf`, `drf`; `alnair` is ours;
`registry` finds them by name.
"""

from alnair.scheduler.queueing.model import (
    Admission,
    ClusterQueueSpec,
    Decisions,
    FlavorQuota,
    GpuPool,
    JobSpec,
    Preemption,
    PreemptionRules,
    QueueSnapshot,
    Reservation,
    RunningJob,
    RuntimeEstimate,
    WaitKind,
    WaitReason,
)
from alnair.scheduler.queueing.quota import QuotaCheck, QuotaLedger
from alnair.scheduler.queueing.registry import QUEUE_POLICIES, QueuePolicy, queue_policy

__all__ = [
    "QUEUE_POLICIES",
    "Admission",
    "ClusterQueueSpec",
    "Decisions",
    "FlavorQuota",
    "GpuPool",
    "JobSpec",
    "Preemption",
    "PreemptionRules",
    "QueuePolicy",
    "QueueSnapshot",
    "QuotaCheck",
    "QuotaLedger",
    "Reservation",
    "RunningJob",
    "RuntimeEstimate",
    "WaitKind",
    "WaitReason",
    "queue_policy",
]
