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
DRIVER = "scripts/drivers/simulate_scheduler_with_trace.py"


def write_inputs(folder: Path) -> tuple[Path, Path]:
    trace = folder / "philly-seed0.gavel.trace"
    needed: set[tuple[str, int]] = set()
    lines = []
    for line in data_file(*GAVEL_ARRIVALS).read_text(encoding="utf-8").splitlines():
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
        for job_type, scale in needed:
            key = str((job_type, scale))
            if "null" not in jobs.get(key, {}):
                value = job_throughput(table, job_type, scale, gpu_type)
                jobs.setdefault(key, {})["null"] = value if value is not None else 0.0
    throughputs = folder / "throughputs.json"
    throughputs.write_text(json.dumps(pairs), encoding="utf-8")
    return trace, throughputs


def run_policy(
    gavel: Path, python: str, policy: str, trace: Path, throughputs: Path
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
        CLUSTER_SPEC,
        "--seed",
        "0",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=gavel / "scheduler", capture_output=True, text=True, check=True
    )
    text = done.stdout + done.stderr
    jct = re.search(r"Average job completion time: ([0-9.]+) seconds", text)
    makespan = re.search(r"Total duration: ([0-9.]+) seconds", text)
    if jct is None:
        raise SystemExit(f"no average JCT in Gavel's output for {policy}:\n{text[-2000:]}")
    return {
        "avg_jct_s": round(float(jct.group(1)), 1),
        "makespan_s": round(float(makespan.group(1)), 1) if makespan else None,
        "command": " ".join(command[1:]),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gavel", type=Path, required=True, help="Gavel checkout")
    parser.add_argument("--python", default=sys.executable, help="interpreter for Gavel")
    parser.add_argument("--policy", nargs="+", default=list(POLICIES))
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(args.gavel), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(
        [
            args.python,
            "-m",
            "grpc_tools.protoc",
            "-Iruntime/protobuf",
            "--python_out=runtime/rpc_stubs",
            "--grpc_python_out=runtime/rpc_stubs",
        ]
        + [
            str(p.relative_to(args.gavel / "scheduler"))
            for p in (args.gavel / "scheduler" / "runtime" / "protobuf").glob("*.proto")
        ],
        cwd=args.gavel / "scheduler",
        check=True,
    )
    existing = json.loads(args.out.read_text()) if args.out.is_file() else {}
    policies = dict(existing.get("policies", {}))
    with tempfile.TemporaryDirectory() as folder:
        trace, throughputs = write_inputs(Path(folder))
        for policy in args.policy:
            policies[f"gavel-{policy}"] = run_policy(
                args.gavel, args.python, policy, trace, throughputs
            )
            print(policy, policies[f"gavel-{policy}"], file=sys.stderr)
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
