"""The registry of queueing policies, by name: one explicit list, as the placement registry.

    policy = queue_policy("alnair", max_wait_s=3600)
    decisions = policy.decide(snapshot)

Options are the policy's dataclass fields (`memory_aware`, `seed`, `max_wait_s`, ...); an
unknown name or option is an `InvalidValueError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from alnair.common.errors import InvalidValueError
from alnair.scheduler.queueing.baselines import Drf, Fifo, Sjf
from alnair.scheduler.queueing.model import Decisions, QueueSnapshot
from alnair.scheduler.queueing.planner import Alnair


class QueuePolicy(Protocol):
    """A pure function of a snapshot: same snapshot, same decisions."""

    @property
    def name(self) -> str: ...

    def decide(self, snapshot: QueueSnapshot) -> Decisions: ...


@dataclass(frozen=True)
class QueuePolicyInfo:
    name: str
    summary: str
    build: Callable[..., QueuePolicy]


QUEUE_POLICIES: tuple[QueuePolicyInfo, ...] = (
    QueuePolicyInfo(
        "fifo", "arrival order, strict per queue, random GPU type (Gavel's FIFO)", Fifo
    ),
    QueuePolicyInfo("sjf", "shortest predicted runtime first, fastest free GPU type", Sjf),
    QueuePolicyInfo("drf", "dominant-resource fair share across queues", Drf),
    QueuePolicyInfo(
        "alnair",
        "predicted-runtime order, GPU type by predicted completion, aging with reservation and "
        "backfill, memory-safe, reclaims lent quota",
        Alnair,
    ),
)


def queue_policy(name: str, **options: Any) -> QueuePolicy:
    """The policy called `name` (case-insensitive) built with `options`."""
    for info in QUEUE_POLICIES:
        if info.name == name.lower():
            known = {f.name for f in fields(info.build)} - {"name"}  # type: ignore[arg-type]
            for option, value in options.items():
                if option not in known:
                    raise InvalidValueError(
                        option, value, f"not an option of {info.name} ({sorted(known)})"
                    )
            return info.build(**options)
    names = ", ".join(p.name for p in QUEUE_POLICIES)
    raise InvalidValueError("policy", name, f"unknown queueing policy (known: {names})")
