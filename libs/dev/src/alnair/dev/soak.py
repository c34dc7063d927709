"""A soak of the whole local system, shared by `make soak` (bench/soak.py) and its short form in
the tests (tests/e2e/test_soak.py).

The stack is `make up`'s (`alnair.dev.devstack`, as the chaos run starts it): nats-server,
redis-server, the control plane with many KWOK GPU nodes, and the scheduler, the profiler
(sim agent and aggregator), the predictor and the dispatcher as processes. Jobs
(`alnair.dev.chaos.job_body`, deleted a little after they finish so the cluster itself stays the
same size) arrive at a steady rate for `minutes`. Every `sample_interval_s` the soak reads
- each service's resident memory (VmRSS from /proc/<pid>/status), and nats-server's and
  redis-server's (what services store there, such as handled-event ids, counts too),
- the scheduler's pending queue (`GET /v1/queue`: active + backoff + unschedulable),
- pods of the soak not yet bound (from the API server),
- JetStream consumers' pending counts (unprocessed + unacknowledged, per consumer, summed),
and reports, per service and per queue, the first and last reading, the maximum and the
least-squares slope per hour. It fails when a service (not the infrastructure, which is
only reported) grew beyond `rss_growth_bound_mib` plus
`rss_growth_bound_frac` of where it started, a queue ended more than `queue_growth_bound`
above where it started while its slope was positive, or a service died.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

from alnair.common.kube import JOBS, NAMESPACES, PODS, KubeClient
from alnair.common.natsauth import ADMIN_USER
from alnair.dev import devstack
from alnair.dev.chaos import job_body, job_complete

NAMESPACE = "soak"
INFRA = ("nats-server", "redis-server")
"""Infrastructure whose memory is sampled too (what the services keep there counts)."""


@dataclass
class SoakConfig:
    minutes: float = 30.0
    nodes: str = "1000x V100M32:4"
    arrival_interval_s: float = 1.0
    run_s: tuple[float, float] = (20.0, 60.0)
    sample_interval_s: float = 60.0
    services: tuple[str, ...] = (
        "profiler-agent",
        "aggregator",
        "predictor",
        "scheduler",
        "dispatcher",
    )
    rss_growth_bound_mib: float = 64.0
    rss_growth_bound_frac: float = 0.25
    queue_growth_bound: int = 50
    ttl_after_finished_s: int = 30
    seed: int = 16


@dataclass
class Series:
    """(seconds since the first sample, value) readings of one quantity."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t: float, value: float) -> None:
        self.points.append((t, value))

    def slope_per_h(self) -> float:
        n = len(self.points)
        if n < 2:
            return 0.0
        mt = sum(t for t, _ in self.points) / n
        mv = sum(v for _, v in self.points) / n
        var = sum((t - mt) ** 2 for t, _ in self.points)
        if var == 0:
            return 0.0
        cov = sum((t - mt) * (v - mv) for t, v in self.points)
        return cov / var * 3600.0

    def summary(self, digits: int = 1) -> dict[str, float]:
        values = [v for _, v in self.points]
        return {
            "start": round(values[0], digits),
            "end": round(values[-1], digits),
            "max": round(max(values), digits),
            "slope_per_h": round(self.slope_per_h(), digits),
        }


