"""Each cluster queue's recent GPU use, decayed with a half-life: the history fair sharing
orders by (Kueue's AdmissionFairSharing, KAI's time-based fair share).

`advance(now)` accounts the interval since the last call at the GPUs `hold` last said each
queue holds, and decays everything by `0.5 ** (elapsed / half_life)`; `hold(held)` says what
is held from now on (after the decisions of this instant). The live dispatcher calls both at
each reconcile, the job simulator at each instant. `usage` is GPU-seconds, what
`QueueSnapshot.usage` gives a policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from alnair.common.errors import InvalidValueError


class UsageHistory:
    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise InvalidValueError("half_life_s", half_life_s, "must be > 0")
        self.half_life_s = half_life_s
        self.usage: dict[str, float] = {}
        self._at: float | None = None
        self._held: dict[str, int] = {}

    def advance(self, now_s: float) -> dict[str, float]:
        """Account the time since the last call at the GPUs held over it, decayed; the usage
        by queue (a copy)."""
        if self._at is not None and now_s > self._at:
            elapsed = now_s - self._at
            decay = 0.5 ** (elapsed / self.half_life_s)
            # GPUs held over the interval, decayed continuously: the integral of g*2^(-t/h).
            gained = (1.0 - decay) * self.half_life_s / math.log(2)
            for queue in self.usage.keys() | self._held.keys():
                value = self.usage.get(queue, 0.0) * decay + self._held.get(queue, 0) * gained
                if value < 1e-9:
                    self.usage.pop(queue, None)
                else:
                    self.usage[queue] = value
        if self._at is None or now_s > self._at:
            self._at = now_s
        return dict(self.usage)

    def hold(self, held: Mapping[str, int]) -> None:
        """What each queue holds from now on (GPUs), until the next `advance`."""
        self._held = {q: g for q, g in held.items() if g > 0}
