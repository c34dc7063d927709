"""One decision in the making: free GPUs, quota usage and the choices made so far.

Every policy walks its pending jobs in its own order and asks the same questions of each: which
GPU types may it use (constraint, memory, quota) and which of those have room now. `Plan`
answers them and records admissions, so that the checks (memory, quota, capacity) are the same
code for every policy and only the order, the GPU type choice and the extras (reservation,
preemption) differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from alnair.scheduler.queueing.model import (
    Admission,
    Decisions,
    JobSpec,
    Preemption,
    QueueSnapshot,
    Reservation,
    WaitReason,
)
from alnair.scheduler.queueing.quota import QuotaCheck, QuotaLedger


def fits_memory(job: JobSpec, memory_mib: float) -> bool:
    """The job's predicted peak (per GPU) fits a GPU with `memory_mib`; unknown peaks fit."""
    return job.peak_memory_mib is None or job.peak_memory_mib <= memory_mib


@dataclass(frozen=True, slots=True)
class Options:
    """Where one job could go: types that pass memory and quota, and those with room now."""

    allowed: list[tuple[str, QuotaCheck]]
    """Types the job may use under its constraint, memory and quota (room or not)."""
    now: list[tuple[str, QuotaCheck]]
    """Of `allowed`, those with enough free GPUs now."""
    reason: WaitReason | None
    """Why the job cannot start now (None when `now` is not empty)."""
    reclaimable: list[str]
    """Types where the job stays within its queue's nominal quota but the cohort's pool or
    the GPUs are held by borrowers: an owner that may reclaim."""


class Plan:
    """Mutable working state of one `decide` call (never shared, never returned)."""

    def __init__(self, snapshot: QueueSnapshot, *, memory_aware: bool = True) -> None:
        self.snapshot = snapshot
        self.memory_aware = memory_aware
        self.types = list(snapshot.capacity)
        self.free = {t: pool.free for t, pool in snapshot.capacity.items()}
        self.ledger = QuotaLedger(snapshot.queues, snapshot.running)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[Reservation] = []
        self.waiting: dict[str, WaitReason] = {}

    def options(self, job: JobSpec) -> Options:
        types = job.allowed_types(self.types)
        if not types:
            wanted = job.gpu_model or "any"
            return Options([], [], WaitReason("capacity", f"no {wanted} GPUs in the cluster"), [])
        if self.memory_aware:
            fitting = [t for t in types if fits_memory(job, self.snapshot.capacity[t].memory_mib)]
            if not fitting:
                return Options(
                    [],
                    [],
                    WaitReason(
                        "memory",
                        f"predicted peak {job.peak_memory_mib:.0f} MiB per GPU exceeds the "
                        f"memory of every allowed GPU type ({', '.join(types)})",
                    ),
                    [],
                )
            types = fitting
        allowed: list[tuple[str, QuotaCheck]] = []
        refused: list[QuotaCheck] = []
        reclaimable: list[str] = []
        for gpu_type in types:
            check = self.ledger.check(job.queue, gpu_type, job.gpus)
            if check.ok:
                allowed.append((gpu_type, check))
            else:
                refused.append(check)
            if check.within_nominal and (not check.ok or self.free[gpu_type] < job.gpus):
                reclaimable.append(gpu_type)
        if not allowed:
            first = refused[0]
            return Options([], [], WaitReason(first.kind, first.reason), reclaimable)
        now = [(t, c) for t, c in allowed if self.free[t] >= job.gpus]
        if now:
            return Options(allowed, now, None, reclaimable)
        free = ", ".join(f"{self.free[t]} {t}" for t, _ in allowed)
        return Options(
            allowed,
            [],
            WaitReason("capacity", f"needs {job.gpus} GPUs of one type; free: {free}"),
            reclaimable,
        )

    def admit(self, job: JobSpec, gpu_type: str, check: QuotaCheck) -> None:
        self.free[gpu_type] -= job.gpus
        self.ledger.take(job.queue, gpu_type, job.gpus)
        self.admissions.append(Admission(job.id, gpu_type, job.gpus, check.borrowing))

    def wait(self, job: JobSpec, reason: WaitReason) -> None:
        self.waiting[job.id] = reason

    def decisions(self) -> Decisions:
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            reservations=tuple(self.reservations),
            waiting=dict(self.waiting),
        )
