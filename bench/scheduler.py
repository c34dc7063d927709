"""Scheduler throughput: Alnair vs the upstream kube-scheduler, same cluster, same run.

On the local control plane (real etcd + kube-apiserver + controller-manager, KWOK kubelets),
create `--nodes` KWOK nodes with 8 GPUs each, then for each scheduler in turn: start it as its
own process, create `--pods` pods asking for `nvidia.com/gpu: 1` as fast as the API server takes
them, and record for every pod the time from our create request to the moment our watch sees it
bound. Then stop that scheduler and delete the pods before the next one.

kube-scheduler is the v1.36.3 binary built by `hack/build-control-plane.sh`, with its default
profile and its client rate limit raised to 5000 QPS (its default of 50 QPS would cap it at
about 50 binds/s; scheduler_perf raises it the same way), so the baseline is its best.
Prints one JSON object: each run's figures and `ratio_pods_per_s` (Alnair / kube-scheduler).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import NAMESPACES, PODS, Conflict, KubeClient, NotFound, Unavailable
from alnair.common.localstack import ControlPlane, ManagedProcess, free_port
from alnair.common.localstack.controlplane import binary


def pod(name: str, ns: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/train:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "256Mi", r.GPU: "1"},
                        "limits": {r.GPU: "1"},
                    },
                }
            ],
        },
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


async def watch_bound(
    kube: KubeClient, ns: str, rv: str, bound: dict[str, float], total: int, done: asyncio.Event
) -> None:
    while not done.is_set():
        async for _t, obj in kube.watch(PODS, ns, resource_version=rv, timeout_s=120):
            rv = obj["metadata"]["resourceVersion"]
            name = obj["metadata"]["name"]
            if obj["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) >= total:
                    done.set()
                    return


async def run_phase(
    kube: KubeClient,
    label: str,
    scheduler_name: str,
    proc: ManagedProcess,
    pods: int,
    concurrency: int,
    timeout_s: float,
) -> dict[str, Any]:
    ns = f"bench-{label}"
    await kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    listing = await kube.list(PODS, ns)
    bound: dict[str, float] = {}
    sent: dict[str, float] = {}
    done = asyncio.Event()
    watcher = asyncio.create_task(
        watch_bound(kube, ns, listing["metadata"]["resourceVersion"], bound, pods, done)
    )
    proc.start()
    await asyncio.sleep(3.0)  # let the scheduler list nodes and start its watches
    if not proc.alive():
        raise RuntimeError(f"{label} scheduler exited: {proc.tail()}")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(pods):
        queue.put_nowait(i)

    async def creator() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            name = f"p-{i:05d}"
            sent[name] = time.monotonic()
            for attempt in range(5):
                try:
                    await kube.create(PODS, pod(name, ns, scheduler_name), ns)
                    break
                except Conflict:
                    break  # a retried create that had landed
                except Unavailable:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.5 * (attempt + 1))

    t0 = time.monotonic()
    await asyncio.gather(*(creator() for _ in range(concurrency)))
    t_created = time.monotonic()
    deadline = time.monotonic() + timeout_s
    while not done.is_set() and time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{label} scheduler exited: {proc.tail()}")
        try:
            await asyncio.wait_for(done.wait(), 1.0)
        except TimeoutError:
            continue
    watcher.cancel()
    proc.stop()
    latencies = [bound[n] - sent[n] for n in bound if n in sent]
    last = max(bound.values()) if bound else t0
    duration = max(last - t0, 1e-9)
    result = {
        "scheduler": label,
        "pods": pods,
        "bound": len(bound),
        "duration_s": round(duration, 3),
        "pods_per_s": round(len(bound) / duration, 1),
        "create_rate_per_s": round(pods / max(t_created - t0, 1e-9), 1),
        "p50_create_to_bound_s": round(pct(latencies, 50), 4),
        "p99_create_to_bound_s": round(pct(latencies, 99), 4),
        "mean_create_to_bound_s": round(statistics.fmean(latencies), 4) if latencies else None,
    }
    print(json.dumps(result), file=sys.stderr)
    # Free the GPUs for the next run: delete every pod and wait until they are gone. A
    # collection delete of thousands of pods outlasts the client timeout, and the API server
    # stops when the client goes, so it is repeated until nothing is left.
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        with contextlib.suppress(Unavailable):
            page = await kube.request("GET", PODS.path(ns), params={"limit": 1})
            if not page.get("items"):
                break
            await kube.request("DELETE", PODS.path(ns), params={"gracePeriodSeconds": 0})
    with contextlib.suppress(NotFound):
        await kube.delete(NAMESPACES, ns)
    return result


async def main_async(args: argparse.Namespace, cp: ControlPlane, work: Path) -> dict[str, Any]:
    if True:
        async with cp.client(max_connections=args.concurrency + 32) as kube:
            t = time.monotonic()
            await cp.create_gpu_nodes(f"{args.nodes}x V100M32:8", kube=kube, prefix="bench")
            nodes_s = time.monotonic() - t
            logs = work / "logs"
            alnair_env = {
                "ALNAIR_KUBECONFIG": str(cp.kubeconfig),
                "ALNAIR_SCHEDULER_LEADER_ELECT": "false",
                "ALNAIR_SCHEDULER_NATS_ENABLED": "false",
                "ALNAIR_SCHEDULER_HTTP_PORT": str(free_port()),
                "ALNAIR_SCHEDULER_HTTP_HOST": "127.0.0.1",
                "ALNAIR_SCHEDULER_POLICY": args.policy,
                "ALNAIR_LOG_LEVEL": "warning",
            }
            alnair = ManagedProcess(
                "alnair-scheduler", [sys.executable, "-m", "alnair.scheduler"], logs, env=alnair_env
            )
            config = work / "kube-scheduler.yaml"
            config.write_text(
                "apiVersion: kubescheduler.config.k8s.io/v1\n"
                "kind: KubeSchedulerConfiguration\n"
                f"clientConnection:\n  kubeconfig: {cp.kubeconfig}\n"
                f"  qps: {args.kube_qps}\n  burst: {args.kube_qps * 2}\n"
                "leaderElection:\n  leaderElect: false\n"
            )
            upstream = ManagedProcess(
                "kube-scheduler",
                [
                    str(binary("kube-scheduler")),
                    "--config",
                    str(config),
                    "--secure-port",
                    "0",
                    "--v",
                    "1",
                ],
                logs,
            )
            runs = []
            runs.append(
                await run_phase(
                    kube, "alnair", "alnair", alnair, args.pods, args.concurrency, args.timeout_s
                )
            )
            runs.append(
                await run_phase(
                    kube, "kube-scheduler", "default-scheduler", upstream, args.pods,
                    args.concurrency, args.timeout_s,
                )
            )  # fmt: skip
    a, k = runs[0], runs[1]
    return {
        "benchmark": "scheduler-throughput",
        "nodes": args.nodes,
        "gpus_per_node": 8,
        "pods": args.pods,
        "policy": args.policy,
        "kube_scheduler_qps": args.kube_qps,
        "node_setup_s": round(nodes_s, 1),
        "cpus": os.cpu_count(),
        "alnair": a,
        "kube_scheduler": k,
        "ratio_pods_per_s": round(a["pods_per_s"] / k["pods_per_s"], 3)
        if k["pods_per_s"]
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--policy", default="alnair")
    parser.add_argument("--concurrency", type=int, default=64, help="parallel pod creators")
    parser.add_argument("--kube-qps", type=int, default=5000, help="kube-scheduler client QPS")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="alnair-bench-"))
    cp = ControlPlane(work).start()
    try:
        result = asyncio.run(main_async(args, cp, work))
    finally:
        cp.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
