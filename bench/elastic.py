"""ElasticJob grow and shrink latency on the local control plane (`make bench-elastic`).

One KWOK node with 8 GPUs, the alnair scheduler and the ElasticJob controller in this process,
an elastic job (min 2, max 8, one GPU per worker, cooldown 0) at its maximum. Each round a
higher-priority pod asks for 4 GPUs (the scheduler preempts 4 surplus workers; the controller
shrinks the job): `shrink` is the time from that request to the 4 GPUs being free (the
victims gone); then the pod is deleted (GPUs freed): `grow` is the time from the deletion to
8 workers bound again. Rounds alternate nothing else; the report gives p50/p99 and the spread.
With `--flap`, instead: GPUs freed and reclaimed every `--period-s` for `--duration-s`, and the
resizes counted per cooldown window.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from alnair.common.kube import ELASTICJOBS, NAMESPACES, PODS
from alnair.dev.builders import make_pod, priority_classes
from alnair.dev.elastic import (
    InProcessScheduler,
    bound,
    elastic_job,
    start_controller,
    workers,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def run(cp: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    ns = "bench-elastic"
    async with cp.client() as kube:
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}})  # fmt: skip
        await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns,
                                  labels={"alnair.io/test-pool": ns})  # fmt: skip
        low, high = await priority_classes(kube, ns)
        sched = InProcessScheduler(kube)
        await sched.start()
        ctl = await start_controller(cp, ns)
        cooldown = args.cooldown_s if args.flap else 0
        job = elastic_job("b", ns, lo=2, hi=8, pool=ns, priority_class=low,
                          scaleCooldownSeconds=cooldown)  # fmt: skip
        await kube.create(ELASTICJOBS, job, ns)

        async def n_bound(n: int) -> bool:
            return len(bound(await workers(kube, ns, "b"))) == n

        async def at_most(n: int) -> bool:
            return len(bound(await workers(kube, ns, "b"))) <= n

        await wait_for(lambda: n_bound(8), 60, 0.005)
        out: dict[str, Any] = {}
        try:
            if args.flap:
                out = await flap(kube, ns, high, ctl, args)
            else:
                grows: list[float] = []
                shrinks: list[float] = []
                for i in range(args.rounds):
                    hog = make_pod(f"hog-{i}", ns).pool(ns).gpus(4).priority_class(high).obj()
                    t0 = time.perf_counter()
                    await kube.create(PODS, hog, ns)
                    await wait_for(lambda: at_most(4), 30, 0.005)
                    shrinks.append(time.perf_counter() - t0)
                    await wait_for(lambda i=i: _bound(kube, ns, f"hog-{i}"), 30, 0.005)
                    t0 = time.perf_counter()
                    await kube.delete(PODS, f"hog-{i}", ns)
                    await wait_for(lambda: n_bound(8), 30, 0.005)
                    grows.append(time.perf_counter() - t0)
                out = {
                    "rounds": args.rounds,
                    "grow_p50_s": round(statistics.median(grows), 3),
                    "grow_p99_s": round(pct(grows, 0.99), 3),
                    "grow_min_s": round(min(grows), 3),
                    "grow_max_s": round(max(grows), 3),
                    "shrink_p50_s": round(statistics.median(shrinks), 3),
                    "shrink_p99_s": round(pct(shrinks, 0.99), 3),
                    "shrink_max_s": round(max(shrinks), 3),
                }
        finally:
            await ctl.stop()
            await sched.stop()
        return out


async def _bound(kube: Any, ns: str, name: str) -> bool:
    return bool((await kube.get(PODS, name, ns))["spec"].get("nodeName"))


async def flap(kube: Any, ns: str, high: str, ctl: Any, args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    i = 0
    while time.monotonic() - t_start < args.duration_s:
        if i % 2 == 0:
            await kube.create(PODS, make_pod(f"hog-{i}", ns).pool(ns).gpus(4)
                              .priority_class(high).obj(), ns)  # fmt: skip
        else:
            await kube.delete(PODS, f"hog-{i - 1}", ns)
        i += 1
        await asyncio.sleep(args.period_s / 2)
    history = list(ctl.controller.st(f"{ns}/b").history)
    t0 = history[0].time.timestamp() if history else 0.0
    windows: dict[int, int] = {}
    grow_windows: dict[int, int] = {}
    for r in history:
        w = int((r.time.timestamp() - t0) // args.cooldown_s)
        windows[w] = windows.get(w, 0) + 1
        if r.replicas > r.previous:
            grow_windows[w] = grow_windows.get(w, 0) + 1
    grows = [r.time.timestamp() for r in history if r.replicas > r.previous]
    gaps = [b - a for a, b in itertools.pairwise(grows)]
    return {
        "duration_s": args.duration_s,
        "churn_period_s": args.period_s,
        "cooldown_s": args.cooldown_s,
        "churn_cycles": i // 2,
        "resizes": len(history),
        "grows": len(grows),
        "shrinks": len(history) - len(grows),
        "min_gap_between_grows_s": round(min(gaps), 2) if gaps else None,
        "max_grows_per_cooldown_window": max(grow_windows.values(), default=0),
        "max_resizes_per_cooldown_window": max(windows.values(), default=0),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--flap", action="store_true", help="the anti-flap run instead")
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--period-s", type=float, default=20.0, help="one free + reclaim cycle")
    p.add_argument("--cooldown-s", type=int, default=60)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="alnair-bench-elastic-") as tmp:
        cp = ControlPlane(Path(tmp)).start()
        try:
            result = asyncio.run(run(cp, args))
        finally:
            cp.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
