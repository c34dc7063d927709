"""The co-location table: how much of its alone speed each workload keeps next to another.

The predictor learns pairwise interference (`alnair.predictor.colocation`). Asking it per
scheduling cycle would put a network round trip in every fractional pod's placement, so it
publishes the whole table instead: every workload it knows (Gavel's measured job types and the
jobs of the execution records) against every other, on every GPU type, written to the KV bucket
`alnair-colocation` (key `table`) each time it installs a new model. The binder and the
dispatcher watch that key and read the table in memory; a retrain is the event that refreshes
it. A workload is named by its model and batch size (`workload_key`), from the annotations the
predictor reads (`alnair.io/model-name`, `alnair.io/batch-size`).

Several sharers of one GPU combine additively in excess slowdown: next to partners p1..pk a
workload runs `1 + sum(slowdown(w|pi) - 1)` times slower than alone. For equal time-slicing
(each of a pair keeps half) that gives k + 1, which is what k + 1 saturating jobs get; the
pairwise model cannot say more, and being pessimistic here errs on the side of not packing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from alnair.common.errors import InvalidValueError

BUCKET: Final = "alnair-colocation"
KEY: Final = "table"

DEFAULT_BATCH_SIZE: Final = 32
ONE_SAMPLE_PER_STEP: Final = frozenset({"a3c", "cyclegan"})
"""Models that run one sample per step when they state no batch size (Gavel's A3C, CycleGAN)."""

_MIN_KEPT = 0.005
_MAX_KEPT = 1.05


def normalize_model_name(name: str) -> str:
    """Lower-case without separators, so "ResNet-50", "resnet_50" and "resnet50" agree."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def default_batch_size(name: str) -> int:
    """The batch size a job of model `name` that states none runs with."""
    return 1 if normalize_model_name(name) in ONE_SAMPLE_PER_STEP else DEFAULT_BATCH_SIZE


def workload_key(model_name: str | None, batch_size: str | int | None = None) -> str:
    """`model@batch` for a workload's annotations; "" when the model is unknown or the batch
    size is not a positive integer (such a workload has no row in the table)."""
    if not model_name or not normalize_model_name(model_name):
        return ""
    if batch_size is None or str(batch_size).strip() == "":
        batch = default_batch_size(model_name)
    else:
        try:
            batch = int(str(batch_size).strip())
        except ValueError:
            return ""
        if batch < 1:
            return ""
    return f"{normalize_model_name(model_name)}@{batch}"


def gpu_type_of(model_label: str, gpu_types: Iterable[str]) -> str | None:
    """Which of `gpu_types` a node's GPU model label is (`V100M32` -> `V100`): the longest
    type name the label contains, so that `A100` is not read as `A10`."""
    upper = re.sub(r"[^A-Z0-9]", "", model_label.upper())
    for name in sorted(gpu_types, key=len, reverse=True):
        if name.upper() in upper:
            return name
    return None


@dataclass(frozen=True, slots=True)
class Joining:
    """A newcomer's predicted effect on a shared GPU (`ColocationTable.join`)."""

    own: float | None
    """Its slowdown beside the sharers the table knows (None: the table does not know it, or
    not this GPU type)."""
    neighbours: tuple[tuple[float, float], ...]
    """Each known sharer's slowdown with the newcomer and without it."""
    unknown: int
    """Pairs the table cannot say anything about."""

    def refused(self, cap: float) -> bool:
        """Past the cap, for the newcomer or for a sharer."""
        own = self.own is not None and self.own > cap
        return own or any(theirs > cap for theirs, _ in self.neighbours)

    def excess(self, unknown_excess: float) -> float:
        """Slowdown it adds in all: its own excess, what each sharer loses, and
        `unknown_excess` for each pair the table cannot say anything about."""
        own = 0.0 if self.own is None else self.own - 1.0
        lost = sum(theirs - before for theirs, before in self.neighbours)
        return own + lost + unknown_excess * self.unknown


@dataclass(frozen=True)
class ColocationTable:
    """`kept[gpu][i][j]`: the fraction of its alone throughput `jobs[i]` keeps sharing one GPU
    of type `gpu` with `jobs[j]`."""

    model_version: int
    jobs: tuple[str, ...]
    kept: Mapping[str, Sequence[Sequence[float]]]
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    _types: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({job: i for i, job in enumerate(self.jobs)})
        if len(self._index) != len(self.jobs):
            raise InvalidValueError("jobs", list(self.jobs)[:5], "workloads must be unique")
        size = len(self.jobs)
        for gpu, rows in self.kept.items():
            if len(rows) != size or any(len(row) != size for row in rows):
                raise InvalidValueError(
                    f"kept.{gpu}", len(rows), f"must be a {size} x {size} matrix"
                )
            for row in rows:
                for value in row:
                    if not (isinstance(value, int | float) and math.isfinite(value)) or not (
                        0 < value <= _MAX_KEPT
                    ):
                        raise InvalidValueError(
                            f"kept.{gpu}", value, f"a kept fraction must be in (0, {_MAX_KEPT}]"
                        )

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.kept)

    def knows(self, workload: str) -> bool:
        return workload in self._index

    def _type(self, model_label: str) -> str | None:
        if model_label not in self._types:
            self._types[model_label] = gpu_type_of(model_label, self.kept)
        return self._types[model_label]

    def kept_fraction(self, workload: str, partner: str, model_label: str) -> float | None:
        """What `workload` keeps next to `partner` on a GPU of model `model_label`; None when
        the table does not know either workload or the GPU type."""
        i, j = self._index.get(workload), self._index.get(partner)
        gpu = self._type(model_label)
        if i is None or j is None or gpu is None:
            return None
        return max(_MIN_KEPT, float(self.kept[gpu][i][j]))

    def slowdown(self, workload: str, partners: Iterable[str], model_label: str) -> float | None:
        """How many times slower than alone `workload` runs next to all of `partners` (module
        docstring: excess slowdowns add up); None when any pair is unknown."""
        total = 1.0
        for partner in partners:
            kept = self.kept_fraction(workload, partner, model_label)
            if kept is None:
                return None
            total += max(0.0, 1.0 / kept - 1.0)
        return total

    def join(self, workload: str, there: Sequence[str], model_label: str) -> Joining:
        """What `workload` joining a GPU of `model_label` that `there` share would do: its
        own slowdown and each sharer's, with and without it. The one rule for what the table
        does not know, for the binder and the dispatcher alike: a sharer it does not know
        (or that names no workload) is left out of every sum and counted in `unknown`; a
        newcomer it does not know, or a GPU type it has no figures for, gives no prediction
        (`own` None), changes no one's, and leaves each pair unknown."""
        known = [w for w in there if w and self.knows(w)]
        if not workload or not self.knows(workload) or self._type(model_label) is None:
            return Joining(None, (), len(there))
        own = self.slowdown(workload, known, model_label)
        neighbours: list[tuple[float, float]] = []
        for i, other in enumerate(known):
            rest = [*known[:i], *known[i + 1 :]]
            theirs = self.slowdown(other, [*rest, workload], model_label)
            before = self.slowdown(other, rest, model_label)
            if theirs is not None and before is not None:
                neighbours.append((theirs, before))
        return Joining(own, tuple(neighbours), len(there) - len(known))

    def encode(self) -> bytes:
        doc = {
            "model_version": self.model_version,
            "jobs": list(self.jobs),
            "kept": {
                gpu: [[round(float(v), 4) for v in row] for row in rows]
                for gpu, rows in self.kept.items()
            },
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> ColocationTable:
        """Parse a published table; raises InvalidValueError naming what is wrong."""
        try:
            doc = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidValueError("table", payload[:40], f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise InvalidValueError("table", type(doc).__name__, "must be an object")
        version, jobs, kept = doc.get("model_version"), doc.get("jobs"), doc.get("kept")
        if not isinstance(version, int):
            raise InvalidValueError("model_version", version, "must be an integer")
        if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
            raise InvalidValueError("jobs", jobs, "must be a list of workload names")
        if not isinstance(kept, dict) or not all(isinstance(rows, list) for rows in kept.values()):
            raise InvalidValueError("kept", type(kept).__name__, "must map GPU types to matrices")
        for gpu, rows in kept.items():
            if not all(isinstance(row, list) for row in rows):
                raise InvalidValueError(f"kept.{gpu}", rows[:1], "rows must be lists")
        return cls(version, tuple(jobs), kept)
