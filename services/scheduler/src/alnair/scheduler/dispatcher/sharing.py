"""Fractional workloads on shared GPUs, as the queue plans them (issue 27).

A fractional workload asks for GPU memory, not a GPU; the binder packs such pods onto GPUs
that have room, and refuses a GPU where the predictor's co-location table says the newcomer
or a pod already there would run more than the cap slower (`plugins/interference.py`). The
dispatcher plans with the same rule:

- **capacity**: the running fractions of a GPU model take as many GPUs as first-fit
  decreasing packs them into by memory, never putting together two workloads predicted past
  the cap (each one's slowdown next to all the others, as the table combines them). Without a
  table they pack by memory alone. A pending fraction is still charged a whole free GPU: the
  plan never counts on a place beside another that the binder might refuse.
- **runtime**: a pending fraction will most likely be packed beside running ones (every
  packing policy prefers a shared GPU); its predicted runtime on a model is its runtime alone
  times its predicted slowdown in the gentlest GPU there it may join, so the order and the
  reservations see the time it will take shared. Where it may join none, it runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from alnair.common.colocation import ColocationTable


@dataclass(frozen=True, slots=True)
class Fraction:
    """One fractional pod: whose, what it trains (`workload_key`, "" unknown), its memory."""

    key: str
    workload: str
    memory_mib: float


@dataclass
class SharedGpu:
    members: list[Fraction] = field(default_factory=list)

    @property
    def used_mib(self) -> float:
        return sum(f.memory_mib for f in self.members)


@dataclass(frozen=True, slots=True)
class Sharing:
    """A pending fraction's predicted place on a model: its slowdown and the workloads beside."""

    slowdown: float
    partners: tuple[str, ...]

    def describe(self) -> dict[str, object]:
        return {"slowdown": round(self.slowdown, 3), "with": list(self.partners)}


def may_join(
    gpu: SharedGpu, new: Fraction, memory_mib: float, table: ColocationTable | None,
    label: str, cap: float,
) -> float | None:  # fmt: skip
    """The newcomer's slowdown on `gpu` when it may go there (memory and the cap, for it and
    for each one already there, `ColocationTable.join`'s rule), else None; 1.0 when the table
    cannot say."""
    if gpu.used_mib + new.memory_mib > memory_mib:
        return None
    if table is None:
        return 1.0
    joining = table.join(new.workload, [m.workload for m in gpu.members], label)
    if joining.refused(cap):
        return None
    return 1.0 if joining.own is None else joining.own


def pack(
    fractions: Sequence[Fraction], memory_mib: float, table: ColocationTable | None,
    label: str, cap: float,
) -> list[SharedGpu]:  # fmt: skip
    """First-fit decreasing by memory onto GPUs of `memory_mib`, keeping the cap."""
    gpus: list[SharedGpu] = []
    for fraction in sorted(fractions, key=lambda f: (-f.memory_mib, f.key)):
        for gpu in gpus:
            if may_join(gpu, fraction, memory_mib, table, label, cap) is not None:
                gpu.members.append(fraction)
                break
        else:
            gpus.append(SharedGpu([fraction]))
    return gpus


def likely_sharing(
    new: Fraction, gpus: Sequence[SharedGpu], memory_mib: float, table: ColocationTable | None,
    label: str, cap: float,
) -> Sharing | None:  # fmt: skip
    """Where the binder would most likely put `new` among the shared GPUs of a model: the one
    it may join where it is slowed least; None when it may join none (it runs alone)."""
    best: Sharing | None = None
    for gpu in gpus:
        slowdown = may_join(gpu, new, memory_mib, table, label, cap)
        if slowdown is None:
            continue
        if best is None or slowdown < best.slowdown:
            best = Sharing(slowdown, tuple(m.workload or m.key for m in gpu.members))
    return best
