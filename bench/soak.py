"""Soak of the whole local system (`make soak`): steady job churn on many KWOK GPU nodes with the
scheduler, the profiler (sim agent and aggregator), the predictor and the dispatcher running as
in `make up`; each service's RSS and the queues sampled every minute.

Defaults are the issue's: 30 minutes, 1,000 KWOK nodes. Prints one JSON object: per service
RSS start/end/max and slope (MiB, MiB/h), per queue (scheduler pending, pods not yet bound,
JetStream consumers' pending) start/end/max/slope, and the failures (see alnair.dev.soak
for the bounds). Exits 1 when memory grew beyond the bound, a queue grew, or a service died.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from alnair.dev.soak import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    d = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=d.minutes)
    p.add_argument("--nodes", default=d.nodes)
    p.add_argument("--arrival-interval-s", type=float, default=d.arrival_interval_s)
    p.add_argument("--run-s", type=float, nargs=2, default=list(d.run_s), metavar=("MIN", "MAX"))
    p.add_argument("--sample-interval-s", type=float, default=d.sample_interval_s)
    p.add_argument("--rss-growth-bound-mib", type=float, default=d.rss_growth_bound_mib)
    p.add_argument("--rss-growth-bound-frac", type=float, default=d.rss_growth_bound_frac)
    p.add_argument("--queue-growth-bound", type=int, default=d.queue_growth_bound)
    p.add_argument(
        "--services", default=",".join(d.services), help="comma-separated devstack services"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--dir", type=Path, default=None, help="where the stack lives (default: a temp dir)"
    )
    args = p.parse_args(argv)
    cfg = SoakConfig(
        minutes=args.minutes,
        nodes=args.nodes,
        arrival_interval_s=args.arrival_interval_s,
        run_s=(args.run_s[0], args.run_s[1]),
        sample_interval_s=args.sample_interval_s,
        services=tuple(s.strip() for s in args.services.split(",") if s.strip()),
        rss_growth_bound_mib=args.rss_growth_bound_mib,
        rss_growth_bound_frac=args.rss_growth_bound_frac,
        queue_growth_bound=args.queue_growth_bound,
        seed=args.seed,
    )
    directory = args.dir or Path(tempfile.mkdtemp(prefix="alnair-soak-")) / "stack"
    report = run_soak(directory, cfg)
    report["stack_dir"] = str(directory)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
