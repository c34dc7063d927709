"""Draw the queue benchmark's trace family with Gavel's own job generator (run outside CI).

    python bench/gavel_family.py draw --gavel /tmp/gavel --python /tmp/gavel-venv/bin/python

Each trace is drawn exactly as Gavel's `simulate_scheduler_with_generated_jobs.py -m` draws
jobs at a seed: job parameters from `utils.generate_job(..., generate_multi_gpu_jobs=True)`
with `random.Random(seed + 2)` (Philly-like scale factors 1/2/4/8 at 70/10/15/5% and
durations from two log-uniform bands), inter-arrival times exponential with mean `lam`
from `random.Random(seed + 3)`, the first job at 0. Steps are `duration x V100 throughput`
from the same throughput file `bench/gavel_reference.py` gives Gavel's simulator (our
shipped table, single-GPU types scaled linearly), so a job's runtime on a V100 is the
duration Gavel drew. Gavel's code runs in its own interpreter from its checkout and never
enters this repository; only the drawn traces (in the seven-column layout of the shipped
Philly trace) and `family.json` are written, under `alnair/common/data/gavel/family/`.

`reference` runs Gavel's simulator on every trace of the family with its policies (`fifo`,
`max_min_fairness_perf`, `finish_time_fairness_perf`), one trace and policy at a time, and
keeps each result in `bench/reference/gavel_family.json` as soon as it ends (a run already
there is not repeated): hours of machine time in all, never in CI.

Offered load: a trace's work is each job's GPUs x its V100 runtime; the cluster's capacity in
V100s is each type's count x the work-weighted mean speed of the family's jobs on that type
relative to a V100. `lam` is set so that expected work per second / capacity is the target
(0.5 light, 0.69 the shipped Philly trace's own load on 32+32+32 by the same measure, 0.9
heavy); the realized load of each draw is written beside it. Which traces tune the policy
and which evaluate it is fixed here, before any run (`ROLES`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gavel_reference import (
    POLICIES,
    gavel_commit,
    log_figures,
    make_stubs,
    run_policy,
    trace_scales,
    write_inputs,
)

from alnair.common.data import data_dir
from alnair.scheduler.jobsim.workload import Cluster, job_throughput, throughput_table

FAMILY_DIR = ("gavel", "family")
JOBS = 300
CALIBRATION_SEED = 9999
CALIBRATION_JOBS = 20_000
MIXES = {"A": "32:32:32", "B": "16:32:48"}
"""V100:P100:K80. A: the shipped benchmark's cluster; B: an older fleet, fast GPUs scarce."""
LOADS = {"light": 0.5, "philly": 0.69, "heavy": 0.9}
"""`philly`: the shipped Philly trace's own load on 32+32+32 by this measure (0.69)."""
REFERENCE = Path(__file__).parent / "reference" / "gavel_family.json"
TRACES: tuple[tuple[str, int, str, str, str], ...] = (
    # name, seed, mix, load, role
    ("s10-A-philly", 10, "A", "philly", "tune"),
    ("s11-B-heavy", 11, "B", "heavy", "tune"),
    ("s12-A-light", 12, "A", "light", "evaluate"),
    ("s13-A-philly", 13, "A", "philly", "evaluate"),
    ("s14-A-heavy", 14, "A", "heavy", "evaluate"),
    ("s15-B-light", 15, "B", "light", "evaluate"),
    ("s16-B-philly", 16, "B", "philly", "evaluate"),
    ("s17-B-heavy", 17, "B", "heavy", "evaluate"),
)

# Runs inside Gavel's checkout with Gavel's interpreter: prints one JSON list of jobs.
_DRAW = r"""
import json, math, random, sys
sys.path.insert(0, ".")
import utils
seed, count, lam = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
throughputs_file = sys.argv[4]
oracle = utils.read_all_throughputs_json_v2(throughputs_file)
job_rng = random.Random(); job_rng.seed(seed + 2)
arrival_rng = random.Random(); arrival_rng.seed(seed + 3)
out, at = [], 0.0
for _ in range(count):
    job = utils.generate_job(throughputs=oracle, reference_worker_type="v100", rng=job_rng,
                             job_id=None, generate_multi_gpu_jobs=True)
    out.append([job.job_type, job.command, job.num_steps_arg, bool(job.needs_data_dir),
                int(job.total_steps), at, job.scale_factor, job.duration])
    at += -math.log(1.0 - arrival_rng.random()) * lam
print(json.dumps(out))
"""


