"""Co-location that knows interference, against placement that does not. Prints JSON.

    python bench/colocation.py [--seeds 1 2 3 4 5] [--jobs 400] [--load 0.9]

Ground truth: Gavel's measurements (OSDI 2020, MIT licence; shipped in `alnair.common.data`):
each of its 26 job types alone on one K80, P100 or V100, and every pair it measured sharing
one GPU (what each keeps of its speed alone). Pairs it did not measure share at equal
time-slicing (each keeps half).

The steering table: the predictor's co-location model (random forest, as served) predicts
every pair's slowdown on every type with that pair held out: Gavel's pairs are split into five
folds by pair (`pair_folds`, both orders and every GPU type of a pair in one fold), and each
fold's pairs are predicted by a model trained on the other four. So no figure of the table is
its own training data.

The trace (per seed): `--jobs` jobs of Gavel's types drawn uniformly; 70% are fractions
(300 or 500 milli-GPU) and 30% take a whole GPU; each runs a lognormal time alone on a V100
(median 20 min, clipped to 2 min - 4 h), so its work in steps is that time times its V100
speed alone; arrivals are a Poisson process whose rate offers `--load` of the cluster's
GPUs (12 nodes: four each of 4 x K80, 4 x P100, 4 x V100). Seeds are fixed (default 1-5) and
the policies run in a rotated order per seed.

Replayed by `alnair.scheduler.simulator.sharing` (jobs slow each other as the ground truth
says while they share) under: `alnair+interference` (the live binder's `Interference` filter,
score and GPU choice with the held-out table, cap 2.5x), `alnair` (the same policy without
it), `FGD`, `binpack` and `Random` (random sharing). Reported per policy, median and range over
seeds: average and p99 JCT, makespan, GPU allocation, throughput-weighted GPU utilization,
and the share of co-locations the ground truth slows past the cap.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from alnair.common.colocation import ColocationTable
from alnair.predictor.colocation import ColocQuery, LearnedColocation, pair_folds
from alnair.predictor.datasets import ColocObservation, load_gavel
from alnair.predictor.gpus import lookup_gpu
from alnair.scheduler.cluster.requests import NodeSpec
from alnair.scheduler.plugins.interference import ColocationBook
from alnair.scheduler.plugins.registry import ProfileOptions
from alnair.scheduler.simulator.sharing import Physics, SharedJob, simulate_sharing

GPUS = ("K80", "P100", "V100")
CAP = 2.5
FOLDS = 5


def ground_truth() -> tuple[Physics, list[ColocObservation], list[str]]:
    gavel = load_gavel()
    alone = {
        (str(o.job), o.gpu_type): o.throughput
        for o in gavel.alone
        if o.gpu_count == 1 and o.gpu_type in GPUS
    }
    pairs = [o for o in gavel.colocated if o.gpu_count == 1 and o.gpu_type in GPUS]
    kept = {
        (str(o.job), str(o.partner), o.gpu_type): min(1.0, max(0.005, o.fraction)) for o in pairs
    }
    jobs = sorted({j for j, g in alone if all((j, t) in alone for t in GPUS)})
    return Physics(alone, kept), pairs, jobs


def held_out_table(
    pairs: list[ColocObservation], physics: Physics, jobs: list[str]
) -> ColocationTable:
    """Every pair's predicted kept fraction from a model that never saw that pair."""
    keys = {str(o.job): o.job for o in pairs} | {str(o.partner): o.partner for o in pairs}
    folds = pair_folds(pairs, FOLDS)
    models: list[tuple[set[tuple[str, str]], LearnedColocation]] = []
    for train, test in folds:
        model = LearnedColocation("rf", calibration_folds=0)
        model.fit(train)
        held = {tuple(sorted((str(o.job), str(o.partner)))) for o in test}
        models.append((held, model))  # type: ignore[arg-type]
    kept: dict[str, list[list[float]]] = {}
    for gpu in GPUS:
        spec = lookup_gpu(gpu)
        matrix = [[0.5] * len(jobs) for _ in jobs]
        queries: dict[int, list[tuple[int, int, ColocQuery]]] = defaultdict(list)
        for i, a in enumerate(jobs):
            for j, b in enumerate(jobs):
                if a not in keys or b not in keys:
                    continue
                pair = tuple(sorted((a, b)))
                fold = next((k for k, (held, _) in enumerate(models) if pair in held), 0)
                q = ColocQuery(keys[a], keys[b], spec, 1, math.log(physics.alone[(a, gpu)]),
                               math.log(physics.alone[(b, gpu)]))  # fmt: skip
                queries[fold].append((i, j, q))
        for fold, asked in queries.items():
            answers = models[fold][1].predict([q for _, _, q in asked])
            for (i, j, _), answer in zip(asked, answers, strict=True):
                matrix[i][j] = max(0.005, min(1.0, answer.fraction))
        kept[gpu] = matrix
    return ColocationTable(0, tuple(jobs), kept)


