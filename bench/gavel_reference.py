"""Reproduce bench/reference/gavel_queue.json: Gavel's own simulator on our trace and cluster.

    python bench/gavel_reference.py --gavel /tmp/gavel --python /tmp/gavel-venv/bin/python

`--gavel` is a checkout of github.com/stanford-futuredata/gavel (figures were made at commit
c4fa40097339e9608ab71fd64c8bdea96a5e4a4c); `--python` an interpreter with its simulator's
dependencies (cvxpy, numpy, grpcio, grpcio-tools, func_timeout, matrix_completion). Gavel's
code never enters this repository: this script only writes two input files for it into a
temporary folder and reads the figure its driver prints.

Same input as `make bench-queue`: the shipped Philly-derived trace, rewritten from its 2019
seven-column layout into the ten columns Gavel parses today (priority weight 1, no SLO), and
the shipped throughput table (Gavel's `physical_cluster_throughputs.json`) with the job types
Gavel measured on one GPU only scaled linearly to the GPU counts the trace asks for, exactly as
`alnair.scheduler.jobsim.workload.job_throughput` does. Cluster 32 V100 + 32 P100 + 32 K80,
one GPU per server, rounds of 360 s (Gavel's default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from alnair.common.data import GAVEL_ARRIVALS, data_file, gavel_throughputs
from alnair.scheduler.jobsim.workload import job_throughput, throughput_table

POLICIES = ("fifo", "max_min_fairness_perf", "finish_time_fairness_perf")
CLUSTER_SPEC = "32:32:32"  # v100:p100:k80
OUTPUT = Path(__file__).parent / "reference" / "gavel_queue.json"
ROUND_S = 360.0
DRIVER = "scripts/drivers/simulate_scheduler_with_trace.py"


def write_inputs(folder: Path, source: Path | None = None) -> tuple[Path, Path]:
    """Gavel's inputs in `folder`: the trace `source` (default: the shipped Philly trace) in
    Gavel's ten columns, and the throughput file."""
    source = source if source is not None else data_file(*GAVEL_ARRIVALS)
    trace = folder / f"{source.stem}.gavel.trace"
    needed: set[tuple[str, int]] = set()
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        job_type, command, steps_arg, needs_data, total_steps, arrival, scale = line.split("\t")
        needed.add((job_type, int(scale)))
        # job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps,
        # scale_factor, priority_weight, SLO, arrival_time
        lines.append(
            "\t".join(
                (
                    job_type,
                    command,
                    ".",
                    steps_arg,
                    needs_data,
                    total_steps,
                    scale,
                    "1",
                    "-1",
                    arrival,
                )
            )
        )
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")

    table = throughput_table()
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for row in gavel_throughputs():
        entry = pairs.setdefault(row.gpu.lower(), {}).setdefault(str((row.job, row.scale)), {})
        if not row.partner:
            entry["null"] = row.own
        else:
            entry[str((row.partner, row.partner_scale))] = [row.own, row.partner_own]
    for gpu_type, jobs in pairs.items():
        for job_type, gpus in needed:
            key = str((job_type, gpus))
            if "null" not in jobs.get(key, {}):
                value = job_throughput(table, job_type, gpus, gpu_type)
                jobs.setdefault(key, {})["null"] = value if value is not None else 0.0
    throughputs = folder / "throughputs.json"
    throughputs.write_text(json.dumps(pairs), encoding="utf-8")
    return trace, throughputs


def log_figures(text: str, scales: list[int]) -> dict[str, Any]:
    """Average and p99 JCT, p99 wait, longest 8-GPU wait and makespan from Gavel's output.

    Gavel prints only average JCT and makespan as figures, but its log has the rest (and
    `[Job failed]` for a job whose micro-task failed five times: Gavel leaves it out of its
    average, and `failed_jobs` names it, numbered in trace order from 0, so that a comparison
    can leave it out too):
    `get_average_jct` prints every job's completion time (`Job 12: 3600.000`), and the INFO
    log has `[<time>] [Job dispatched]\tJob ID: <id>` when a job arrives and
    `[<time>] [Micro-task scheduled]\tJob ID: <id>` for each round of 360 s it runs. Jobs are
    numbered in trace order. Two waits:
    - `wait`, as ours (the job simulator's `wait_s`): time not running between arrival and
      completion, JCT less 360 s per round run. A job's last round may end early, so this is a
      lower bound, in Gavel's favour by at most one round per job;
    - `first_start`: time to the job's first round (no time-slicing counted).
    """
    jct_m = re.search(r"Average job completion time: ([0-9.]+) seconds", text)
    if jct_m is None:
        raise SystemExit(f"no average JCT in Gavel's output:\n{text[-2000:]}")
    makespan = re.search(r"Total duration: ([0-9.]+) seconds", text)
    utilization = re.search(r"Cluster utilization: ([0-9.]+)", text)
    jct = {int(j): float(v) for j, v in re.findall(r"^Job (\d+): ([0-9.]+)$", text, re.MULTILINE)}
    arrived: dict[int, float] = {}
    started: dict[int, float] = {}
    rounds: dict[int, int] = {}
    pattern = re.compile(
        r"^scheduler:INFO \[([0-9.]+)\] \[(Job dispatched|Micro-task scheduled)\]"
        r"\tJob ID: (\d+)\t?",
        re.MULTILINE,
    )
    for match in pattern.finditer(text):
        at, kind, job = float(match.group(1)), match.group(2), int(match.group(3))
        if kind == "Job dispatched":
            arrived.setdefault(job, at)
        else:
            started.setdefault(job, at)
            rounds[job] = rounds.get(job, 0) + 1
    failed = sorted(
        int(j) for j in re.findall(r"\[Job failed\]\tJob ID: (\d+)", text, re.MULTILINE)
    )
    wait = {j: max(0.0, v - ROUND_S * rounds.get(j, 0)) for j, v in jct.items()}
    first = {j: started[j] - at for j, at in arrived.items() if j in started}
    wait_8 = [w for j, w in wait.items() if scales[j] >= 8]

    def p99(values: dict[int, float]) -> float | None:
        # Nearest rank, as the job simulator's metrics.
        ranked = sorted(values.values())
        return round(ranked[max(1, math.ceil(0.99 * len(ranked))) - 1], 1) if ranked else None

    return {
        "avg_jct_s": round(float(jct_m.group(1)), 1),
        "p99_jct_s": p99(jct),
        "p99_wait_s": p99(wait),
        "p99_first_start_s": p99(first),
        "makespan_s": round(float(makespan.group(1)), 1) if makespan else None,
        "max_wait_8gpu_s": round(max(wait_8), 1) if wait_8 else None,
        "utilization": float(utilization.group(1)) if utilization else None,
        "jobs": len(jct),
        "failed_jobs": failed,
        "jct_by_job": {str(j): round(v, 1) for j, v in sorted(jct.items())},
    }


