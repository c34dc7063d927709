"""Jobs that share GPUs, over time: where co-location interference shows as job completion time.

The placement replay (`engine.py`) asks where pods fit; it has no time, so it cannot see that
two jobs on one GPU slow each other. This replay has both. Jobs arrive (whole GPUs or
fractions of one), wait in arrival order, and are placed by a scheduling profile, the live
binder's plugins included (`Interference` when the profile is given a co-location table).
While they run, each job advances at its measured speed alone on its GPU type times what it
keeps beside the jobs sharing its GPU, from a ground truth (`Physics`, Gavel's measured pairs
in the benchmark), never from the predictor that steers the policy. Several sharers combine
as `alnair.common.colocation` says (excess slowdowns add up). Whenever a job ends, every
waiting job is tried again, in order.

Reported per run: average and p99 job completion time, makespan, GPU allocation (share of GPU
capacity requested by running jobs) and throughput-weighted GPU utilization (per GPU, the sum
over its jobs of their speed over their speed alone there; two jobs each keeping 80% make 1.6
GPUs' worth of work), both time-averaged over the arrival window, GPU allocation while some
job waits (what a policy leaves idle when there is demand: the time-based reading of the
placement replay's allocation at arrived demand; the plain average also falls when jobs
simply finish sooner), and how many co-locations the ground truth slows past the cap.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.requests import NodeSpec, Placement, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.runtime import Framework
from alnair.scheduler.plugins.registry import ProfileOptions, build_profile


@dataclass(frozen=True, slots=True)
class SharedJob:
    """One job of the replay: `gpu_milli` of one GPU (1000: a whole one), `steps` of work."""

    id: str
    workload: str
    arrival_s: float
    gpu_milli: int
    steps: float


@dataclass(frozen=True)
class Physics:
    """The ground truth: steps/s alone per (workload, GPU type), and the fraction of it a
    workload keeps beside a partner on a GPU type (pairs never measured: `default_kept`)."""

    alone: Mapping[tuple[str, str], float]
    kept: Mapping[tuple[str, str, str], float]
    default_kept: float = 0.5

    def slowdown(self, workload: str, partners: Sequence[str], gpu: str) -> float:
        total = 1.0
        for partner in partners:
            kept = self.kept.get((workload, partner, gpu), self.default_kept)
            total += max(0.0, 1.0 / max(kept, 1e-3) - 1.0)
        return total

    def speed(self, workload: str, partners: Sequence[str], gpu: str) -> float:
        return self.alone[(workload, gpu)] / self.slowdown(workload, partners, gpu)


@dataclass
class SharingResult:
    policy: str
    seed: int
    jobs: int
    finished: int
    avg_jct_s: float
    p99_jct_s: float
    makespan_s: float
    gpu_alloc_pct: float
    alloc_while_waiting_pct: float
    throughput_util_pct: float
    colocations: int
    slowed_past_cap: int
    wall_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "jobs": self.jobs,
            "finished": self.finished,
            "avg_jct_s": round(self.avg_jct_s, 1),
            "p99_jct_s": round(self.p99_jct_s, 1),
            "makespan_s": round(self.makespan_s, 1),
            "gpu_alloc_pct": round(self.gpu_alloc_pct, 2),
            "alloc_while_waiting_pct": round(self.alloc_while_waiting_pct, 2),
            "throughput_util_pct": round(self.throughput_util_pct, 2),
            "colocations": self.colocations,
            "slowed_past_cap_pct": round(
                100.0 * self.slowed_past_cap / self.colocations if self.colocations else 0.0, 2
            ),
            "wall_s": round(self.wall_s, 2),
        }


@dataclass
class _Running:
    job: SharedJob
    pod: PodRequest
    node: int
    gpu: int
    gpu_type: str
    left: float
    speed: float = 0.0


@dataclass
class _Clock:
    """Time integrals: allocated milli-GPU and throughput-weighted GPUs."""

    alloc: float = 0.0
    useful: float = 0.0
    span: float = 0.0
    busy_alloc: float = 0.0
    busy_span: float = 0.0
    """The same while some job waits: what a policy leaves unallocated when there is demand."""
    """Integrated over the arrival window only (first to last arrival): while jobs keep
    coming, the cluster is offered its load; the drain after it says nothing of a policy's
    packing (an idle tail would dilute every average)."""
    per_gpu: dict[tuple[int, int], list[_Running]] = field(default_factory=dict)


def pod_of(job: SharedJob) -> PodRequest:
    return PodRequest(
        name=job.id, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=job.gpu_milli,
        uid=job.id, workload=job.workload,
    )  # fmt: skip


def simulate_sharing(
    policy: str,
    nodes: Sequence[NodeSpec],
    jobs: Sequence[SharedJob],
    physics: Physics,
    seed: int,
    *,
    options: ProfileOptions | None = None,
    label: str | None = None,
    cap: float = 2.5,
) -> SharingResult:
    """Replay `jobs` on `nodes` under `policy` (with `options`: the interference plugin and its
    table); `label` names the run in the result."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    snap = ClusterSnapshot.build(nodes)
    pods = {j.id: pod_of(j) for j in jobs}
    fw = Framework(build_profile(policy, list(pods.values()), options), tie_break="first")
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.id))
    pending: list[SharedJob] = []
    running: dict[str, _Running] = {}
    clock = _Clock()
    jct: list[float] = []
    colocations = slowed = 0
    now = 0.0
    i = 0
    capacity = float(snap.gpu_capacity_milli)
    last_arrival = arrivals[-1].arrival_s if arrivals else 0.0

    def restep(gpus: set[tuple[int, int]]) -> None:
        for key in gpus:
            members = clock.per_gpu.get(key, [])
            for run in members:
                partners = [o.job.workload for o in members if o is not run]
                run.speed = physics.speed(run.job.workload, partners, run.gpu_type)

    while i < len(arrivals) or running:
        next_arrival = arrivals[i].arrival_s if i < len(arrivals) else math.inf
        next_end = min((now + r.left / r.speed for r in running.values()), default=math.inf)
        until = min(next_arrival, next_end)
        if math.isinf(until):
            break  # waiting jobs nothing can ever place
        dt = min(until, last_arrival) - now
        if dt > 0:
            allocated = sum(r.job.gpu_milli for r in running.values())
            useful = sum(
                r.speed / physics.alone[(r.job.workload, r.gpu_type)] for r in running.values()
            )
            clock.alloc += allocated * dt
            clock.useful += useful * dt
            clock.span += dt
        if pending and until > now:
            clock.busy_alloc += sum(r.job.gpu_milli for r in running.values()) * (until - now)
            clock.busy_span += until - now
        if until > now:
            for r in running.values():
                r.left -= r.speed * (until - now)
        now = until
        changed: set[tuple[int, int]] = set()
        for key in [k for k, r in running.items() if r.left <= 1e-6 * r.job.steps]:
            run = running.pop(key)
            snap.forget(run.pod.key)
            members = clock.per_gpu[(run.node, run.gpu)]
            members.remove(run)
            changed.add((run.node, run.gpu))
            jct.append(now - run.job.arrival_s)
        while i < len(arrivals) and arrivals[i].arrival_s <= now:
            pending.append(arrivals[i])
            i += 1
        still: list[SharedJob] = []
        for job in pending:
            pod = pods[job.id]
            result = fw.schedule(pod, snap, rng)
            placement: Placement | None = result.placement
            if placement is None:
                still.append(job)
                continue
            snap.assume(pod, placement)
            gpu = placement.gpu_indices[0]
            gpu_type = snap.models[int(snap.model_id[placement.node])]
            run = _Running(job, pod, placement.node, gpu, gpu_type, job.steps)
            members = clock.per_gpu.setdefault((placement.node, gpu), [])
            if members:
                colocations += 1
                names = [m.job.workload for m in members]
                worst = max(
                    [physics.slowdown(job.workload, names, gpu_type)]
                    + [
                        physics.slowdown(m.job.workload, [*names[:k], *names[k + 1 :],
                                                          job.workload], gpu_type)
                        for k, m in enumerate(members)
                    ]
                )  # fmt: skip
                slowed += worst > cap
            members.append(run)
            running[job.id] = run
            changed.add((placement.node, gpu))
        pending = still
        restep(changed)
    total_gpus = capacity / MILLI_PER_GPU
    span = clock.span or 1.0
    return SharingResult(
        policy=label or policy,
        seed=seed,
        jobs=len(jobs),
        finished=len(jct),
        avg_jct_s=float(np.mean(jct)) if jct else math.inf,
        p99_jct_s=float(np.percentile(jct, 99)) if jct else math.inf,
        makespan_s=now,
        gpu_alloc_pct=100.0 * clock.alloc / (capacity * span),
        alloc_while_waiting_pct=(
            100.0 * clock.busy_alloc / (capacity * clock.busy_span) if clock.busy_span else 0.0
        ),
        throughput_util_pct=100.0 * clock.useful / (total_gpus * span),
        colocations=colocations,
        slowed_past_cap=slowed,
        wall_s=time.perf_counter() - started,
    )
