"""Quota over resources other than GPUs (CPU, memory, extended resources), as Kueue defines it.

A cluster queue may hold, beside its GPU models, resource groups over other resources: each
group covers some resources and lists flavors in order, each flavor with a quota per covered
resource (nominal, borrowing limit, lending limit). A workload gets, per group, the first
flavor where everything it asks of that group's resources fits (Kueue's flavor assignment,
`whenCanBorrow: MayStopSearch`: a flavor that fits by borrowing is taken). The arithmetic is
`quota.py`'s, per (flavor, resource), in exact quantities:

- a queue without a cohort uses at most its nominal quota;
- queues of a cohort pool what they lend (nominal, or the lending limit if lower); usage above
  a queue's guaranteed part draws from that pool, never above nominal + borrowing limit.

GPU models stay the policies' business (`quota.py`, one flavor per model); this ledger is
the second gate an admission passes, in the order the policy admits. A resource no group of
the queue covers is not counted (a GPU queue need not quota CPU).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

Amounts = Mapping[str, Decimal]
Assignment = Mapping[str, str]
"""resource -> the flavor it is counted in."""


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None

    @property
    def lendable(self) -> Decimal:
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    name: str
    quotas: Mapping[str, ResourceQuota]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True, slots=True)
class QueueResources:
    """A cluster queue's non-GPU quota: its groups, and the cohort it lends to."""

    groups: tuple[ResourceGroup, ...]
    cohort: str | None = None

    def covered(self) -> frozenset[str]:
        return frozenset(r for g in self.groups for r in g.covered)


def _fmt(amount: Decimal) -> str:
    return format(amount.normalize(), "f")


class ResourceLedger:
    """Usage per (queue, flavor, resource) and per (cohort, flavor, resource), checked
    against the queues' quotas as workloads are charged in admission order."""

    def __init__(self, queues: Mapping[str, QueueResources]) -> None:
        self._queues = queues
        self._usage: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        self._pool: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        self._pool_used: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        for queue in queues.values():
            if queue.cohort is None:
                continue
            for group in queue.groups:
                for flavor in group.flavors:
                    for resource, quota in flavor.quotas.items():
                        self._pool[(queue.cohort, flavor.name, resource)] += quota.lendable

    def usage(self, queue: str, flavor: str, resource: str) -> Decimal:
        return self._usage[(queue, flavor, resource)]

    def _quota(self, queue: str, flavor: str, resource: str) -> ResourceQuota | None:
        for group in self._queues[queue].groups:
            for f in group.flavors:
                if f.name == flavor:
                    return f.quotas.get(resource)
        return None

    def _fits(self, queue: str, flavor: str, resource: str, amount: Decimal) -> str | None:
        """Why `amount` more of `resource` in `flavor` does not fit the queue, or None."""
        quota = self._quota(queue, flavor, resource) or ResourceQuota(Decimal(0))
        spec = self._queues[queue]
        used = self._usage[(queue, flavor, resource)] + amount
        ceiling: Decimal | None = quota.nominal
        if spec.cohort is not None:
            ceiling = (
                quota.nominal + quota.borrowing_limit
                if quota.borrowing_limit is not None
                else None  # bounded by the pool alone
            )
        if ceiling is not None and used > ceiling:
            return (
                f"{resource} in flavor {flavor}: {_fmt(used)} would exceed "
                f"{_fmt(ceiling)} of ClusterQueue {queue}"
            )
        if spec.cohort is not None:
            guaranteed = quota.nominal - quota.lendable
            key = (spec.cohort, flavor, resource)
            draw = max(Decimal(0), used - guaranteed) - max(
                Decimal(0), self._usage[(queue, flavor, resource)] - guaranteed
            )
            if self._pool_used[key] + draw > self._pool[key]:
                left = self._pool[key] - self._pool_used[key]
                return (
                    f"{resource} in flavor {flavor}: cohort {spec.cohort} has {_fmt(left)} "
                    f"left to lend, {_fmt(draw)} needed"
                )
        return None

    def assign(self, queue: str, asked: Amounts) -> Assignment | str:
        """The flavor of each resource asked (per group, the first flavor where all its asked
        resources fit), or why none fits."""
        spec = self._queues.get(queue)
        if spec is None:
            return {}
        out: dict[str, str] = {}
        for group in spec.groups:
            wanted = {r: a for r, a in asked.items() if r in group.covered and a > 0}
            if not wanted:
                continue
            reasons = []
            for flavor in group.flavors:
                problems = [
                    p
                    for r, a in sorted(wanted.items())
                    if (p := self._fits(queue, flavor.name, r, a)) is not None
                ]
                if not problems:
                    out.update(dict.fromkeys(wanted, flavor.name))
                    break
                reasons.append(problems[0])
            else:
                return "; ".join(reasons) or f"ClusterQueue {queue} lists no flavor"
        return out

    def borrowing(self, queue: str, assignment: Assignment) -> bool:
        """Whether the queue uses more than its nominal quota of a resource in `assignment`'s
        flavors (what a queue of its cohort may reclaim)."""
        for resource, flavor in assignment.items():
            quota = self._quota(queue, flavor, resource) or ResourceQuota(Decimal(0))
            if self._usage[(queue, flavor, resource)] > quota.nominal:
                return True
        return False

    def within_nominal(self, queue: str, asked: Amounts) -> bool:
        """Whether `asked` fits the queue's own nominal quota (in some flavor of each group),
        beside what it uses: quota it is owed, which it may reclaim from borrowers."""
        spec = self._queues.get(queue)
        if spec is None:
            return False
        for group in spec.groups:
            wanted = {r: a for r, a in asked.items() if r in group.covered and a > 0}
            if wanted and not any(
                all(
                    self._usage[(queue, f.name, r)] + a
                    <= (self._quota(queue, f.name, r) or ResourceQuota(Decimal(0))).nominal
                    for r, a in wanted.items()
                )
                for f in group.flavors
            ):
                return False
        return True

    def take(self, queue: str, assignment: Assignment, asked: Amounts) -> None:
        self._move(queue, assignment, asked, 1)

    def release(self, queue: str, assignment: Assignment, asked: Amounts) -> None:
        self._move(queue, assignment, asked, -1)

    def _move(self, queue: str, assignment: Assignment, asked: Amounts, sign: int) -> None:
        spec = self._queues.get(queue)
        if spec is None:
            return
        for resource, flavor in assignment.items():
            amount = asked.get(resource, Decimal(0)) * sign
            key = (queue, flavor, resource)
            before = self._usage[key]
            self._usage[key] = before + amount
            if spec.cohort is not None:
                quota = self._quota(queue, flavor, resource) or ResourceQuota(Decimal(0))
                guaranteed = quota.nominal - quota.lendable
                draw = max(Decimal(0), self._usage[key] - guaranteed) - max(
                    Decimal(0), before - guaranteed
                )
                self._pool_used[(spec.cohort, flavor, resource)] += draw

    def charge_all(self, charges: Iterable[tuple[str, Assignment, Amounts]]) -> None:
        for queue, assignment, asked in charges:
            self.take(queue, assignment, asked)