def family_dir() -> Path:
    return data_dir().joinpath(*FAMILY_DIR)


def gavel_throughputs_file(folder: Path) -> Path:
    """Our throughput table in Gavel's JSON layout, every job type x 1/2/4/8 GPUs present
    (the generator asks for any distributed type at any scale; unmeasured scales linear)."""
    table = throughput_table()
    jobs = sorted({job for job, _, _ in table})
    out: dict[str, dict[str, dict[str, float]]] = {}
    for gpu_type in ("v100", "p100", "k80"):
        for job in jobs:
            for scale in (1, 2, 4, 8):
                value = job_throughput(table, job, scale, gpu_type)
                out.setdefault(gpu_type, {})[str((job, scale))] = {"null": value or 0.0}
    path = folder / "throughputs.json"
    path.write_text(json.dumps(out), encoding="utf-8")
    return path


def gavel_draw(
    gavel: Path, python: str, seed: int, count: int, lam: float, throughputs: Path
) -> list[list[Any]]:
    done = subprocess.run(
        [python, "-c", _DRAW, str(seed), str(count), repr(lam), str(throughputs)],
        cwd=gavel / "scheduler",
        capture_output=True,
        text=True,
        check=True,
    )
    jobs: list[list[Any]] = json.loads(done.stdout)
    return jobs


def work_and_speeds(jobs: list[list[Any]]) -> tuple[float, dict[str, float]]:
    """Mean V100 GPU-seconds per job, and each type's work-weighted speed relative to a V100."""
    table = throughput_table()
    total = 0.0
    relative = dict.fromkeys(("v100", "p100", "k80"), 0.0)
    for job_type, _command, _steps_arg, _needs_data, _steps, _arrival, gpus, drawn in jobs:
        scale, duration = int(gpus), float(drawn)
        work = scale * duration
        total += work
        v100 = job_throughput(table, job_type, scale, "v100") or 0.0
        for gpu_type in relative:
            other = job_throughput(table, job_type, scale, gpu_type) or 0.0
            relative[gpu_type] += work * (other / v100 if v100 else 0.0)
    return total / len(jobs), {t: v / total for t, v in relative.items()}


def capacity(mix: str, speeds: dict[str, float]) -> float:
    cluster = Cluster.parse(mix)
    return sum(count * speeds[t] for t, count in cluster.gpus.items())


