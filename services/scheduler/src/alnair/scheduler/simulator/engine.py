"""One replay: pods arrive one by one, never leave, and a policy places each or leaves it pending.

After every arrival the engine records arrived demand (requested milli-GPU so far over cluster
capacity) and GPU allocation (placed milli-GPU over capacity). The result reports allocation at
each whole percent of arrived demand: the allocation after the last arrival whose demand does
not exceed that percent, which is how the paper's figures and `fgd_reference.csv` read.

Everything random (tuning, shuffling, tie-breaks, the Random policy) comes from one generator
seeded with the run's seed, so a run replays exactly.

`requests` says how each pod's GPU request reaches the policy: the trace's milli-GPU as is, or
written as Kubernetes resources or as a ResourceClaim and read back by the scheduler's parsers
(`simulator.claims`). The result keeps every placement, so two forms can be compared pod by pod.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alnair.scheduler.cluster.requests import FloatArray
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.plugins.registry import framework
from alnair.scheduler.simulator.claims import written_as
from alnair.scheduler.simulator.trace import DEFAULT_TUNE, load_nodes, load_pods, tune_and_shuffle

Progress = Callable[[int, int], None]


@dataclass
class RunResult:
    policy: str
    seed: int
    nodes_file: str
    pods_file: str
    tune: float
    total_milli_gpu: int
    pods: int
    placed: int
    demand_pct: FloatArray
    alloc_pct: FloatArray
    wall_s: float
    alloc_pct_by_demand: dict[str, float] = field(default_factory=dict)
    requests: str = "trace"
    placements: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Each placed pod's node and GPUs."""

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "nodes": self.nodes_file,
            "pods_file": self.pods_file,
            "tune": self.tune,
            "requests": self.requests,
            "total_milli_gpu": self.total_milli_gpu,
            "pods": self.pods,
            "placed": self.placed,
            "unscheduled": self.pods - self.placed,
            "wall_s": round(self.wall_s, 3),
            "alloc_pct_by_demand": self.alloc_pct_by_demand,
        }


def alloc_by_demand(demand_pct: FloatArray, alloc_pct: FloatArray, top: int) -> dict[str, float]:
    """Allocation at each whole percent 1..top of arrived demand (see the module docstring)."""
    out: dict[str, float] = {}
    for percent in range(1, top + 1):
        at = int(np.searchsorted(demand_pct, percent + 1e-9, side="right")) - 1
        out[str(percent)] = round(float(alloc_pct[at]), 4) if at >= 0 else 0.0
    return out


def simulate(
    policy: str,
    nodes_path: Path,
    pods_path: Path,
    seed: int,
    tune: float = DEFAULT_TUNE,
    progress: Progress | None = None,
    tie_break: str = "first",
    requests: str = "trace",
) -> RunResult:
    """Replay the trace under `policy` with `seed`, each pod's GPU request written as `requests`
    (`trace`, `resources` or `claims`)."""
    started = time.perf_counter()
    nodes = load_nodes(nodes_path)
    original = written_as(requests, load_pods(pods_path))
    rng = np.random.default_rng(seed)
    # The node order is a seeded permutation: with first-node tie-breaking it decides which of
    # equally good nodes fill first, as the random name prefixes do in the paper's simulator.
    order = rng.permutation(len(nodes))
    snapshot = ClusterSnapshot.build([nodes[i] for i in order])
    capacity = snapshot.gpu_capacity_milli
    workload = tune_and_shuffle(original, capacity, tune, rng, seed)
    # Typical pods come from the original pod list, as in the paper's simulator.
    fw = framework(policy, original, tie_break=tie_break)

    count = len(workload.pods)
    demand = np.zeros(count + 1)
    alloc = np.zeros(count + 1)
    arrived = 0
    allocated = 0
    placed = 0
    placements: dict[str, tuple[str, tuple[int, ...]]] = {}
    step = max(count // 100, 1)
    for i, pod in enumerate(workload.pods, start=1):
        arrived += pod.total_milli_gpu
        result = fw.schedule(pod, snapshot, rng)
        if result.placement is not None:
            snapshot.assume(pod, result.placement)
            allocated += pod.total_milli_gpu
            placed += 1
            placements[pod.name] = (result.placement.node_name, result.placement.gpu_indices)
        demand[i] = arrived
        alloc[i] = allocated
        if progress is not None and (i % step == 0 or i == count):
            progress(i, count)
    demand_pct = 100.0 * demand / capacity
    alloc_pct = 100.0 * alloc / capacity
    # Tuning stops just short of the target (e.g. 129.98%), which still counts as its last point.
    top = round(float(demand_pct[-1]))
    return RunResult(
        policy=fw.name,
        seed=seed,
        nodes_file=str(nodes_path),
        pods_file=str(pods_path),
        tune=tune,
        total_milli_gpu=capacity,
        pods=count,
        placed=placed,
        demand_pct=demand_pct,
        alloc_pct=alloc_pct,
        wall_s=time.perf_counter() - started,
        alloc_pct_by_demand=alloc_by_demand(demand_pct, alloc_pct, top),
        requests=requests,
        placements=placements,
    )
