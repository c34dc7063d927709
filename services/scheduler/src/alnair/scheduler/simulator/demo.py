"""`make demo`: every placement policy on the production trace, beside the paper's numbers.

Replays the `default` Alibaba GPU trace (cluster-trace-gpu-v2023; Weng et al., USENIX ATC'23)
under the six published baselines, binpack, spread and our `alnair` policy for a few seeds,
prints GPU allocation at several arrived-demand points next to the paper's simulator, and saves
the allocation-vs-demand plot under out/demo/.

    python -m alnair.scheduler.simulator.demo [--seeds 42-44] [--variant default]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from alnair.common.errors import AlnairError
from alnair.scheduler.plugins.registry import POLICIES, policy
from alnair.scheduler.simulator.cli import parse_seeds
from alnair.scheduler.simulator.reference import load_reference
from alnair.scheduler.simulator.report import (
    RunSpec,
    comparison_table,
    mean_by_policy,
    plot,
    run_batch,
)
from alnair.scheduler.simulator.trace import DEFAULT_TUNE, NODE_FILE, pods_file, trace_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.scheduler.simulator.demo")
    parser.add_argument("--seeds", default="42-44", help="seed range (the paper used 42-51)")
    parser.add_argument("--variant", default="default", help="trace variant")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="plot directory")
    parser.add_argument("--policies", nargs="+", help="only these (default: every policy)")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        seeds = parse_seeds(args.seeds)
        names = [policy(p).name for p in args.policies] if args.policies else None
        nodes = trace_dir() / NODE_FILE
        pods = pods_file(args.variant)
        reference = load_reference()
    except (AlnairError, OSError) as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2

    chosen = names or [p.name for p in POLICIES]
    print(
        f"Replaying {pods.name} on {nodes.name} ({len(chosen)} policies x {len(seeds)} seeds,"
        f" demand tuned to {DEFAULT_TUNE:.0%} of GPU capacity)...",
        flush=True,
    )
    started = time.perf_counter()
    specs = [RunSpec(p, nodes, pods, s, DEFAULT_TUNE) for p in chosen for s in seeds]

    def progress(done: int, total: int, result: object) -> None:
        sys.stderr.write(f"\r  {done}/{total} runs")
        sys.stderr.flush()

    results = run_batch(specs, on_done=progress)
    sys.stderr.write("\n")
    print(comparison_table(results, reference))
    means = mean_by_policy(results)
    fgd = means.get((args.variant, "FGD"), {}).get("100")
    ours = means.get((args.variant, "alnair"), {}).get("100")
    if fgd is not None and ours is not None:
        print(f"alnair vs FGD at 100% arrived demand: {ours - fgd:+.2f} points")
    chart = plot(
        results,
        args.out / f"alibaba-{args.variant}.png",
        f"Alibaba GPU trace ({args.variant}), mean over seeds {args.seeds}",
    )
    runs = [r.wall_s for r in results]
    print(
        f"plot: {chart}\n{len(results)} runs in {time.perf_counter() - started:.0f} s "
        f"(one run: {min(runs):.1f}-{max(runs):.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
