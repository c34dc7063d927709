"""Alnair's dispatcher beside Kueue on Kueue's own scheduler performance test
(`make bench-dispatcher`; issue 28, part 2).

Kueue's runner, `minimalkueue` and checker are built from `sigs.k8s.io/kueue` at the version
hack/build-peers.sh caches (never committed). Each trial starts a fresh local control plane
(etcd and kube-apiserver, no nodes: the runner's Workloads have no pods), installs Kueue's
CRDs, starts one controller and runs Kueue's runner against it, unchanged, in its in-cluster
mode (`--qps=1000 --burst=2000`, as Kueue's `run-performance-scheduler-in-cluster`):
- `kueue`: Kueue's `minimalkueue` (its core controllers and scheduler);
- `alnair`: the dispatcher (`python -m alnair.scheduler.dispatcher`, `queue_api: kueue`,
  policy `alnair`), reading the runner's ClusterQueues, LocalQueues and Workloads as they are
  and writing their status as Kueue does (`kueue_workload.py`).

The runner creates the generator config's cohorts, queues and Workloads, finishes each
admitted Workload after its runtime, evicts nothing itself, and stops when every ClusterQueue
is empty (its recorder reads the ClusterQueues' status). The controller is stopped then; its
wall, user and system time and peak RSS are its process's (`wait4`), written as the runner
writes minimalkueue's, and Kueue's checker judges both against the config's `rangespec.yaml`.
Trials alternate the order (kueue first, then alnair first) and repeat; the report gives each
figure's median and range.

Prints one JSON object: per system, per trial and in summary, wall time, admissions per
second, ClusterQueue usage per class, time to admission per workload class (average, p50,
p99), evictions, controller CPU seconds and peak RSS, and the checker's verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import apply_crds, cache_dir

KUEUE_VERSION = os.environ.get("ALNAIR_KUEUE_VERSION", "v0.19.2")
SYSTEMS = ("kueue", "alnair")
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
Obj = dict[str, Any]


def kueue_folder() -> Path:
    return cache_dir() / "peers" / f"kueue-{KUEUE_VERSION}"


def perf_folder() -> Path:
    folder = kueue_folder() / "perf"
    if not (folder / "runner").exists():
        raise SystemExit(f"{folder}/runner is missing: run hack/build-peers.sh")
    return folder


def controller_argv(system: str, kubeconfig: Path) -> tuple[list[str], dict[str, str]]:
    if system == "kueue":
        return [str(perf_folder() / "minimalkueue"), "--kubeconfig", str(kubeconfig)], {}
    env = {
        "ALNAIR_DISPATCHER_KUBECONFIG": str(kubeconfig),
        "ALNAIR_DISPATCHER_QUEUE_API": "kueue",
        "ALNAIR_DISPATCHER_NATS_ENABLED": "false",
        "ALNAIR_DISPATCHER_LEADER_ELECT": "false",
        "ALNAIR_DISPATCHER_HTTP_HOST": "127.0.0.1",
        "ALNAIR_DISPATCHER_HTTP_PORT": "0",
        "ALNAIR_LOG_LEVEL": "WARNING",
    }
    profile = os.environ.get("ALNAIR_BENCH_PROFILE")  # a cProfile of the dispatcher, to read
    prefix = ["-m", "cProfile", "-o", profile] if profile else []
    return [sys.executable, *prefix, "-m", "alnair.scheduler.dispatcher"], env


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> tuple[int, Any, bool]:
    """SIGINT (as the runner stops minimalkueue), then SIGKILL; (status, rusage, whether it had
    already exited) of the child. The signals go by pid: Popen.send_signal polls first and
    would reap a child that died early, losing its rusage (the pid stays ours until wait4)."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid:
        proc.returncode = status
        return status, usage, True
    os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = status
            return status, usage, False
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = status
    return status, usage, False


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else 0.0