def draw(args: argparse.Namespace) -> None:
    out_dir = family_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = gavel_commit(args.gavel)
    with tempfile.TemporaryDirectory() as folder:
        throughputs = gavel_throughputs_file(Path(folder))
        sample = gavel_draw(
            args.gavel, args.python, CALIBRATION_SEED, CALIBRATION_JOBS, 1.0, throughputs
        )
        mean_work, speeds = work_and_speeds(sample)
        entries = []
        for name, seed, mix, load, role in TRACES:
            lam = mean_work / (LOADS[load] * capacity(MIXES[mix], speeds))
            jobs = gavel_draw(args.gavel, args.python, seed, args.jobs, lam, throughputs)
            lines = [
                "\t".join(
                    (
                        job_type,
                        command,
                        steps_arg,
                        "1" if needs_data else "0",
                        str(steps),
                        f"{arrival:.6f}",
                        str(scale),
                    )
                )
                for job_type, command, steps_arg, needs_data, steps, arrival, scale, _ in jobs
            ]
            (out_dir / f"{name}.trace").write_text("\n".join(lines) + "\n", encoding="utf-8")
            span = jobs[-1][5] - jobs[0][5]
            realized = sum(j[6] * j[7] for j in jobs) / span / capacity(MIXES[mix], speeds)
            entries.append(
                {
                    "name": name,
                    "file": f"{name}.trace",
                    "seed": seed,
                    "cluster_v100_p100_k80": MIXES[mix],
                    "load": load,
                    "target_load": LOADS[load],
                    "realized_load": round(realized, 3),
                    "mean_interarrival_s": round(lam, 1),
                    "jobs": len(jobs),
                    "gpus_per_job": {
                        str(s): sum(1 for j in jobs if j[6] == s) for s in (1, 2, 4, 8)
                    },
                    "median_duration_s": round(statistics.median(j[7] for j in jobs), 1),
                    "role": role,
                }
            )
            print(name, entries[-1], file=sys.stderr)
    manifest = {
        "generator": "stanford-futuredata/gavel scheduler/utils.py generate_job "
        "(simulate_scheduler_with_generated_jobs.py -m)",
        "gavel_commit": commit,
        "command": "python bench/gavel_family.py draw --gavel GAVEL --python PYTHON",
        "mean_v100_gpu_s_per_job": round(mean_work, 1),
        "speed_vs_v100": {t: round(v, 4) for t, v in speeds.items()},
        "traces": entries,
    }
    (out_dir / "family.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(manifest))


def load_family() -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((family_dir() / "family.json").read_text("utf-8"))
    return manifest


def reparse(args: argparse.Namespace) -> None:
    """Recompute every kept run's figures from the logs in --log-dir (a figure added later)."""
    if args.log_dir is None:
        raise SystemExit("--reparse needs --log-dir")
    done = json.loads(args.out.read_text("utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        for entry in load_family()["traces"]:
            trace, _ = write_inputs(Path(folder), family_dir() / entry["file"])
            for policy, figures in done["traces"].get(entry["name"], {}).items():
                log = args.log_dir / f"{entry['name']}-{policy}.log"
                if log.is_file():
                    figures.update(log_figures(log.read_text("utf-8"), trace_scales(trace)))
    args.out.write_text(json.dumps(done, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def reference(args: argparse.Namespace) -> None:
    if args.reparse:
        reparse(args)
        return
    family = load_family()
    commit = gavel_commit(args.gavel)
    if commit != family["gavel_commit"]:
        raise SystemExit(f"Gavel at {commit}, the family was drawn at {family['gavel_commit']}")
    make_stubs(args.gavel, args.python)
    out: Path = args.out
    for entry in family["traces"]:
        if args.trace and entry["name"] not in args.trace:
            continue
        for policy in args.policy:
            done = json.loads(out.read_text("utf-8")) if out.is_file() else {"traces": {}}
            if policy in done["traces"].get(entry["name"], {}):
                continue
            with tempfile.TemporaryDirectory() as folder:
                trace, throughputs = write_inputs(Path(folder), family_dir() / entry["file"])
                log_dir = args.log_dir or Path(folder)
                log_dir.mkdir(parents=True, exist_ok=True)
                figures = run_policy(
                    args.gavel,
                    args.python,
                    policy,
                    trace,
                    throughputs,
                    log_dir / f"{entry['name']}-{policy}.log",
                    args.solver,
                    entry["cluster_v100_p100_k80"],
                )
            figures["command"] = figures["command"].replace(folder, "TMP")
            print(entry["name"], policy, figures, file=sys.stderr)
            # Re-read: runs of other traces may be going on beside this one.
            done = json.loads(out.read_text("utf-8")) if out.is_file() else {"traces": {}}
            done |= {"source": "github.com/stanford-futuredata/gavel", "commit": commit}
            done["round_s"] = 360
            done["command"] = "python bench/gavel_family.py reference --gavel GAVEL --python PYTHON"
            done["traces"].setdefault(entry["name"], {})[policy] = figures
            out.write_text(json.dumps(done, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("draw", help="draw the family's traces with Gavel's generator")
    d.add_argument("--gavel", type=Path, required=True, help="Gavel checkout")
    d.add_argument("--python", default=sys.executable, help="interpreter for Gavel")
    d.add_argument("--jobs", type=int, default=JOBS)
    r = sub.add_parser("reference", help="Gavel's simulator on every trace of the family")
    r.add_argument("--gavel", type=Path, required=True, help="Gavel checkout")
    r.add_argument("--python", default=sys.executable, help="interpreter for Gavel")
    r.add_argument("--policy", nargs="+", default=list(POLICIES))
    r.add_argument("--trace", nargs="*", default=[], help="only these traces (names)")
    r.add_argument("--solver", default="ECOS", choices=("ECOS", "SCS", "GUROBI"))
    r.add_argument("--log-dir", type=Path, default=None, help="keep Gavel's output here")
    r.add_argument("--out", type=Path, default=REFERENCE)
    r.add_argument("--reparse", action="store_true", help="only recompute from --log-dir")
    args = parser.parse_args()
    if args.command == "draw":
        draw(args)
    else:
        reference(args)


if __name__ == "__main__":
    main()
