"""Turning runs into what people read: comparison tables, the plot, and run batches.

Batches run with at most two worker processes: the simulator is single-threaded numpy, and the
machines this runs on (laptops, CI, the shared dev box) have few cores to spare.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alnair.scheduler.simulator.engine import RunResult, simulate
from alnair.scheduler.simulator.reference import Reference, variant_of

MAX_WORKERS = 2


@dataclass(frozen=True)
class RunSpec:
    policy: str
    nodes: Path
    pods: Path
    seed: int
    tune: float
    tie_break: str = "first"
    requests: str = "trace"


def _run(spec: RunSpec) -> RunResult:
    return simulate(
        spec.policy,
        spec.nodes,
        spec.pods,
        spec.seed,
        spec.tune,
        tie_break=spec.tie_break,
        requests=spec.requests,
    )


def run_batch(
    specs: Sequence[RunSpec],
    workers: int = MAX_WORKERS,
    on_done: Callable[[int, int, RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec (in at most `workers` processes); results in spec order."""
    workers = max(1, min(workers, MAX_WORKERS, os.cpu_count() or 1, len(specs)))
    results: list[RunResult] = []
    if workers == 1:
        for i, spec in enumerate(specs, start=1):
            results.append(_run(spec))
            if on_done is not None:
                on_done(i, len(specs), results[-1])
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, result in enumerate(pool.map(_run, specs), start=1):
            results.append(result)
            if on_done is not None:
                on_done(i, len(specs), result)
    return results


def mean_by_policy(results: Sequence[RunResult]) -> dict[tuple[str, str], dict[str, float]]:
    """(variant, policy) -> demand % -> allocation % averaged over seeds."""
    grouped: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for result in results:
        grouped[(variant_of(Path(result.pods_file)), result.policy)].append(
            result.alloc_pct_by_demand
        )
    means: dict[tuple[str, str], dict[str, float]] = {}
    for key, runs in grouped.items():
        points = set.intersection(*(set(r) for r in runs))
        means[key] = {
            p: round(float(np.mean([r[p] for r in runs])), 3) for p in sorted(points, key=int)
        }
    return means


def comparison_table(
    results: Sequence[RunResult],
    reference: Reference | None,
    points: Sequence[int] = (50, 70, 90, 100, 110, 130),
) -> str:
    """Allocation % per policy at several demand points, ours beside the paper's."""
    means = mean_by_policy(results)
    seeds = defaultdict(set)
    for r in results:
        seeds[(variant_of(Path(r.pods_file)), r.policy)].add(r.seed)
    header = f"{'variant':<11} {'policy':<14} {'seeds':>5} " + " ".join(
        f"{str(p) + '%':>15}" for p in points
    )
    lines = [header, "-" * len(header)]
    for (variant, policy), by_point in sorted(means.items()):
        cells = []
        for p in points:
            ours = by_point.get(str(p))
            ref = reference.get((variant, policy, p)) if reference else None
            text = "-" if ours is None else f"{ours:6.2f}"
            text += f" ({ref.mean:6.2f})" if ref else " " * 9
            cells.append(f"{text:>15}")
        lines.append(
            f"{variant:<11} {policy:<14} {len(seeds[(variant, policy)]):>5} " + " ".join(cells)
        )
    lines.append("ours (paper's mean over seeds 42-51, where published)")
    return "\n".join(lines)


def plot(results: Sequence[RunResult], path: Path, title: str) -> Path:
    """GPU allocation vs arrived demand, one line per policy (mean over seeds)."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    means = mean_by_policy(results)
    fig, ax = plt.subplots(figsize=(8, 5))
    for (variant, policy), by_point in sorted(means.items()):
        xs = [int(p) for p in by_point]
        ax.plot(xs, list(by_point.values()), label=f"{policy} ({variant})")
    ax.plot([0, 130], [0, 130], color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlim(50, 130)
    ax.set_ylim(50, 100)
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