def read_results(out: Path) -> dict[str, Any]:
    """The runner's summary and per-workload states as figures."""
    summary = yaml.safe_load((out / "summary.yaml").read_text())
    rows = list(csv.DictReader((out / "wlStates.csv").read_text().splitlines()))
    classes: dict[str, Any] = {}
    for name in sorted({r["class name"] for r in rows}):
        mine = [r for r in rows if r["class name"] == name]
        admit = [float(r["ms to admitted"]) / 1000 for r in mine]
        classes[name] = {
            "count": len(mine),
            "avg_time_to_admission_s": round(statistics.fmean(admit), 3),
            "p50_time_to_admission_s": round(pct(admit, 0.5), 3),
            "p99_time_to_admission_s": round(pct(admit, 0.99), 3),
            "evictions": sum(int(r["num evictions"]) for r in mine),
            "runner_avg_time_to_admission_ms": summary["workloadClasses"][name][
                "averageTimeToAdmissionMs"
            ],
        }
    usage = {}
    for name, group in (summary.get("clusterQueueClasses") or {}).items():
        first = group["firstEventTime"]
        last = group["lastEventTime"]
        elapsed_ms = (_ts(last) - _ts(first)) * 1000
        usage[name] = round(
            100.0 * group["cpuUsed"] / (group["nominalQuota"] * elapsed_ms), 2
        ) if elapsed_ms > 0 and group["nominalQuota"] else None  # fmt: skip
    return {"workload_classes": classes, "cluster_queue_usage_pct": usage,
            "dropped_workload_events": summary.get("droppedWorkloadEvents", 0)}  # fmt: skip


def _ts(value: Any) -> float:
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value.timestamp())


def checker(out: Path, stats: Path, rangespec: Path) -> dict[str, Any]:
    """Kueue's checker (its Go test) on a trial's summary and controller stats."""
    proc = subprocess.run(
        [str(perf_folder() / "checker.test"), "-test.run", "TestScalability", "-test.v",
         f"-summary={out / 'summary.yaml'}", f"-cmdStats={stats}", f"-range={rangespec}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    failures = [line.strip() for line in proc.stdout.splitlines() if ".go:" in line]
    return {"passed": proc.returncode == 0, "failures": failures}


async def api_writes(cp: ControlPlane) -> dict[str, int]:
    """The API server's mutating requests over the trial, by verb and resource (its
    `apiserver_request_total`): the runner's are the same for both systems, the rest are the
    controller's, so the difference is what one admission costs the API server and etcd."""
    counts: Counter[str] = Counter()
    async with cp.client() as kube, kube.session.get("/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":  # (the parser drops the counter's _total)
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels.get("verb") in WRITE_VERBS:
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                counts[f"{labels['verb']} {labels.get('resource', '')}{sub}"] += int(sample.value)
    return dict(sorted(counts.items()))


def trial(system: str, config: Path, rangespec: Path, timeout_s: int, keep: Path | None) -> Obj:
    work = Path(tempfile.mkdtemp(prefix=f"alnair-bench-dispatcher-{system}-"))
    out = work / "out"
    out.mkdir()
    cp = ControlPlane(work / "k8s", kwok=False)
    cp.start()
    try:

        async def install() -> None:
            async with cp.client() as kube:
                await apply_crds(kube, kueue_folder() / "crds")

        asyncio.run(install())
        argv, env = controller_argv(system, cp.kubeconfig)
        log = (out / f"{system}.log").open("wb")
        started = time.monotonic()
        ctl = subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        runner = subprocess.run(
            [str(perf_folder() / "runner"), "-o", str(out), f"--generatorConfig={config}",
             "--qps=1000", "--burst=2000", f"--timeout={timeout_s}s", "--zap-log-level=error"],
            env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)},
            capture_output=True, text=True, timeout=timeout_s + 300, check=False,
        )  # fmt: skip
        runner_wall = time.monotonic() - started
        status, usage, died_early = stop(ctl)
        writes = asyncio.run(api_writes(cp))
        wall = time.monotonic() - started
        log.close()
        stats = {
            "wallMs": int(wall * 1000),
            "userMs": int(usage.ru_utime * 1000),
            "sysMs": int(usage.ru_stime * 1000),
            "maxrss": int(usage.ru_maxrss),
        }
        stats_file = out / f"{system}.stats.yaml"
        stats_file.write_text(yaml.safe_dump(stats))
        result: Obj = {"system": system, "runner_rc": runner.returncode,
                       "controller_exit": status, "wall_s": round(wall, 2),
                       "runner_wall_s": round(runner_wall, 2),
                       "controller_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                       "controller_peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}  # fmt: skip
        if died_early:
            tail = (out / f"{system}.log").read_text(errors="replace")[-3000:]
            result["error"] = f"{system} exited (status {status}) before the runner ended:\n{tail}"
            return result
        if runner.returncode != 0 or not (out / "summary.yaml").exists():
            result["error"] = (runner.stderr or runner.stdout)[-2000:]
            return result
        result.update(read_results(out))
        admitted = sum(c["count"] for c in result["workload_classes"].values())
        result["admissions_per_s"] = round(admitted / runner_wall, 2)
        result["api_writes"] = writes
        result["api_writes_per_workload"] = round(sum(writes.values()) / max(1, admitted), 2)
        result["checker"] = checker(out, stats_file, rangespec)
        return result
    finally:
        cp.stop()
        if keep is not None:
            dest = keep / f"{system}-{int(time.time())}"
            shutil.copytree(out, dest, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def summarize(trials: list[Obj]) -> Obj:
    def spread(values: list[float]) -> Obj:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)} if values else {}  # fmt: skip

    ok = [t for t in trials if "error" not in t]
    out: Obj = {
        "trials": len(trials),
        "failed_trials": len(trials) - len(ok),
        "wall_s": spread([t["wall_s"] for t in ok]),
        "admissions_per_s": spread([t["admissions_per_s"] for t in ok]),
        "controller_cpu_s": spread([t["controller_cpu_s"] for t in ok]),
        "controller_peak_rss_mib": spread([t["controller_peak_rss_mib"] for t in ok]),
        "api_writes_per_workload": spread([t["api_writes_per_workload"] for t in ok]),
        "checker_passed": [t["checker"]["passed"] for t in ok],
    }
    classes = sorted({c for t in ok for c in t["workload_classes"]})
    out["avg_time_to_admission_s"] = {
        c: spread([t["workload_classes"][c]["avg_time_to_admission_s"] for t in ok])
        for c in classes
    }
    out["p99_time_to_admission_s"] = {
        c: spread([t["workload_classes"][c]["p99_time_to_admission_s"] for t in ok])
        for c in classes
    }
    queues = sorted({q for t in ok for q in t["cluster_queue_usage_pct"]})
    out["cluster_queue_usage_pct"] = {
        q: spread([t["cluster_queue_usage_pct"][q] for t in ok
                   if t["cluster_queue_usage_pct"][q] is not None]) for q in queues
    }  # fmt: skip
    return out


