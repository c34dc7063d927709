"""The console's endpoints under load (`make bench-console`; issue 29).

A fresh local control plane (etcd, kube-apiserver with the aggregation layer; no KWOK: the
nodes are Node objects that never become Ready, so nothing is scheduled or admitted and the
figures are the reads alone), `--nodes` GPU nodes in two models, ten ClusterQueues in one
cohort and `--jobs` queued Jobs over five namespaces, all waiting. The scheduler and the
dispatcher run as their own processes (`python -m`), each serving its aggregated API and the
scheduler the console, registered as APIServices as `make up` does.

Then `--clients` concurrent clients, each with its own connection, read what the console
reads, in rounds, each client starting at a different endpoint (so every endpoint is read
while every other is), `--requests` rounds per trial:
- `via: apiserver`: through the API server as a browser behind `kubectl proxy` does (the
  administrator's client certificate; the API server authorizes, the aggregator proxies, the
  service authorizes again);
- `via: direct`: straight to each service with the front proxy's certificate, which isolates
  the service from the API server's proxying.
Trials alternate the two and repeat (`--repeats`); they start once the services have written
what the arrivals made them write and sit idle (`settled`: warm, not the first burst). Each
latency is one request's, from send to the last byte. A first untimed round warms every path
(SubjectAccessReview decisions are cached for 10 s, as in production).

Prints one JSON object: the setup, per trial and endpoint the count, p50, p99 and max in ms,
and per endpoint and path the median p99 over trials and its range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from alnair.common.aggregated import DISPATCHER_GROUP, QUERY_VERSION, SCHEDULER_GROUP
from alnair.common.kube import APISERVICES, JOBS, Resource
from alnair.common.tls import issue, write_folder
from alnair.dev.localstack import ControlPlane, free_port
from alnair.dev.localstack.controlplane import register_api_service
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE

CLUSTERQUEUES = Resource("alnair.io", "v1alpha1", "clusterqueues", namespaced=False)
LOCALQUEUES = Resource("alnair.io", "v1alpha1", "localqueues")
COHORTS = Resource("alnair.io", "v1alpha1", "cohorts", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
QUEUES = 10
TEAMS = 5
SCHED = f"/apis/{SCHEDULER_GROUP}/{QUERY_VERSION}"
DISP = f"/apis/{DISPATCHER_GROUP}/{QUERY_VERSION}"
ENDPOINTS = {
    "console page": f"{SCHED}/console/",
    "console script": f"{SCHED}/console/console.js",
    "gpus (page of 100 nodes)": f"{SCHED}/gpus?limit=100",
    "clusterqueues": f"{DISP}/clusterqueues",
    "queued workloads (page of 100)": f"{DISP}/queuedworkloads?limit=100",
    "one namespace's (page of 100)": f"{DISP}/namespaces/team-0/queuedworkloads?limit=100",
    "pod metrics": f"{SCHED}/podmetrics",
}


def job(name: str, ns: str, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "schedulerName": "alnair",
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "train", "image": "trainer",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }],
                }
            },
        },
    }  # fmt: skip


async def populate(cp: ControlPlane, nodes: int, jobs: int) -> float:
    """Nodes, queues and waiting Jobs; seconds it took."""
    t0 = time.monotonic()
    v100 = nodes * 3 // 5
    spec = f"{v100}x V100M32:8, {nodes - v100}x T4:4" if nodes - v100 else f"{v100}x V100M32:8"
    async with cp.client() as kube:
        await cp.create_gpu_nodes(spec, kube=kube, prefix="bench", wait_ready=False, concurrency=64)
        await kube.create(COHORTS, {"apiVersion": "alnair.io/v1alpha1", "kind": "Cohort",
                                    "metadata": {"name": "all"}})  # fmt: skip
        for q in range(QUEUES):
            await kube.create(CLUSTERQUEUES, {
                "apiVersion": "alnair.io/v1alpha1", "kind": "ClusterQueue",
                "metadata": {"name": f"cq-{q}"},
                "spec": {"cohort": "all", "resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": m, "resources": [{"name": "nvidia.com/gpu",
                                                           "nominalQuota": 64}]}
                                for m in ("V100M32", "T4")],
                }]},
            })  # fmt: skip
        for t in range(TEAMS):
            ns = f"team-{t}"
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": ns}})  # fmt: skip
            for q in range(QUEUES):
                await kube.create(LOCALQUEUES, {
                    "apiVersion": "alnair.io/v1alpha1", "kind": "LocalQueue",
                    "metadata": {"name": f"lq-{q}", "namespace": ns},
                    "spec": {"clusterQueue": f"cq-{q}"},
                }, ns)  # fmt: skip
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            ns, queue = f"team-{i % TEAMS}", f"lq-{(i // TEAMS) % QUEUES}"
            async with sem:
                await kube.create(JOBS, job(f"job-{i:05d}", ns, queue), ns)

        await asyncio.gather(*(one(i) for i in range(jobs)))
    return time.monotonic() - t0


def start_services(
    cp: ControlPlane, work: Path
) -> tuple[list[subprocess.Popen[bytes]], dict[str, Any]]:
    """The scheduler and the dispatcher as processes, each with its serving certificate."""
    procs, where = [], {}
    base = {**os.environ, "ALNAIR_KUBECONFIG": str(cp.kubeconfig), "ALNAIR_LOG_LEVEL": "WARNING"}
    for service, module, env in (
        ("scheduler", "alnair.scheduler", {
            "ALNAIR_SCHEDULER_HTTP_PORT": str(free_port()),
            "ALNAIR_SCHEDULER_NATS_ENABLED": "false",
            "ALNAIR_SCHEDULER_LEADER_ELECT": "false", "ALNAIR_SCHEDULER_HTTP_HOST": "127.0.0.1",
            "ALNAIR_SCHEDULER_QUERY_CERT_DIR": str(work / "scheduler"),
            "ALNAIR_SCHEDULER_QUERY_PORT": "{port}",
        }),
        ("dispatcher", "alnair.scheduler.dispatcher", {
            "ALNAIR_DISPATCHER_HTTP_PORT": str(free_port()),
            "ALNAIR_DISPATCHER_NATS_ENABLED": "false",
            "ALNAIR_DISPATCHER_LEADER_ELECT": "false", "ALNAIR_DISPATCHER_HTTP_HOST": "127.0.0.1",
            "ALNAIR_DISPATCHER_WEBHOOK_CERT_DIR": str(work / "dispatcher"),
            "ALNAIR_DISPATCHER_WEBHOOK_PORT": "{port}",
        }),
    ):  # fmt: skip
        issued = issue([f"alnair-{service}-query.default.svc", "127.0.0.1"])
        write_folder(work / service, issued.secret_data())
        port = free_port()
        filled = {k: v.replace("{port}", str(port)) for k, v in env.items()}
        http_port = next(v for k, v in filled.items() if k.endswith("_HTTP_PORT"))
        log = (work / f"{service}.log").open("wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module], env={**base, **filled}, stdout=log, stderr=log
        ))  # fmt: skip
        where[service] = {"port": port, "ca": issued.ca_pem, "http": int(http_port)}
    return procs, where


async def register(cp: ControlPlane, where: dict[str, Any], timeout_s: float = 300) -> None:
    async with cp.client() as kube:
        for service, group in (("scheduler", SCHEDULER_GROUP), ("dispatcher", DISPATCHER_GROUP)):
            await register_api_service(
                kube, group, QUERY_VERSION, where[service]["port"], where[service]["ca"],
                service=f"alnair-{service}-query",
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        for group in (SCHEDULER_GROUP, DISPATCHER_GROUP):
            while True:
                api = await kube.get(APISERVICES, f"{QUERY_VERSION}.{group}")
                conds = (api.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Available" and c["status"] == "True" for c in conds):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{group} not Available: {conds}")
                await asyncio.sleep(0.5)


def clients(
    cp: ControlPlane, where: dict[str, Any], via: str
) -> tuple[str, ssl.SSLContext, dict[str, str], dict[str, str]]:
    """(base URL per group, TLS context, headers) for a path."""
    assert cp.pki is not None
    if via == "apiserver":
        tls = ssl.create_default_context(cafile=str(cp.pki.ca_cert))
        tls.load_cert_chain(str(cp.pki.admin_cert), str(cp.pki.admin_key))
        return cp.server, tls, {}, {}
    # Direct: as the aggregator calls the services, with the front proxy's certificate.
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE  # two services, two CAs: the bench does not check them
    tls.load_cert_chain(str(cp.pki.front_proxy_cert), str(cp.pki.front_proxy_key))
    headers = {"X-Remote-User": "alnair-admin", "X-Remote-Group": "system:masters"}
    bases = {SCHEDULER_GROUP: f"https://127.0.0.1:{where['scheduler']['port']}",
             DISPATCHER_GROUP: f"https://127.0.0.1:{where['dispatcher']['port']}"}  # fmt: skip
    return "", tls, headers, bases


async def trial(
    cp: ControlPlane, where: dict[str, Any], via: str, n_clients: int, rounds: int
) -> dict[str, Any]:
    server, tls, headers, bases = clients(cp, where, via)
    names = list(ENDPOINTS)

    def url(path: str) -> str:
        if not bases:
            return server + path
        group = SCHEDULER_GROUP if path.startswith(SCHED) else DISPATCHER_GROUP
        return bases[group] + path

    samples: dict[str, list[float]] = {n: [] for n in names}
    failures: dict[str, int] = dict.fromkeys(names, 0)

    async def client(k: int) -> None:
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
        async with httpx.AsyncClient(
            verify=tls, headers=headers, limits=limits, timeout=60
        ) as http:
            order = names[k % len(names) :] + names[: k % len(names)]
            for r in range(rounds + 1):
                for name in order:
                    t0 = time.perf_counter()
                    resp = await http.get(url(ENDPOINTS[name]))
                    await resp.aread()
                    elapsed = (time.perf_counter() - t0) * 1000
                    if resp.status_code != 200:
                        failures[name] += 1
                    elif r > 0:  # round 0 warms every path
                        samples[name].append(elapsed)

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(n_clients)))
    wall = time.monotonic() - t0
    out: dict[str, Any] = {"via": via, "wall_s": round(wall, 1), "endpoints": {}}
    for name, values in samples.items():
        values.sort()
        out["endpoints"][name] = {"count": len(values), "failures": failures[name]} | (
            {
                "p50_ms": round(statistics.median(values), 1),
                "p99_ms": round(values[min(len(values) - 1, int(0.99 * len(values)))], 1),
                "max_ms": round(values[-1], 1),
            }
            if values
            else {"p50_ms": None, "p99_ms": None, "max_ms": None}
        )
    return out


async def waiting_counted(cp: ControlPlane, jobs: int, timeout_s: float = 600) -> float:
    """Until the dispatcher holds every Job (read through the API server); seconds."""
    t0 = time.monotonic()
    async with cp.client() as kube:
        while True:
            try:
                doc = await kube.request("GET", f"{DISP}/queuedworkloads?limit=1")
                if (doc.get("metadata") or {}).get("total", 0) >= jobs:
                    return time.monotonic() - t0
            except Exception:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError("the dispatcher did not take every Job")
            await asyncio.sleep(1)


def cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def settled(pids: list[int], quiet_s: float = 5.0, timeout_s: float = 1200) -> float:
    """Until the services have written what the arrivals make them write (a wait reason, an
    Event and a condition for each of 10,000 Jobs) and sit idle: under 5% of a core over
    `quiet_s`. Warm figures are read then, not during that first burst. Seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        before = sum(cpu_s(p) for p in pids)
        await asyncio.sleep(quiet_s)
        if sum(cpu_s(p) for p in pids) - before < 0.05 * quiet_s:
            return time.monotonic() - t0
    raise TimeoutError("the services kept working")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--requests", type=int, default=10, help="rounds over every endpoint per client")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="shrink nodes and jobs (a smoke run)")
    args = p.parse_args()
    nodes, jobs = max(2, int(args.nodes * args.scale)), max(2, int(args.jobs * args.scale))
    with tempfile.TemporaryDirectory(prefix="alnair-bench-console-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(work / "cp", kwok=False).start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            populated = asyncio.run(populate(cp, nodes, jobs))
            procs, where = start_services(cp, work)
            asyncio.run(register(cp, where))
            taken = asyncio.run(waiting_counted(cp, jobs))
            quiet = asyncio.run(settled([p.pid for p in procs]))
            # Alternating which path goes first, repeated.
            order = [
                via
                for rep in range(args.repeats)
                for via in (("apiserver", "direct") if rep % 2 == 0 else ("direct", "apiserver"))
            ]
            trials = [
                asyncio.run(trial(cp, where, via, args.clients, args.requests)) for via in order
            ]
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            cp.stop()
    summary: dict[str, Any] = {}
    for via in ("apiserver", "direct"):
        mine = [t for t in trials if t["via"] == via]
        summary[via] = {}
        for name in ENDPOINTS:
            p99s = [
                t["endpoints"][name]["p99_ms"]
                for t in mine
                if t["endpoints"][name]["p99_ms"] is not None
            ]
            summary[via][name] = {
                "p99_ms_median": round(statistics.median(p99s), 1) if p99s else None,
                "p99_ms_range": [min(p99s), max(p99s)] if p99s else None,
                "failures": sum(t["endpoints"][name]["failures"] for t in mine),
            }
    report = {
        "bench": "console",
        "setup": {"nodes": nodes, "jobs": jobs, "clients": args.clients, "rounds": args.requests,
                  "repeats": args.repeats, "populate_s": round(populated, 1),
                  "dispatcher_took_all_s": round(taken, 1),
                  "services_settled_s": round(quiet, 1), "kwok": False},
        "summary": summary,
        "trials": trials,
    }  # fmt: skip
    json.dump(report, sys.stdout, indent=2)
    print()
    failed = any(v["failures"] for s in summary.values() for v in s.values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
