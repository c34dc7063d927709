"""Status and Code: how a plugin says what happened without raising.

Mirrors the upstream Kubernetes framework's `Status`: a plugin that cannot place a pod is not an
error, it is an answer (`UNSCHEDULABLE` with a reason the user will read on the pod). Only a
broken plugin returns `ERROR`. The live binder turns these into pod conditions and Events; the
simulator counts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    """Outcome of one plugin call, named as upstream names them."""

    SUCCESS = 0
    UNSCHEDULABLE = 1
    """The pod does not fit now; another cluster state may fit it (preemption can help)."""
    UNSCHEDULABLE_AND_UNRESOLVABLE = 2
    """The pod can never fit this node (wrong GPU model): preemption cannot help."""
    ERROR = 3
    """The plugin itself failed; the pod is retried."""
    SKIP = 4
    """The plugin has nothing to say about this pod (PreFilter/PreScore)."""
    WAIT = 5
    """Permit: hold the pod (a gang not yet complete)."""


@dataclass(frozen=True, slots=True)
class Status:
    """A plugin's answer: a code, a human reason, and which plugin gave it."""

    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""
    timeout_s: float = 0.0
    """WAIT only: how long the pod may wait before its reservation is withdrawn."""

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def with_plugin(self, plugin: str) -> Status:
        return Status(self.code, self.reason, plugin, self.timeout_s)

    def __str__(self) -> str:
        where = f"{self.plugin}: " if self.plugin else ""
        return f"{where}{self.code.name}" + (f" ({self.reason})" if self.reason else "")


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(reason: str, plugin: str = "") -> Status:
    return Status(Code.UNSCHEDULABLE, reason, plugin)


def unresolvable(reason: str, plugin: str = "") -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason, plugin)


def error(reason: str, plugin: str = "") -> Status:
    return Status(Code.ERROR, reason, plugin)
