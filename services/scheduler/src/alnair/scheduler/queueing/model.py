"""The job-queueing vocabulary: a snapshot of jobs, queues and GPUs in, decisions out.

This is the top layer of the scheduler (admission of *jobs*, not placement of pods). Every
queueing policy is a pure function `QueueSnapshot -> Decisions`: no I/O, no clock, no hidden
state. The live dispatcher builds a snapshot from its informers and the predictor's answers
and acts on the decisions (unsuspend, suspend, Events); the job simulator builds snapshots
from a trace and applies the decisions to its own event heap. Both therefore run the same
code, as the placement plugins are shared by the binder and the pod simulator.

Shapes follow Kueue where users know them: a `ClusterQueueSpec` has a cohort, a weight and,
per GPU type (Kueue's resource flavor of `nvidia.com/gpu`), a nominal quota with optional
borrowing and lending limits. Predictions follow the predictor: a runtime per GPU type with
an upper interval bound, and a peak GPU memory per GPU. Units are in the names: seconds
(`_s`), MiB (`_mib`), GPUs as whole devices.

A policy never mutates its input. Decisions name jobs by `JobSpec.id`; a job may appear in
`admissions` or in `waiting`, never both, and every pending job appears in one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from alnair.common.errors import InvalidValueError


def gpu_type_of(key: str) -> str:
    """The GPU type a capacity key names. A key may be qualified by a cluster,
    `<cluster>/<type>` (the multi-cluster hub's pools); quotas and a job's GPU-model
    constraint name the type alone, so they apply to that type on every cluster."""
    return key.rpartition("/")[2]


def _nonnegative(name: str, value: float, owner: str) -> None:
    if not value >= 0:  # also rejects NaN
        raise InvalidValueError(name, value, f"{owner}: must be >= 0")


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    """Predicted runtime (remaining work) of a job on one GPU type at its GPU count.

    `upper_s` is the upper bound of the predictor's interval; backfill decisions use it so that
    a job that runs long does not delay a reservation.
    """

    expected_s: float
    upper_s: float

    def __post_init__(self) -> None:
        if not self.expected_s > 0:
            raise InvalidValueError("expected_s", self.expected_s, "runtime must be > 0")
        if not self.upper_s >= self.expected_s:
            raise InvalidValueError(
                "upper_s", self.upper_s, f"must be >= expected_s ({self.expected_s})"
            )

    @classmethod
    def exact(cls, runtime_s: float) -> RuntimeEstimate:
        """An oracle estimate: no uncertainty."""
        return cls(runtime_s, runtime_s)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job waiting for (or holding) GPUs, as the queue sees it.

    `runtime` maps a GPU type to the predicted *remaining* runtime on `gpus` GPUs of that type;
    a type without an entry has no prediction (policies that need one treat it as unknown).
    `peak_memory_mib` is the predicted peak GPU memory per GPU (the bound admission must
    respect), None when unknown. `restart_cost_s` is the work lost if the job is preempted
    (time to reload the last checkpoint and warm up). `preemptions` counts how often it has
    been preempted so far (policies bound it).
    """

    id: str
    queue: str
    gpus: int
    arrival_s: float
    runtime: Mapping[str, RuntimeEstimate] = field(default_factory=dict)
    team: str = ""
    gpu_model: str | None = None
    """Constraint: only this GPU type (the job's `alnair.io/gpu-model`), or None for any."""
    priority: int = 0
    peak_memory_mib: float | None = None
    restart_cost_s: float = 0.0
    preemptions: int = 0
    waited_s: float = 0.0
    """Seconds spent waiting (not running) since arrival: up to the snapshot for a pending job,
    up to the start of its current run for a running one. Policies age jobs by it."""
    clusters: frozenset[str] | None = None
    """Constraint: only capacity keys of these clusters (`<cluster>/<type>`), or None for any
    (the multi-cluster hub: the workers that serve the job's kind)."""

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidValueError("id", self.id, "a job needs an id")
        if self.gpus < 1:
            raise InvalidValueError("gpus", self.gpus, f"job {self.id}: must be >= 1")
        _nonnegative("arrival_s", self.arrival_s, f"job {self.id}")
        _nonnegative("restart_cost_s", self.restart_cost_s, f"job {self.id}")
        _nonnegative("preemptions", self.preemptions, f"job {self.id}")
        _nonnegative("waited_s", self.waited_s, f"job {self.id}")
        if self.peak_memory_mib is not None:
            _nonnegative("peak_memory_mib", self.peak_memory_mib, f"job {self.id}")

    def allowed_types(self, types: Sequence[str]) -> list[str]:
        """The GPU types (of `types`, in that order) this job may run on."""
        return [
            t
            for t in types
            if (self.gpu_model is None or gpu_type_of(t) == self.gpu_model)
            and (self.clusters is None or "/" not in t or t.partition("/")[0] in self.clusters)
        ]


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """A cluster queue's quota of one GPU type (Kueue: one flavor of `nvidia.com/gpu`).

    `borrowing_limit`: at most this many GPUs above `nominal` borrowed from the cohort (None:
    no limit but the cohort's). `lending_limit`: at most this many of `nominal` lent to the
    cohort (None: all of it); the rest is guaranteed to this queue.
    """

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        _nonnegative("nominal", self.nominal, "quota")
        if self.borrowing_limit is not None:
            _nonnegative("borrowing_limit", self.borrowing_limit, "quota")
        if self.lending_limit is not None:
            _nonnegative("lending_limit", self.lending_limit, "quota")

    @property
    def lendable(self) -> int:
        """GPUs of `nominal` this queue puts into its cohort's pool."""
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)

    @property
    def guaranteed(self) -> int:
        """GPUs of `nominal` no other queue may borrow."""
        return self.nominal - self.lendable


