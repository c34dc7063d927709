"""`alnair simulate-jobs`: replay Gavel's Philly-derived arrivals under queueing policies.

    alnair simulate-jobs --policy fifo sjf drf alnair --cluster k80=32,p100=32,v100=32
    alnair simulate-jobs --policy alnair --predictions predicted --json

Each policy runs over the whole trace on the cluster, jobs split over four teams whose cluster
queues share one cohort (equal nominal quotas, borrowing allowed). The table (or, with --json,
one JSON object) gives average and p99 JCT, p99 queueing delay, makespan, utilization, OOM
count, the longest wait of an 8-GPU job, and each team's share of GPU time beside its
entitlement. `--memory-blind` runs the baselines as their peers do, without the predicted
peak memory (the benchmark counts the OOMs that causes); `alnair` is always memory-safe.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alnair.common.errors import AlnairError, InvalidValueError
from alnair.scheduler.jobsim.engine import SimResult, simulate
from alnair.scheduler.jobsim.workload import (
    TEAM_SHARES,
    TEAMS,
    Cluster,
    Predictions,
    load_jobs,
    team_queues,
)
from alnair.scheduler.queueing.registry import QUEUE_POLICIES, QueuePolicy, queue_policy

DEFAULT_CLUSTER = "k80=32,p100=32,v100=32"


def build_policy(name: str, *, memory_blind: bool = False, **options: Any) -> QueuePolicy:
    """The named policy; baselines memory-blind on request (alnair never)."""
    if memory_blind and name.lower() != "alnair":
        options.setdefault("memory_aware", False)
    return queue_policy(name, **options)


def run(
    name: str,
    cluster: Cluster,
    *,
    predictions: Predictions = "oracle",
    seed: int = 0,
    memory_blind: bool = False,
    trace: Path | None = None,
    options: dict[str, Any] | None = None,
    noise_seed: int | None = None,
    limit: int | None = None,
    usage_half_life_s: float | None = None,
    round_s: float | None = None,
    teams: Sequence[str] = TEAMS,
    shares: Sequence[float] = TEAM_SHARES,
) -> SimResult:
    """One replay of the trace (its first `limit` jobs when given) under one policy
    (`noise_seed`: see `load_jobs`; `usage_half_life_s`: keep each queue's decayed use, for
    fair sharing by history; `round_s`: Gavel's round physics, see `engine`; `teams` and
    `shares`: the queues the jobs are split over, one cluster queue each)."""
    jobs = load_jobs(
        cluster,
        predictions=predictions,
        seed=seed,
        trace=trace,
        noise_seed=noise_seed,
        limit=limit,
        teams=teams,
        shares=shares,
    )
    policy = build_policy(name, memory_blind=memory_blind, **(options or {}))
    return simulate(
        policy, jobs, cluster, team_queues(cluster, teams), predictions=predictions,
        usage_half_life_s=usage_half_life_s, round_s=round_s,
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    names = ", ".join(p.name for p in QUEUE_POLICIES)
    parser = argparse.ArgumentParser(
        prog="alnair simulate-jobs",
        description="Replay a job-arrival trace under queueing policies.",
    )
    parser.add_argument("--policy", nargs="+", default=["alnair"], help=f"one or more of: {names}")
    parser.add_argument(
        "--cluster", default=DEFAULT_CLUSTER, help=f"GPUs per type (default {DEFAULT_CLUSTER})"
    )
    parser.add_argument("--predictions", choices=("oracle", "predicted"), default="oracle")
    parser.add_argument("--seed", type=int, default=0, help="team split and prediction noise")
    parser.add_argument("--trace", type=Path, help="trace file (default: the shipped Philly one)")
    parser.add_argument(
        "--memory-blind", action="store_true", help="baselines ignore predicted GPU memory"
    )
    parser.add_argument(
        "--fair-share", type=float, default=0.0,
        help="alnair: fair sharing by history, its factor (0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--half-life-s", type=float, default=7 * 24 * 3600.0,
        help="half-life of the usage history --fair-share reads",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=float, default=None, metavar="SECONDS",
        help="Gavel-compatible physics: decide in rounds of this length, moves cost nothing "
        "(default: the product's, restarts cost and jobs keep their GPUs)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _table(results: Sequence[SimResult]) -> str:
    columns = (
        "avg_jct_s",
        "p99_jct_s",
        "p99_wait_s",
        "makespan_s",
        "utilization",
        "oom",
        "max_wait_8gpu_s",
    )
    rows = [f"{'policy':<10}" + "".join(f"{c:>16}" for c in columns)]
    for result in results:
        metrics = result.metrics()
        rows.append(f"{result.policy:<10}" + "".join(f"{metrics[c]:>16}" for c in columns))
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        cluster = Cluster.parse(args.cluster)
        if cluster.total == 0:
            raise InvalidValueError("cluster", args.cluster, "no GPUs")
        if args.trace is not None and not args.trace.is_file():
            raise InvalidValueError("trace", str(args.trace), "no such file")
        results = [
            run(
                name,
                cluster,
                predictions=args.predictions,
                seed=args.seed,
                memory_blind=args.memory_blind,
                trace=args.trace,
                options={"fair_share": args.fair_share}
                if args.fair_share and name.lower() == "alnair"
                else None,
                usage_half_life_s=args.half_life_s if args.fair_share else None,
                round_s=args.rounds,
            )
            for name in args.policy
        ]
    except AlnairError as err:
        print(f"alnair simulate-jobs: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "cluster": args.cluster,
                    "predictions": args.predictions,
                    "policies": {
                        r.policy: {**r.metrics(), "teams": r.team_shares()} for r in results
                    },
                }
            )
        )
    else:
        print(_table(results))
        for result in results:
            shares = ", ".join(
                f"{team} {v['share']:.2f}/{v['entitlement']:.2f}"
                for team, v in result.team_shares().items()
            )
            print(f"{result.policy}: share/entitlement {shares}")
    return 0