def trace_scales(trace: Path) -> list[int]:
    """GPU count of each job, in trace order (the ten-column layout `write_inputs` writes)."""
    return [int(line.split("\t")[6]) for line in trace.read_text(encoding="utf-8").splitlines()]


def run_policy(
    gavel: Path,
    python: str,
    policy: str,
    trace: Path,
    throughputs: Path,
    log: Path,
    solver: str,
    cluster_spec: str = CLUSTER_SPEC,
) -> dict[str, Any]:
    command = [
        python,
        DRIVER,
        "-t",
        str(trace),
        "-p",
        policy,
        "--throughputs_file",
        str(throughputs),
        "-c",
        cluster_spec,
        "--seed",
        "0",
        "--solver",
        solver,
    ]
    started = time.perf_counter()
    # Streamed to a file, not captured: an LP policy runs for hours and the log shows how far
    # it got (each completed job prints a line).
    with log.open("w", encoding="utf-8") as out:
        subprocess.run(
            command,
            cwd=gavel / "scheduler",
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    return {
        **log_figures(log.read_text(encoding="utf-8"), trace_scales(trace)),
        "solver": solver,
        "command": " ".join(command[1:]),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def reparse(out: Path, log_dir: Path | None, policies: list[str]) -> None:
    """Recompute the figures of `policies` from kept logs (a figure added after a long run)."""
    if log_dir is None:
        raise SystemExit("--reparse needs --log-dir")
    result = json.loads(out.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        trace, _ = write_inputs(Path(folder))
        scales = trace_scales(trace)
    for policy in policies:
        log = log_dir / f"gavel-{policy}.log"
        if not log.is_file():
            continue
        entry = result["policies"].get(f"gavel-{policy}", {})
        entry.update(log_figures(log.read_text(encoding="utf-8"), scales))
        result["policies"][f"gavel-{policy}"] = entry
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))


def gavel_commit(gavel: Path) -> str:
    """The checkout's commit; `GAVEL_COMMIT` names it for a copy that is not a git work tree
    (an archive of the fetched repository)."""
    named = os.environ.get("GAVEL_COMMIT")
    if named:
        return named
    return subprocess.run(
        ["git", "-C", str(gavel), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def make_stubs(gavel: Path, python: str) -> None:
    """Gavel's `make`: its simulator imports the gRPC stubs even when it simulates."""
    scheduler = gavel / "scheduler"
    subprocess.run(
        [
            python,
            "-m",
            "grpc_tools.protoc",
            "-Iruntime/protobuf",
            "--python_out=runtime/rpc_stubs",
            "--grpc_python_out=runtime/rpc_stubs",
        ]
        + [str(p.relative_to(scheduler)) for p in (scheduler / "runtime/protobuf").glob("*.proto")],
        cwd=scheduler,
        check=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gavel", type=Path, required=True, help="Gavel checkout")
    parser.add_argument("--python", default=sys.executable, help="interpreter for Gavel")
    parser.add_argument("--policy", nargs="+", default=list(POLICIES))
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument(
        "--solver", default="ECOS", choices=("ECOS", "SCS", "GUROBI"), help="Gavel's cvxpy solver"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep Gavel's output here (default: discard)"
    )
    parser.add_argument(
        "--reparse",
        action="store_true",
        help="do not run Gavel: recompute the figures from the logs in --log-dir",
    )
    args = parser.parse_args()
    if args.reparse:
        reparse(args.out, args.log_dir, args.policy)
        return
    commit = gavel_commit(args.gavel)
    make_stubs(args.gavel, args.python)
    policies: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        trace, throughputs = write_inputs(Path(folder))
        for policy in args.policy:
            log_dir = args.log_dir or Path(folder)
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / f"gavel-{policy}.log"
            figures = run_policy(
                args.gavel, args.python, policy, trace, throughputs, log, args.solver
            )
            # Re-read before writing: policies run as parallel invocations share the file.
            existing = json.loads(args.out.read_text()) if args.out.is_file() else {}
            policies = {**existing.get("policies", {}), f"gavel-{policy}": figures}
            print(policy, figures, file=sys.stderr)
            # Written after each policy: the LP-based ones take far longer than fifo.
            result = {
                "source": "github.com/stanford-futuredata/gavel",
                "commit": commit,
                "cluster_spec_v100_p100_k80": CLUSTER_SPEC,
                "round_s": 360,
                "policies": policies,
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"commit": commit, "policies": policies}))


if __name__ == "__main__":
    main()
