"""The public measurements Alnair ships with: where they are, and Gavel's throughput table.

The product needs data nobody on this project measured: the Alibaba GPU trace (placement
simulator, `make demo`), the FGD paper's reference table, and Gavel's per-GPU-type throughputs
(the predictor's training set, the profiler's sim backend, the job simulator) with Gavel's
Philly-derived arrival trace. One copy of each lives in this package folder, with its source,
licence and citation in `README.md` beside this file, so every service reads the same file and a
fresh clone (or an installed wheel) has everything. `ALNAIR_DATA_DIR` points at another folder of
the same layout (for example a larger trace); nothing here looks outside the package otherwise.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from alnair.common.errors import ConfigError

DATA_ENV = "ALNAIR_DATA_DIR"
GAVEL_THROUGHPUTS = ("gavel", "throughputs.csv")
GAVEL_ARRIVALS = ("gavel", "philly-arrivals-seed0.trace")


def data_dir() -> Path:
    """$ALNAIR_DATA_DIR when set, else this package's own folder."""
    configured = os.environ.get(DATA_ENV)
    if configured:
        return Path(configured)
    return Path(str(resources.files(__name__)))


def data_file(*parts: str) -> Path:
    """The path of one shipped file (`data_file("gavel", "throughputs.csv")`); a clear error
    naming the path and the override when it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.is_file():
        raise ConfigError(
            f"data file {path} not found (shipped in alnair.common.data; {DATA_ENV} overrides "
            "the folder)",
            path=str(path),
        )
    return path


@dataclass(frozen=True, slots=True)
class GavelRow:
    """One measurement of Gavel's table: `job` on `scale` GPUs of type `gpu`, in steps/s.

    `partner` is empty for the job alone; otherwise both jobs shared one GPU and `own` /
    `partner_own` are their throughputs while sharing. Zero means not measured (or did not fit).
    """

    gpu: str
    job: str
    scale: int
    partner: str
    partner_scale: int | None
    own: float
    partner_own: float | None


def read_gavel_csv(text: str) -> Iterator[GavelRow]:
    """Rows of the shipped CSV layout (gpu,job,scale,partner,partner_scale,own,partner_own)."""
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            yield GavelRow(
                gpu=row["gpu"],
                job=row["job"],
                scale=int(row["scale"]),
                partner=row["partner"] or "",
                partner_scale=int(row["partner_scale"]) if row["partner_scale"] else None,
                own=float(row["own"]),
                partner_own=float(row["partner_own"]) if row["partner_own"] else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad Gavel throughput row at line {line}: {exc}", line=line) from exc


def gavel_throughputs(path: Path | None = None) -> list[GavelRow]:
    """Gavel's table from `path` (the shipped CSV layout), by default the shipped copy."""
    target = path if path is not None else data_file(*GAVEL_THROUGHPUTS)
    return list(read_gavel_csv(target.read_text(encoding="utf-8")))
