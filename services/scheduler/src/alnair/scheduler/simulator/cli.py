"""`alnair simulate`: replay the Alibaba GPU trace under one or more placement policies.

    alnair simulate --nodes NODES.csv --pods PODS.csv --policy FGD --seed 42 --json
    alnair simulate --policy FGD BestFit alnair --seed 42-51 --plot out/cmp.png
    alnair simulate --variant gen-gpushare60+gpuspec20 --policy FGD alnair --seed 42-44
    alnair simulate --gangs 400 --policy alnair --seed 42
    alnair simulate --requests claims --policy FGD --seed 42 --json

One policy and one seed: a progress bar and a table (or, with --json, one JSON object with the
allocation at each whole percent of arrived demand). Several policies or a seed range: the runs
are compared (mean over seeds, beside the paper's numbers where published) and a PNG plot of
allocation against arrived demand is written. `--variant` names a shipped trace variant or one
built from `default` by the published recipe (`simulator.variants`: `gen-gpushare60`, ...).
`--gangs JOBS` replays the Gavel job trace with gangs and priorities instead (`simulator.gangs`).
`--requests claims` writes each pod's GPU request as a ResourceClaim of Alnair's DeviceClasses
(`resources`: as `alnair.io/gpu-memory`/`gpu-compute`) and replays what the scheduler reads back
(`simulator.claims`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from alnair.common.errors import AlnairError, InvalidValueError
from alnair.scheduler.framework.runtime import TIE_BREAKS
from alnair.scheduler.plugins.registry import POLICIES, policy
from alnair.scheduler.simulator.claims import FORMS
from alnair.scheduler.simulator.engine import RunResult, simulate
from alnair.scheduler.simulator.gangs import GangReplayConfig, replay_gangs
from alnair.scheduler.simulator.reference import load_reference, variant_of
from alnair.scheduler.simulator.report import (
    MAX_WORKERS,
    RunSpec,
    comparison_table,
    mean_by_policy,
    plot,
    run_batch,
)
from alnair.scheduler.simulator.trace import DEFAULT_TUNE, NODE_FILE, VARIANTS, trace_dir
from alnair.scheduler.simulator.variants import DEFAULT_FOLDER, materialize


def parse_seeds(text: str) -> list[int]:
    """`42`, `42-51` or `42,44,46` -> the seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                low, high = part.split("-", 1)
                first, last = int(low), int(high)
                if last < first:
                    raise InvalidValueError("seed", text, "a range must go upwards")
                seeds.extend(range(first, last + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise InvalidValueError("seed", text, "expected N, A-B or N,M,...") from None
    return seeds


def _parser() -> argparse.ArgumentParser:
    names = ", ".join(p.name for p in POLICIES)
    parser = argparse.ArgumentParser(
        prog="alnair simulate",
        description="Replay a GPU pod trace under placement policies.",
    )
    parser.add_argument("--nodes", type=Path, help="node CSV (default: the trace's GPU nodes)")
    parser.add_argument("--pods", type=Path, help="pod CSV (default: the `default` trace)")
    parser.add_argument(
        "--variant",
        help=f"trace variant instead of --pods: shipped ({', '.join(VARIANTS)}) or built "
        f"(gen-gpushareN, gen-gpuspecN, gen-multigpuN, joined by '+'; written to {DEFAULT_FOLDER})",
    )
    parser.add_argument("--policy", nargs="+", default=["alnair"], help=f"one or more of: {names}")
    parser.add_argument("--seed", default="42", help="N, A-B or N,M,... (default 42)")
    parser.add_argument(
        "--tune", type=float, default=DEFAULT_TUNE, help="demand as a multiple of GPU capacity"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", type=Path, help="PNG path for a comparison plot")
    parser.add_argument(
        "--workers", type=int, default=MAX_WORKERS, help=f"processes (at most {MAX_WORKERS})"
    )
    parser.add_argument(
        "--gangs",
        type=int,
        metavar="JOBS",
        help="replay the first JOBS jobs of the Gavel trace as gangs of 1-GPU pods with seeded "
        "priorities (coscheduling, preemption, node reservations) and print JSON",
    )
    parser.add_argument(
        "--high-priority-share",
        type=float,
        default=0.2,
        help="with --gangs: share of jobs given a high priority (default 0.2)",
    )
    parser.add_argument(
        "--requests",
        choices=FORMS,
        default="trace",
        help="how each pod asks for GPUs: the trace's milli-GPU, Kubernetes resources "
        "(alnair.io/gpu-memory, gpu-compute, nvidia.com/gpu) or a ResourceClaim of Alnair's "
        "DeviceClasses, read back by the scheduler's own parsers",
    )
    parser.add_argument(
        "--tie-break",
        choices=TIE_BREAKS,
        default="first",
        help="equal best scores: first node in the seeded node order (the paper's simulator) "
        "or uniformly random (upstream kube-scheduler)",
    )
    return parser


def _bar(done: int, total: int) -> None:
    width = 40
    filled = width * done // max(total, 1)
    end = "\n" if done == total else ""
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stderr.flush()


def _single_table(result: RunResult) -> str:
    rows = [
        f"policy {result.policy}, seed {result.seed}: {result.placed}/{result.pods} pods placed "
        f"in {result.wall_s:.1f} s",
        f"{'arrived demand %':>17} {'GPU allocation %':>17}",
    ]
    for point in range(50, 131, 10):
        value = result.alloc_pct_by_demand.get(str(point))
        if value is not None:
            rows.append(f"{point:>17} {value:>17.2f}")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        policies = [policy(name).name for name in args.policy]
        seeds = parse_seeds(args.seed)
        if args.gangs is not None:
            runs = [
                replay_gangs(
                    GangReplayConfig(
                        policy=p,
                        seed=s,
                        jobs=args.gangs,
                        high_priority_share=args.high_priority_share,
                    )
                ).to_json()
                for p in policies
                for s in seeds
            ]
            print(json.dumps(runs[0] if len(runs) == 1 else {"runs": runs}))
            return 0
        nodes = args.nodes or trace_dir() / NODE_FILE
        if args.variant and args.pods:
            raise InvalidValueError("variant", args.variant, "give --variant or --pods, not both")
        pods = args.pods or materialize(args.variant or "default")
        for path, field in ((nodes, "nodes"), (pods, "pods")):
            if not path.is_file():
                raise InvalidValueError(field, str(path), "no such file")
        if args.tune <= 0:
            raise InvalidValueError("tune", args.tune, "must be positive")

        if len(policies) == 1 and len(seeds) == 1:
            progress = None if args.json else _bar
            result = simulate(
                policies[0],
                nodes,
                pods,
                seeds[0],
                args.tune,
                progress,
                tie_break=args.tie_break,
                requests=args.requests,
            )
            print(json.dumps(result.to_json()) if args.json else _single_table(result))
            return 0

        specs = [
            RunSpec(p, nodes, pods, s, args.tune, args.tie_break, args.requests)
            for p in policies
            for s in seeds
        ]
        results = run_batch(specs, args.workers, None if args.json else lambda d, t, _: _bar(d, t))
        try:
            reference = load_reference()
        except (OSError, AlnairError):
            reference = None
        chart = args.plot or Path("out") / f"simulate-{variant_of(pods)}.png"
        plot(results, chart, f"{variant_of(pods)}: GPU allocation vs arrived demand")
        if args.json:
            means = mean_by_policy(results)
            print(
                json.dumps(
                    {
                        "runs": [r.to_json() for r in results],
                        "mean_alloc_pct_by_demand": {
                            policy_name: points for (_, policy_name), points in means.items()
                        },
                        "plot": str(chart),
                    }
                )
            )
        else:
            print(comparison_table(results, reference))
            print(f"plot: {chart}")
        return 0
    except AlnairError as err:
        print(f"alnair simulate: {err}", file=sys.stderr)
        return 2