def rss_mib(pid: int) -> float | None:
    """Resident memory of `pid` in MiB (None when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, directory: Path, cfg: SoakConfig) -> None:
        self.dir = directory
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.opts = devstack.UpOptions(
            nodes=cfg.nodes, free_ports=True, only=cfg.services, ready_timeout_s=300.0
        )
        self.rss: dict[str, Series] = {}
        self.queues: dict[str, Series] = {}
        self.submitted = 0
        self.completed: set[str] = set()
        self.died: set[str] = set()
        self.samples = 0

    def state(self) -> devstack.State:
        state = devstack.State.load(self.dir)
        assert state is not None, "the stack is not up"
        return state

    # --- load -----------------------------------------------------------------------------

    async def submit(self, kube: KubeClient, until: float) -> None:
        i = 0
        while time.monotonic() < until:
            name = f"soak-{i:05d}"
            gpus = self.rng.choice((1, 1, 2))
            run_s = self.rng.uniform(*self.cfg.run_s)
            body = job_body(name, gpus, run_s, self.cfg.ttl_after_finished_s)
            with contextlib.suppress(Exception):
                await kube.create(JOBS, body, NAMESPACE)
                self.submitted += 1
            i += 1
            await asyncio.sleep(self.cfg.arrival_interval_s)

    async def watch_completions(self, kube: KubeClient) -> None:
        """Jobs seen complete (they are deleted soon after, so a listing would miss them)."""
        while True:
            with contextlib.suppress(Exception):
                listed = await kube.list(JOBS, NAMESPACE)
                self.completed |= {
                    j["metadata"]["name"] for j in listed["items"] if job_complete(j)
                }
                version = listed["metadata"]["resourceVersion"]
                async for _kind, job in kube.watch(JOBS, NAMESPACE, resource_version=version):
                    if job_complete(job):
                        self.completed.add(job["metadata"]["name"])
            await asyncio.sleep(1.0)

    # --- readings ---------------------------------------------------------------------------

    async def sample(self, kube: KubeClient, http: httpx.AsyncClient, t: float) -> None:
        state = self.state()
        for name in self.cfg.services:
            proc = state.services.get(name)
            value = rss_mib(proc.pid) if proc is not None and proc.alive() else None
            if value is None:
                self.died.add(name)
                continue
            self.rss.setdefault(name, Series()).add(t, value)
        for proc in state.infra:
            if proc.name in INFRA:
                value = rss_mib(proc.pid) if proc.alive() else None
                if value is None:
                    self.died.add(proc.name)
                else:
                    self.rss.setdefault(proc.name, Series()).add(t, value)
        sched = state.services.get("scheduler")
        if sched is not None and sched.port:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                depth = (await http.get(f"http://127.0.0.1:{sched.port}/v1/queue")).json()["depth"]
                pending = sum(depth.get(k, 0) for k in ("active", "backoff", "unschedulable"))
                self.queues.setdefault("scheduler_pending", Series()).add(t, pending)
        pods = (await kube.list(PODS, NAMESPACE))["items"]
        unbound = sum(
            1
            for p in pods
            if not p["spec"].get("nodeName")
            and (p.get("status") or {}).get("phase") not in {"Succeeded", "Failed"}
        )
        self.queues.setdefault("pods_unbound", Series()).add(t, unbound)
        self.queues.setdefault("nats_consumer_pending", Series()).add(
            t, await self.nats_pending(state)
        )
        self.samples += 1

    async def nats_pending(self, state: devstack.State) -> int:
        password = (state.credentials.get("nats") or {}).get(ADMIN_USER)
        creds: dict[str, Any] = {"user": ADMIN_USER, "password": password} if password else {}
        nc = await nats.connect(state.nats_url, name="soak-reader", **creds)
        try:
            js = nc.jetstream()
            total = 0
            for stream in await js.streams_info():
                if stream.config.name is None:
                    continue
                for consumer in await js.consumers_info(stream.config.name):
                    total += int(consumer.num_pending or 0) + int(consumer.num_ack_pending or 0)
            return total
        finally:
            await nc.close()

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        state = self.state()
        async with (
            KubeClient.from_config(state.kubeconfig) as kube,
            httpx.AsyncClient(timeout=10.0) as http,
        ):
            with contextlib.suppress(Exception):
                await kube.create(
                    NAMESPACES,
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                )
            t0 = time.monotonic()
            until = t0 + self.cfg.minutes * 60.0
            load = asyncio.create_task(self.submit(kube, until))
            watch = asyncio.create_task(self.watch_completions(kube))
            try:
                while True:
                    await self.sample(kube, http, time.monotonic() - t0)
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    await asyncio.sleep(min(self.cfg.sample_interval_s, left))
            finally:
                for task in (load, watch):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        return self.report(time.monotonic() - t0)

    def report(self, elapsed_s: float) -> dict[str, Any]:
        cfg = self.cfg
        failures: list[str] = [f"{name} died" for name in sorted(self.died)]
        rss = {name: s.summary() for name, s in sorted(self.rss.items())}
        for name, s in rss.items():
            if name not in cfg.services:
                # Infrastructure is reported, not judged: redis-server climbs to a plateau as
                # the predictor's model store fills its 10 kept versions (~7 MiB each).
                continue
            bound = cfg.rss_growth_bound_mib + cfg.rss_growth_bound_frac * s["start"]
            if s["end"] - s["start"] > bound:
                failures.append(
                    f"{name} RSS grew {s['end'] - s['start']:.1f} MiB (bound {bound:.1f} MiB)"
                )
        queues = {name: s.summary(0) for name, s in sorted(self.queues.items())}
        for name, q in queues.items():
            if q["end"] - q["start"] > cfg.queue_growth_bound and q["slope_per_h"] > 0:
                failures.append(f"{name} grew from {q['start']:.0f} to {q['end']:.0f}")
        return {
            "minutes": cfg.minutes,
            "elapsed_s": round(elapsed_s, 1),
            "nodes": len(self.state().nodes),
            "services": list(cfg.services),
            "jobs_submitted": self.submitted,
            "jobs_completed_seen": len(self.completed),
            "samples": self.samples,
            "rss_mib": rss,
            "queues": queues,
            "bounds": {
                "rss_growth_mib": f"{cfg.rss_growth_bound_mib:g} + {cfg.rss_growth_bound_frac:g}"
                " x start",
                "queue_growth": cfg.queue_growth_bound,
            },
            "failures": failures,
            "ok": not failures,
        }


def run_soak(directory: Path, cfg: SoakConfig) -> dict[str, Any]:
    """Bring the stack up in `directory`, soak it, take it down; the report."""
    soak = Soak(directory, cfg)
    try:
        devstack.up(directory, soak.opts)
        return asyncio.run(soak.run())
    finally:
        devstack.down(directory)