def scaled(config: Path, fraction: float, work: Path) -> Path:
    """The generator config with every workload set's count scaled (a smoke run)."""
    doc = yaml.safe_load(config.read_text())
    for cohort in doc["cohorts"]:
        for qs in cohort["queuesSets"]:
            for ws in qs["workloadsSets"]:
                ws["count"] = max(1, round(ws["count"] * fraction))
    path = work / "generator.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="baseline",
                   help="a folder of Kueue's configs/ or a generator.yaml")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2, help="repetitions of each system")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each workload count")
    p.add_argument("--timeout-s", type=int, default=900, help="the runner's recording limit")
    p.add_argument("--keep", type=Path, help="copy each trial's runner output here")
    args = p.parse_args()
    named = perf_folder() / "configs" / args.config
    config = named / "generator.yaml" if named.is_dir() else Path(args.config)
    rangespec = (named if named.is_dir() else config.parent) / "rangespec.yaml"
    tmp = Path(tempfile.mkdtemp(prefix="alnair-bench-dispatcher-"))
    if args.scale != 1.0:
        config = scaled(config, args.scale, tmp)
    systems = [s for s in args.systems.split(",") if s]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    trials: dict[str, list[Obj]] = {s: [] for s in systems}
    for rep in range(args.repeats):
        order = systems if rep % 2 == 0 else list(reversed(systems))
        for system in order:
            result = trial(system, config, rangespec, args.timeout_s, args.keep)
            result["repetition"] = rep
            trials[system].append(result)
            print(json.dumps({"trial": result}), file=sys.stderr, flush=True)
    report = {
        "benchmark": "kueue-scheduler-performance",
        "kueue_version": KUEUE_VERSION,
        "config": str(config if args.scale != 1.0 else named),
        "scale": args.scale,
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count()},
        "rangespec": yaml.safe_load(rangespec.read_text()),
        "summary": {s: summarize(t) for s, t in trials.items()},
        "trials": trials,
    }
    print(json.dumps(report, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
