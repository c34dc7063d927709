"""The Alibaba GPU trace (cluster-trace-gpu-v2023) as scheduler inputs, and its replay protocol.

Source: the public `alibaba/clusterdata` repository, folder `cluster-trace-gpu-v2023`,
published with Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC'23. The files ship in `alnair.common.data`
(`ALNAIR_DATA_DIR` overrides the folder).

The protocol of the paper's evaluation (the one `fgd_reference.csv` was measured with):
the cluster is every node of the node list; the workload is the pod list, grown by sampling
pods with replacement (or shrunk by dropping random pods) until the requested milli-GPU is
`tune` (1.3) times the cluster's GPU capacity, then shuffled, all with one seeded generator.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from alnair.common.data import DATA_ENV, data_dir
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.scheduler.cluster.requests import NodeSpec, PodRequest

TRACE_DIR = "alibaba-gpu-2023"
NODE_FILE = "openb_node_list_gpu_node.csv"
REFERENCE_FILE = "fgd_reference.csv"
VARIANTS = (
    "default",
    "cpu050",
    "cpu200",
    "gpushare40",
    "gpushare80",
    "gpuspec10",
    "gpuspec25",
    "multigpu20",
    "multigpu40",
)
DEFAULT_TUNE = 1.3


def trace_dir() -> Path:
    path = data_dir() / TRACE_DIR
    if not path.is_dir():
        raise ConfigError(
            f"trace directory {path} not found; {DATA_ENV} names a folder without {TRACE_DIR}/",
            path=str(path),
        )
    return path


def pods_file(variant: str) -> Path:
    if variant not in VARIANTS:
        raise InvalidValueError("variant", variant, f"known: {', '.join(VARIANTS)}")
    return trace_dir() / f"openb_pod_list_{variant}.csv"


def _int(row: dict[str, str], column: str, path: Path, line: int) -> int:
    raw = row.get(column)
    if raw is None or raw == "":
        raise InvalidValueError(column, raw, f"{path}:{line} needs an integer")
    try:
        return int(float(raw))
    except ValueError:
        raise InvalidValueError(column, raw, f"{path}:{line} is not a number") from None


def load_nodes(path: Path) -> list[NodeSpec]:
    """Nodes of a trace node list (`sn, cpu_milli, memory_mib, gpu, model`)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [
        NodeSpec(
            name=row["sn"],
            cpu_milli=_int(row, "cpu_milli", path, i + 2),
            memory_mib=_int(row, "memory_mib", path, i + 2),
            gpu_count=_int(row, "gpu", path, i + 2),
            gpu_model=(row.get("model") or "") if _int(row, "gpu", path, i + 2) else "",
        )
        for i, row in enumerate(rows)
    ]


def load_pods(path: Path) -> list[PodRequest]:
    """Pods of a trace pod list (`name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec]`)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    pods = []
    for i, row in enumerate(rows):
        num_gpu = _int(row, "num_gpu", path, i + 2)
        spec = row.get("gpu_spec") or ""
        pods.append(
            PodRequest(
                name=row["name"],
                cpu_milli=_int(row, "cpu_milli", path, i + 2),
                memory_mib=_int(row, "memory_mib", path, i + 2),
                num_gpu=num_gpu,
                gpu_milli=_int(row, "gpu_milli", path, i + 2) if num_gpu else 0,
                gpu_models=frozenset(m for m in spec.split("|") if m) if num_gpu else frozenset(),
            )
        )
    return pods


@dataclass(frozen=True)
class Workload:
    """The arrival sequence of one seeded replay."""

    pods: tuple[PodRequest, ...]
    seed: int
    tune: float
    capacity_milli: int

    @property
    def demand_milli(self) -> int:
        return sum(p.total_milli_gpu for p in self.pods)


def tune_and_shuffle(
    pods: Sequence[PodRequest],
    capacity_milli: int,
    tune: float,
    rng: np.random.Generator,
    seed: int = 0,
) -> Workload:
    """Grow or shrink `pods` to `tune` x capacity of requested milli-GPU, then shuffle."""
    if tune <= 0:
        raise InvalidValueError("tune", tune, "must be positive")
    if not pods:
        raise InvalidValueError("pods", 0, "the pod list is empty")
    target = tune * capacity_milli
    chosen = list(pods)
    total = sum(p.total_milli_gpu for p in chosen)
    if total > target:
        while total > target and chosen:
            gone = chosen.pop(int(rng.integers(len(chosen))))
            total -= gone.total_milli_gpu
    else:
        extra = 0
        while True:
            sample = pods[int(rng.integers(len(pods)))]
            if total + sample.total_milli_gpu > target:
                break
            chosen.append(replace(sample, name=f"{sample.name}-tuned-{extra}"))
            total += sample.total_milli_gpu
            extra += 1
    order = rng.permutation(len(chosen))
    return Workload(
        pods=tuple(chosen[i] for i in order),
        seed=seed,
        tune=tune,
        capacity_milli=capacity_milli,
    )
