"""Placement benchmark, printed as JSON. Two modes:

    python bench/placement.py [--seed 42] [--variant default] [--policy FGD alnair ...]
    python bench/placement.py --table [--variants all] [--seed 42-51] [--policy FGD alnair]

The first replays one trace with one seed per policy and reports the GPU allocation at 100%
arrived demand and the wall time of one full replay; runs are sequential, so each wall time is
one process on one core. The second is the robustness table: every variant (the nine shipped
ones and those built from `default` by the published recipe, `simulator.variants`) x policy x
seed, with mean, median and spread over the seeds of the allocation at several demand points
and, per variant, how far each policy is from FGD. Allocation does not depend on the order the
runs are made in (a replay is a pure function of its seed), so the table runs in the
simulator's worker pool.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from alnair.scheduler.plugins.registry import POLICIES, policy
from alnair.scheduler.simulator.cli import parse_seeds
from alnair.scheduler.simulator.engine import RunResult, simulate
from alnair.scheduler.simulator.report import MAX_WORKERS, RunSpec, run_batch
from alnair.scheduler.simulator.trace import DEFAULT_TUNE, NODE_FILE, VARIANTS, trace_dir
from alnair.scheduler.simulator.variants import DEFAULT_FOLDER, canonical, materialize

BUILT = (
    "gen-gpushare60",
    "gen-gpushare80",
    "gen-gpushare100",
    "gen-gpuspec20",
    "gen-gpuspec33",
    "gen-gpuspec40",
    "gen-gpuspec50",
    "gen-multigpu50",
    "gen-gpushare60+gpuspec20",
)
"""The built variants the table covers: the paper's shares the trace does not ship, the
`gpuspec` family up to half the GPU pods naming models, and one combination (more fractional
pods, some of them bound to GPU models)."""

POINTS = ("90", "100", "110", "130")
"""Arrived demand (% of GPU capacity) at which allocation is reported; 100 is the headline."""


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 3),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "stdev": round(statistics.stdev(values), 3) if len(values) > 1 else 0.0,
    }


def at(result: RunResult, point: str) -> float:
    return result.alloc_pct_by_demand.get(point, float("nan"))


def _paired(
    ours: dict[int, RunResult], fgd: dict[int, RunResult], seeds: list[int], point: str
) -> dict[str, float]:
    """Statistics of (policy - FGD) over seeds, same seed paired, and on how many seeds the
    policy is at or above FGD."""
    diffs = [at(ours[s], point) - at(fgd[s], point) for s in seeds]
    return {**_stats(diffs), "seeds_at_or_above": sum(d >= 0 for d in diffs)}


def _variants(names: list[str]) -> list[str]:
    chosen: list[str] = []
    for name in names:
        if name == "all":
            chosen.extend((*VARIANTS, *BUILT))
        elif name == "shipped":
            chosen.extend(VARIANTS)
        elif name == "built":
            chosen.extend(BUILT)
        else:
            chosen.append(canonical(name))
    return list(dict.fromkeys(chosen))


def speed(args: argparse.Namespace) -> dict[str, object]:
    nodes = trace_dir() / NODE_FILE
    pods = materialize(args.variant, args.folder)
    seed = parse_seeds(args.seed)[0]
    per_policy: dict[str, dict[str, object]] = {}
    for name in args.policy:
        result = simulate(policy(name).name, nodes, pods, seed)
        per_policy[result.policy] = {
            "alloc_pct_at_100": result.alloc_pct_by_demand.get("100"),
            "pods": result.pods,
            "placed": result.placed,
            "wall_s": round(result.wall_s, 2),
        }
        print(f"{result.policy}: {result.wall_s:.1f} s", file=sys.stderr, flush=True)
    return {"benchmark": "placement", "trace": pods.name, "seed": seed, "policies": per_policy}


def table(args: argparse.Namespace) -> dict[str, object]:
    nodes = trace_dir() / NODE_FILE
    seeds = parse_seeds(args.seed)
    names = [policy(p).name for p in args.policy]
    variants = _variants(args.variants)
    paths = {v: materialize(v, args.folder) for v in variants}
    specs = [
        RunSpec(p, nodes, paths[v], s, DEFAULT_TUNE) for v in variants for s in seeds for p in names
    ]
    started = time.perf_counter()

    def progress(done: int, total: int, result: RunResult) -> None:
        print(
            f"[{done}/{total}] {Path(result.pods_file).stem} {result.policy} seed {result.seed}: "
            f"{result.alloc_pct_by_demand.get('100')} ({result.wall_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    results = run_batch(specs, args.workers, progress)
    runs: dict[tuple[str, str], dict[int, RunResult]] = {}
    for spec, result in zip(specs, results, strict=True):
        variant = next(v for v, path in paths.items() if path == spec.pods)
        runs.setdefault((variant, result.policy), {})[spec.seed] = result

    per_variant: dict[str, object] = {}
    headline: dict[str, dict[str, float]] = {}
    for variant in variants:
        policies: dict[str, object] = {}
        for name in names:
            by_seed = runs[(variant, name)]
            policies[name] = {
                "alloc_pct": {pt: _stats([at(r, pt) for r in by_seed.values()]) for pt in POINTS},
                "at_100_by_seed": {str(s): round(at(r, "100"), 4) for s, r in by_seed.items()},
                "unscheduled_mean": round(
                    statistics.fmean(r.pods - r.placed for r in by_seed.values()), 1
                ),
                "wall_s_median": round(statistics.median(r.wall_s for r in by_seed.values()), 2),
            }
        entry: dict[str, object] = {"built": variant.startswith("gen-"), "policies": policies}
        if "FGD" in names:
            fgd = runs[(variant, "FGD")]
            entry["minus_fgd"] = {
                name: {pt: _paired(runs[(variant, name)], fgd, seeds, pt) for pt in POINTS}
                for name in names
                if name != "FGD"
            }
            headline[variant] = {
                name: entry["minus_fgd"][name]["100"]["mean"]  # type: ignore[index]
                for name in names
                if name != "FGD"
            }
        per_variant[variant] = entry
    summary: dict[str, object] = {}
    for name in names:
        if name == "FGD" or not headline:
            continue
        diffs = [headline[v][name] for v in variants]
        summary[name] = {
            "mean_minus_fgd_at_100": round(statistics.fmean(diffs), 3),
            "worst_minus_fgd_at_100": round(min(diffs), 3),
            "variants_below_fgd_at_100": [v for v in variants if headline[v][name] < 0],
        }
    return {
        "benchmark": "placement-variants",
        "seeds": seeds,
        "tune": DEFAULT_TUNE,
        "demand_points_pct": list(POINTS),
        "wall_s": round(time.perf_counter() - started, 1),
        "variants": per_variant,
        "summary": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", default="42", help="N, A-B or N,M,... (the table: 42-51)")
    parser.add_argument("--variant", default="default", help="the speed mode's trace")
    parser.add_argument("--policy", nargs="+", help="default: all (speed), FGD alnair (table)")
    parser.add_argument("--table", action="store_true", help="the variant x policy table")
    parser.add_argument(
        "--variants", nargs="+", default=["all"], help="all, shipped, built, or names"
    )
    parser.add_argument("--workers", type=int, default=MAX_WORKERS)
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="built variants' CSVs")
    args = parser.parse_args()
    if args.table:
        args.policy = args.policy or ["FGD", "alnair"]
        if args.seed == "42":
            args.seed = "42-51"
        out = table(args)
    else:
        args.policy = args.policy or [p.name for p in POLICIES]
        out = speed(args)
    out["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
