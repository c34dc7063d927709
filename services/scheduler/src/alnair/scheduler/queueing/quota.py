"""Quota accounting shared by every queueing policy: nominal quota, cohorts, borrowing, lending.

The semantics are Kueue's, for one resource (`nvidia.com/gpu`) with one flavor per GPU type:

- a queue without a cohort uses at most its `nominal` quota of each type;
- queues in a cohort pool what they lend: each contributes `lendable` (its nominal, or its
  lending limit if lower) and keeps `guaranteed = nominal - lendable` for itself alone;
- a queue's usage above its guaranteed part draws from the pool; the pool is never
  overdrawn, and a queue never goes above `nominal + borrowing_limit`;
- usage above `nominal` is *borrowing*, and borrowed GPUs are what an owner may reclaim.

Quota is per GPU type: a capacity key qualified by a cluster (`<cluster>/<type>`, see
`model.gpu_type_of`) draws on its type's quota, wherever that cluster is.

`QuotaLedger` is built from the running jobs of a snapshot and updated as a policy admits jobs
within one decision, so every policy enforces quotas with this one piece of code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from alnair.scheduler.queueing.model import ClusterQueueSpec, RunningJob, WaitKind, gpu_type_of


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """The answer to "may queue Q use n more GPUs of type T?"."""

    ok: bool
    borrowing: bool = False
    """Admitting would put the queue above its nominal quota."""
    within_nominal: bool = False
    """The queue would stay within its nominal quota (so borrowers could be reclaimed)."""
    kind: WaitKind = "quota"
    reason: str = ""


class QuotaLedger:
    """GPU usage per (queue, GPU type) and per (cohort, GPU type), checked against quotas."""

    def __init__(self, queues: Mapping[str, ClusterQueueSpec], running: Iterable[RunningJob] = ()):
        self._queues = queues
        self._usage: dict[tuple[str, str], int] = defaultdict(int)
        self._pool: dict[tuple[str, str], int] = defaultdict(int)
        self._pool_used: dict[tuple[str, str], int] = defaultdict(int)
        for queue in queues.values():
            if queue.cohort is not None:
                for gpu_type, quota in queue.quota.items():
                    self._pool[(queue.cohort, gpu_type)] += quota.lendable
        for run in running:
            if run.job.queue in queues:
                self.take(run.job.queue, run.gpu_type, run.gpus)

    def usage(self, queue: str, gpu_type: str) -> int:
        gpu_type = gpu_type_of(gpu_type)
        return self._usage[(queue, gpu_type)]

    def borrowed(self, queue: str, gpu_type: str) -> int:
        """GPUs of `gpu_type` the queue uses above its nominal quota."""
        gpu_type = gpu_type_of(gpu_type)
        spec = self._queues[queue].quota.get(gpu_type)
        nominal = spec.nominal if spec is not None else 0
        return max(0, self._usage[(queue, gpu_type)] - nominal)

    def _pool_share(self, queue: str, gpu_type: str, usage: int) -> int:
        spec = self._queues[queue].quota.get(gpu_type)
        guaranteed = spec.guaranteed if spec is not None else 0
        return max(0, usage - guaranteed)

    def check(self, queue: str, gpu_type: str, gpus: int) -> QuotaCheck:
        """Whether `queue` may take `gpus` more GPUs of `gpu_type` now."""
        gpu_type = gpu_type_of(gpu_type)
        spec = self._queues.get(queue)
        if spec is None:
            return QuotaCheck(False, kind="queue", reason=f"queue {queue!r} does not exist")
        quota = spec.quota.get(gpu_type)
        if quota is None:
            return QuotaCheck(False, reason=f"queue {queue} has no quota for {gpu_type}")
        now = self._usage[(queue, gpu_type)]
        after = now + gpus
        within = after <= quota.nominal
        if spec.cohort is None:
            if within:
                return QuotaCheck(True, within_nominal=True)
            return QuotaCheck(
                False,
                reason=f"queue {queue} would use {after} > nominal {quota.nominal} {gpu_type}",
            )
        if quota.borrowing_limit is not None and after > quota.nominal + quota.borrowing_limit:
            return QuotaCheck(
                False,
                reason=f"queue {queue} would borrow {after - quota.nominal} > limit "
                f"{quota.borrowing_limit} {gpu_type}",
            )
        key = (spec.cohort, gpu_type)
        pool_after = (
            self._pool_used[key]
            - self._pool_share(queue, gpu_type, now)
            + self._pool_share(queue, gpu_type, after)
        )
        if pool_after > self._pool[key]:
            return QuotaCheck(
                False,
                within_nominal=within,
                reason=f"cohort {spec.cohort} has {self._pool[key] - self._pool_used[key]} "
                f"{gpu_type} left to lend, queue {queue} needs {gpus}",
            )
        return QuotaCheck(True, borrowing=not within, within_nominal=within)

    def take(self, queue: str, gpu_type: str, gpus: int) -> None:
        self._move(queue, gpu_type, gpus)

    def release(self, queue: str, gpu_type: str, gpus: int) -> None:
        self._move(queue, gpu_type, -gpus)

    def _move(self, queue: str, gpu_type: str, delta: int) -> None:
        gpu_type = gpu_type_of(gpu_type)
        spec = self._queues.get(queue)
        now = self._usage[(queue, gpu_type)]
        self._usage[(queue, gpu_type)] = now + delta
        if spec is not None and spec.cohort is not None:
            key = (spec.cohort, gpu_type)
            self._pool_used[key] += self._pool_share(
                queue, gpu_type, now + delta
            ) - self._pool_share(queue, gpu_type, now)

    def over_quota(self) -> list[str]:
        """Every violated limit, as text (empty when the ledger is consistent); for tests."""
        problems: list[str] = []
        for (queue, gpu_type), used in self._usage.items():
            spec = self._queues.get(queue)
            if spec is None or used == 0:
                continue
            quota = spec.quota.get(gpu_type)
            if quota is None:
                problems.append(f"{queue} uses {used} {gpu_type} without quota")
                continue
            limit = quota.nominal
            if spec.cohort is not None:
                limit += quota.borrowing_limit if quota.borrowing_limit is not None else used
            if used > limit:
                problems.append(f"{queue} uses {used} > {limit} {gpu_type}")
        for key, used in self._pool_used.items():
            if used > self._pool[key]:
                problems.append(f"cohort {key[0]} lends {used} > {self._pool[key]} {key[1]}")
        return problems
