"""Chaos on the whole local system (`make chaos`): jobs arriving (queued, fractional, gangs,
elastic)
while every service, a standby scheduler included, is killed with SIGKILL at random moments and
restarted, nats-server is down once for a while (with `--topology production`: one of three
NATS servers, then the Redis primary), the API server restarts once and the scheduler holding
the Lease is SIGSTOPped past it; then an invariant checker reads every Job, pod and execution
record.

Defaults are the issue's: 1,000 jobs, 20 kills per service, nats-server down 30 s. Prints one
JSON object: jobs, lost, double_bound, gpu_overcommitted, records_duplicated,
records_missing, kills, recovery_p99_s (time from a kill to the restarted service answering
/readyz), and more (see alnair.dev.chaos). Exits 1 when an invariant does not hold, or
when the over-commit checker took no sample (an invariant checked on nothing holds nothing).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from alnair.dev.chaos import ChaosConfig, run_chaos

INVARIANTS = (
    "lost",
    "double_bound",
    "gpu_overcommitted",
    "records_duplicated",
    "records_missing",
    "admissions_duplicated",
    "completions_duplicated",
    "completions_missing",
    "fault_windows_unsampled",
)


def main(argv: list[str] | None = None) -> int:
    d = ChaosConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=d.jobs)
    p.add_argument("--kills-per-service", type=int, default=d.kills_per_service)
    p.add_argument("--arrival-interval-s", type=float, default=d.arrival_interval_s)
    p.add_argument("--run-s", type=float, nargs=2, default=list(d.run_s), metavar=("MIN", "MAX"))
    p.add_argument("--nats-down-s", type=float, default=d.nats_down_s)
    p.add_argument("--no-apiserver-restart", action="store_true")
    p.add_argument(
        "--leader-stop-s", type=float, default=d.leader_stop_s,
        help="SIGSTOP the scheduler holding the Lease this long, once (0: never)",
    )  # fmt: skip
    p.add_argument(
        "--queued-every", type=int, default=d.queued_every,
        help="every n-th job goes through the dispatcher's queue (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--fraction-every", type=int, default=d.fraction_every,
        help="every n-th job asks a fraction of one GPU (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--gang-every", type=int, default=d.gang_every,
        help="every n-th job neither queued nor fractional is a gang of two pods (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--elastic-every", type=int, default=d.elastic_every,
        help="every n-th job none of the above is a queued ElasticJob (0: none)",
    )  # fmt: skip
    p.add_argument("--settle-s", type=float, default=d.settle_s)
    p.add_argument("--nodes", default=d.nodes)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--topology", choices=("single", "production"), default=d.topology,
        help="production: three NATS servers and Redis with a replica and Sentinels; a NATS "
        "node and the Redis primary are killed instead of the whole bus",
    )  # fmt: skip
    p.add_argument(
        "--dir", type=Path, default=None, help="where the stack lives (default: a temp dir)"
    )
    args = p.parse_args(argv)
    cfg = ChaosConfig(
        jobs=args.jobs,
        kills_per_service=args.kills_per_service,
        arrival_interval_s=args.arrival_interval_s,
        run_s=(args.run_s[0], args.run_s[1]),
        nats_down_s=args.nats_down_s,
        restart_apiserver=not args.no_apiserver_restart,
        leader_stop_s=args.leader_stop_s,
        queued_every=args.queued_every,
        fraction_every=args.fraction_every,
        gang_every=args.gang_every,
        elastic_every=args.elastic_every,
        settle_s=args.settle_s,
        nodes=args.nodes,
        seed=args.seed,
        topology=args.topology,
    )
    directory = args.dir or Path(tempfile.mkdtemp(prefix="alnair-chaos-")) / "stack"
    report = run_chaos(directory, cfg)
    report["stack_dir"] = str(directory)
    print(json.dumps(report))
    held = (
        all(report[k] == 0 for k in INVARIANTS)
        and report["pod_samples"] > 0
        and not report["elastic_problems"]
    )
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