def cluster() -> list[NodeSpec]:
    return [
        NodeSpec(f"{gpu.lower()}-{n}", 64_000, 512_000, 4, gpu) for gpu in GPUS for n in range(4)
    ]


def trace(seed: int, count: int, load: float, physics: Physics, jobs: list[str]) -> list[SharedJob]:
    rng = np.random.default_rng(seed)
    drawn = []
    for k in range(count):
        workload = jobs[int(rng.integers(len(jobs)))]
        milli = 1000 if rng.random() < 0.3 else int(rng.choice([300, 500]))
        alone_s = float(np.clip(rng.lognormal(math.log(1200.0), 0.8), 120.0, 14_400.0))
        drawn.append((f"job-{k:04d}", workload, milli, alone_s))
    gpus = len(cluster()) * 4
    offered = sum(s * m / 1000 for _, _, m, s in drawn)
    window = offered / (load * gpus)
    arrivals = np.sort(rng.uniform(0.0, window, count))
    return [
        SharedJob(name, workload, float(at), milli, alone_s * physics.alone[(workload, "V100")])
        for (name, workload, milli, alone_s), at in zip(drawn, arrivals, strict=True)
    ]


def policies(table: ColocationTable, cap: float) -> list[tuple[str, str, ProfileOptions | None]]:
    aware = ProfileOptions(colocation=ColocationBook(table), max_colocation_slowdown=cap)
    return [
        ("alnair+interference", "alnair", aware),
        ("alnair", "alnair", None),
        ("FGD", "FGD", None),
        ("binpack", "binpack", None),
        ("Random", "Random", None),
    ]


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/colocation.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--load", type=float, default=0.9, help="offered share of the GPUs")
    parser.add_argument("--cap", type=float, default=CAP, help="slowdown cap (the live default)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    physics, pairs, jobs = ground_truth()
    table = held_out_table(pairs, physics, jobs)
    runs: list[dict[str, object]] = []
    plans = policies(table, args.cap)
    for n, seed in enumerate(args.seeds):
        replay = trace(seed, args.jobs, args.load, physics, jobs)
        order = plans[n % len(plans) :] + plans[: n % len(plans)]  # alternate who runs first
        for label, policy, options in order:
            result = simulate_sharing(policy, cluster(), replay, physics, seed, options=options,
                                      label=label, cap=args.cap)  # fmt: skip
            runs.append(result.to_json())
    by_policy: dict[str, list[dict[str, object]]] = defaultdict(list)
    for run in runs:
        by_policy[str(run["policy"])].append(run)
    metrics = ("avg_jct_s", "p99_jct_s", "makespan_s", "gpu_alloc_pct", "alloc_while_waiting_pct",
               "throughput_util_pct",
               "slowed_past_cap_pct")  # fmt: skip
    summary = {
        label: {m: _summary([float(r[m]) for r in rows]) for m in metrics}  # type: ignore[arg-type]
        for label, rows in by_policy.items()
    }
    best = min(summary, key=lambda p: summary[p]["avg_jct_s"]["median"])
    aware = summary["alnair+interference"]
    report = {
        "benchmark": "colocation",
        "ground_truth": "Gavel throughputs (alone and measured pairs, 1 GPU)",
        "table": f"random forest, pairs held out in {FOLDS} folds by pair",
        "cap": args.cap,
        "cluster": "12 nodes: 4 x (4 x K80), 4 x (4 x P100), 4 x (4 x V100)",
        "trace": {
            "jobs": args.jobs,
            "load": args.load,
            "fractional_share": 0.7,
            "median_alone_v100_s": 1200,
            "seeds": args.seeds,
        },
        "summary": summary,
        "verdict": {
            "lowest_avg_jct": best,
            "interference_aware_lowest": best == "alnair+interference",
            "alloc_vs_fgd_pct_points": round(
                aware["gpu_alloc_pct"]["median"] - summary["FGD"]["gpu_alloc_pct"]["median"], 2
            ),
        },
        "runs": runs,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
