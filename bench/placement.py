"""Placement benchmark: per policy, GPU allocation at 100% arrived demand and the wall time of one
full replay (default Alibaba trace, one seed), printed as JSON.

    python bench/placement.py [--seed 42] [--variant default] [--policy FGD alnair ...]

Runs are sequential so each wall time is one process on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from alnair.scheduler.plugins.registry import POLICIES, policy
from alnair.scheduler.simulator.engine import simulate
from alnair.scheduler.simulator.trace import NODE_FILE, pods_file, trace_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--variant", default="default")
    parser.add_argument("--policy", nargs="+", default=[p.name for p in POLICIES])
    args = parser.parse_args()
    nodes = trace_dir() / NODE_FILE
    pods = pods_file(args.variant)
    per_policy: dict[str, dict[str, object]] = {}
    out: dict[str, object] = {
        "benchmark": "placement",
        "trace": pods.name,
        "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "policies": per_policy,
    }
    for name in args.policy:
        result = simulate(policy(name).name, nodes, pods, args.seed)
        per_policy[result.policy] = {
            "alloc_pct_at_100": result.alloc_pct_by_demand.get("100"),
            "pods": result.pods,
            "placed": result.placed,
            "wall_s": round(result.wall_s, 2),
        }
        print(f"{result.policy}: {result.wall_s:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