WithinQueue = Literal["Policy", "Never", "LowerPriority", "LowerOrNewerEqualPriority"]
Reclaim = Literal["Policy", "Any", "Never", "LowerPriority"]
BorrowWithinCohort = Literal["Policy", "Never", "LowerPriority"]


@dataclass(frozen=True, slots=True)
class PreemptionRules:
    """Which preemptions a cluster queue's jobs may ask for (Kueue's `spec.preemption`).

    The policy proposes; these only take away (`permits.refused`). `within_queue` is about
    the queue's own running jobs; `reclaim` about another queue's borrowers when this queue
    takes back quota it is owed; `borrow_within_cohort` about another queue's jobs within
    their nominal quota when this queue would borrow. "Policy" (the default, Alnair's own
    queues) takes nothing away: whatever the policy's own rules allow.
    """

    within_queue: WithinQueue = "Policy"
    reclaim: Reclaim = "Policy"
    borrow_within_cohort: BorrowWithinCohort = "Policy"


@dataclass(frozen=True, slots=True)
class ClusterQueueSpec:
    """A cluster queue (Kueue's shape): quota per GPU type, a cohort to share with, a weight.

    A GPU type without an entry in `quota` cannot be used by this queue's jobs at all, as a
    flavor a Kueue ClusterQueue does not list. `weight` scales the queue's fair share (`drf`)
    and its entitlement in reports.
    """

    name: str
    quota: Mapping[str, FlavorQuota]
    cohort: str | None = None
    weight: float = 1.0
    preemption: PreemptionRules = field(default_factory=PreemptionRules)
    """What preemption its jobs may ask for; the default allows what the policy proposes."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidValueError("name", self.name, "a queue needs a name")
        if not self.weight > 0:
            raise InvalidValueError("weight", self.weight, f"queue {self.name}: must be > 0")


@dataclass(frozen=True, slots=True)
class GpuPool:
    """All GPUs of one type: how many exist, how many are free now, memory of each."""

    total: int
    free: int
    memory_mib: float

    def __post_init__(self) -> None:
        _nonnegative("total", self.total, "GPU pool")
        if not 0 <= self.free <= self.total:
            raise InvalidValueError("free", self.free, f"must be within 0..{self.total}")
        _nonnegative("memory_mib", self.memory_mib, "GPU pool")


@dataclass(frozen=True, slots=True)
class RunningJob:
    """An admitted job: where it runs, since when, and whether it uses borrowed quota.

    `job.runtime` holds the prediction made when this run started, so its predicted end is
    `start_s + job.runtime[gpu_type]`.
    """

    job: JobSpec
    gpu_type: str
    start_s: float
    borrowing: bool = False

    @property
    def gpus(self) -> int:
        return self.job.gpus

    def expected_end_s(self, now_s: float) -> float:
        """Predicted end; a job already past its prediction is assumed to end now."""
        estimate = self.job.runtime.get(self.gpu_type)
        if estimate is None:
            return float("inf")
        return max(now_s, self.start_s + estimate.expected_s)

    def upper_end_s(self, now_s: float) -> float:
        estimate = self.job.runtime.get(self.gpu_type)
        if estimate is None:
            return float("inf")
        return max(now_s, self.start_s + estimate.upper_s)


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """Everything a queueing policy may look at, at one instant."""

    now_s: float
    pending: Sequence[JobSpec]
    running: Sequence[RunningJob]
    queues: Mapping[str, ClusterQueueSpec]
    capacity: Mapping[str, GpuPool]
    """GPU pools by type; the order of the keys is the order ties are broken in."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Each queue's recent GPU use, GPU-seconds decayed with a half-life (`history.py`): what
    fair sharing by history orders by. Empty: no history kept."""


WaitKind = Literal[
    "quota", "reservation", "memory", "fair_share", "capacity", "queue", "prediction",
    "resource_quota",
]  # fmt: skip
"""Why a job waits: its queue's quota (or the cohort's) is used up; GPUs are held for a
reserved job it would delay; no GPU type it may use has enough memory for its predicted peak;
another queue is further below its fair share; not enough free GPUs; its queue is unknown; the
predictor gave no usable answer; its namespace's ResourceQuota would refuse its pods (the last
two set by the dispatcher, never by a policy)."""


@dataclass(frozen=True, slots=True)
class WaitReason:
    kind: WaitKind
    message: str


@dataclass(frozen=True, slots=True)
class Admission:
    """Start `job_id` now on `gpus` GPUs of `gpu_type`; `borrowing` if above its nominal quota."""

    job_id: str
    gpu_type: str
    gpus: int
    borrowing: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop running job `job_id` (it goes back to pending, losing its restart cost)."""

    job_id: str
    reason: str
    for_job_id: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """`job_id` is expected to start at `start_s` on `gpu_type`; GPUs are held for it."""

    job_id: str
    gpu_type: str
    start_s: float


@dataclass(frozen=True, slots=True)
class Decisions:
    """What a policy wants done now.

    Preemptions free GPUs only once the preempted jobs have stopped, so GPUs they hold are not
    admitted to anyone in the same decision: the caller applies the preemptions and asks again.
    """

    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    waiting: Mapping[str, WaitReason] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    """Running jobs the plan considered moving and did not, with why (a move skipped because
    its gain is below the restart cost plus the progress since the last checkpoint)."""
