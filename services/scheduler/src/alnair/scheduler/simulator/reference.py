"""The paper's own numbers (`fgd_reference.csv`), to print beside ours.

Weng et al. (USENIX ATC'23) ran their Go simulator for each policy and workload variant with
seeds 42-51; the file holds the mean, min and max GPU allocation at each arrived-demand
percentage. We compare means at the same demand points.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from alnair.scheduler.simulator.trace import REFERENCE_FILE, trace_dir


@dataclass(frozen=True)
class ReferencePoint:
    mean: float
    low: float
    high: float
    seeds: int


Reference = dict[tuple[str, str, int], ReferencePoint]
"""(variant, policy, arrived demand %) -> allocation % of the paper's simulator."""


def load_reference(path: Path | None = None) -> Reference:
    source = path or trace_dir() / REFERENCE_FILE
    table: Reference = {}
    with source.open(newline="") as handle:
        for row in csv.DictReader(handle):
            variant = row["workload"].removeprefix("openb_pod_list_")
            key = (variant, row["policy"], int(float(row["arrived_demand_pct"])))
            table[key] = ReferencePoint(
                mean=float(row["gpu_alloc_pct_mean"]),
                low=float(row["gpu_alloc_pct_min"]),
                high=float(row["gpu_alloc_pct_max"]),
                seeds=int(row["seeds"]),
            )
    return table


def variant_of(pods_path: Path) -> str:
    """`openb_pod_list_gpushare40.csv` -> `gpushare40` (the reference's workload key)."""
    return pods_path.stem.removeprefix("openb_pod_list_")
