"""What a simulated training job does to a GPU: measured throughput, plausible load.

The sim backend needs, for each Running pod, a GPU utilization and memory, and how both
change when another pod shares the GPU. Throughput and co-location interference are
measured (Gavel, OSDI'20: 26 job types on K80/P100/V100, alone and in pairs on one GPU; the
copy every service shares ships in `alnair.common.data`, whose README gives source and
licence). Gavel did not publish utilization or memory, so those come from a small table of
assumed values per model family (stated below, overridable per pod with annotations) and are
scaled by the measured slowdown:
a pod that runs at 60% of its alone throughput while sharing is given 60% of its alone
utilization, and the device shows the sum (capped at 100%).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from alnair.common.data import GavelRow, gavel_throughputs


@dataclass(frozen=True)
class FamilyLoad:
    """Assumed load of one model family alone on a GPU (not measured; see module doc)."""

    util_pct: float
    base_mem_mib: float
    mem_per_sample_mib: float


# Assumptions, chosen to be plausible for PyTorch training of these models: convolutional
# nets keep the GPU busy, the LM and recommendation models less so, A3C (reinforcement
# learning, CPU-bound environments) little. Memory = framework + weights + activations.
FAMILY_LOAD: dict[str, FamilyLoad] = {
    "resnet-18": FamilyLoad(88.0, 900.0, 22.0),
    "resnet-50": FamilyLoad(95.0, 1400.0, 75.0),
    "transformer": FamilyLoad(82.0, 1600.0, 24.0),
    "lm": FamilyLoad(70.0, 1200.0, 60.0),
    "recommendation": FamilyLoad(55.0, 800.0, 0.6),
    "a3c": FamilyLoad(35.0, 700.0, 0.0),
    "cyclegan": FamilyLoad(96.0, 3500.0, 0.0),
}
DEFAULT_LOAD = FamilyLoad(80.0, 2000.0, 10.0)

_JOB_RE = re.compile(r"^(?P<family>.+?) \(batch size (?P<bs>\d+)\)$")


@dataclass(frozen=True)
class JobType:
    """A Gavel job type, e.g. ('ResNet-50', 64), or ('A3C', None) for fixed-batch jobs."""

    family: str
    batch_size: int | None

    @property
    def gavel_name(self) -> str:
        return (
            self.family
            if self.batch_size is None
            else f"{self.family} (batch size {self.batch_size})"
        )

    @property
    def load(self) -> FamilyLoad:
        return FAMILY_LOAD.get(self.family.lower(), DEFAULT_LOAD)

    def alone_util_pct(self) -> float:
        return self.load.util_pct

    def mem_mib(self) -> float:
        return self.load.base_mem_mib + self.load.mem_per_sample_mib * (self.batch_size or 0)


def gpu_type_of(model: str) -> str:
    """Gavel's GPU key for a GPU model name; unmeasured types borrow the V100 numbers."""
    lowered = model.lower()
    for key in ("k80", "p100", "v100"):
        if key in lowered:
            return key
    return "v100"


class ThroughputTable:
    """Gavel's measured throughputs, indexed for lookups by job type, GPU type and count."""

    def __init__(self, rows: Iterable[GavelRow]) -> None:
        self._alone: dict[tuple[str, str, int], float] = {}
        self._paired: dict[tuple[str, str, str], float] = {}
        self._families: dict[str, set[int | None]] = {}
        self._canonical: dict[str, str] = {}
        pairs: list[GavelRow] = []
        for row in rows:
            jt = parse_job_type(row.job)
            self._families.setdefault(jt.family.lower(), set()).add(jt.batch_size)
            self._canonical[jt.family.lower()] = jt.family
            if not row.partner:
                if row.own > 0:
                    self._alone[(row.gpu, row.job, row.scale)] = row.own
            elif row.scale == 1:
                pairs.append(row)
        for row in pairs:
            alone = self._alone.get((row.gpu, row.job, 1))
            if row.own > 0 and alone:
                self._paired[(row.gpu, row.job, row.partner)] = row.own / alone

    @staticmethod
    def load(path: Path | None = None) -> ThroughputTable:
        """The table from `path`: the shipped CSV layout, or Gavel's own throughputs.json
        (`.json`); by default the copy shipped in `alnair.common.data`."""
        if path is not None and path.suffix == ".json":
            return ThroughputTable(_json_rows(json.loads(path.read_text())))
        return ThroughputTable(gavel_throughputs(path))

    def resolve(self, model_name: str, batch_size: int | None) -> JobType:
        """The nearest measured job type for a model and batch size (nearest in log2)."""
        direct = parse_job_type(model_name)
        family = direct.family
        bs = direct.batch_size if direct.batch_size is not None else batch_size
        known = self._families.get(family.lower())
        if not known:
            return JobType(family, bs)
        family = self._canonical[family.lower()]
        sizes = sorted(s for s in known if s is not None)
        if not sizes:
            return JobType(family, None)
        if bs is None:
            return JobType(family, sizes[len(sizes) // 2])
        best = min(sizes, key=lambda s: abs(math.log2(s) - math.log2(max(1, bs))))
        return JobType(family, best)

    def throughput(self, job: JobType, gpu_model: str, gpu_count: int = 1) -> float | None:
        """Steps/s alone, or None when Gavel did not measure this combination."""
        gpu = gpu_type_of(gpu_model)
        return self._alone.get((gpu, job.gavel_name, gpu_count))

    def slowdown(self, job: JobType, others: list[JobType], gpu_model: str) -> float:
        """Fraction of its alone throughput `job` keeps while sharing a GPU with `others`.

        Gavel measured pairs only; with more neighbours the pairwise factors multiply (each
        neighbour takes its share of what is left). An unmeasured pair is assumed to split the
        GPU evenly (factor 1/2), the usual time-slicing outcome.
        """
        gpu = gpu_type_of(gpu_model)
        factor = 1.0
        for other in others:
            factor *= self._paired.get((gpu, job.gavel_name, other.gavel_name), 0.5)
        return max(0.0, min(1.0, factor))


def parse_job_type(name: str) -> JobType:
    match = _JOB_RE.match(name.strip())
    if match is None:
        return JobType(name.strip(), None)
    return JobType(match.group("family"), int(match.group("bs")))


def _json_rows(raw: dict[str, dict[str, dict[str, object]]]) -> Iterator[GavelRow]:
    """Gavel's throughputs.json as rows (consolidated placements only, like the shipped CSV)."""
    for gpu, jobs in raw.items():
        if gpu.endswith("_unconsolidated"):
            continue
        for job_key, entries in jobs.items():
            name, scale = ast.literal_eval(job_key)
            for other_key, value in entries.items():
                if other_key == "null" and isinstance(value, (int, float)):
                    yield GavelRow(gpu, name, int(scale), "", None, float(value), None)
                elif isinstance(value, list):
                    other, other_scale = ast.literal_eval(other_key)
                    yield GavelRow(
                        gpu, name, int(scale), other, int(other_scale), *map(float, value[:2])
                    )


@cache
def default_table() -> ThroughputTable:
    return ThroughputTable.load()
