"""Replay Gavel's job trace as pods with gangs and priorities, through the binder's plugins.

Each job of the shipped Gavel trace (`jobsim.workload.load_jobs`) becomes `scale_factor` pods of
one GPU each; a multi-GPU job's pods form a gang (`minMember` = all of them), and a seeded share
of jobs gets a high priority. Pods arrive at the job's arrival time and hold their GPUs for the
job's measured runtime on the GPU type they got (a gang runs at its slowest member's speed).

Everything is decided by `build_profile`'s framework, the live binder's: Coscheduling
(PreFilter: the gang fits whole now; Permit: members wait until the quorum is placed, and are
withdrawn when the group's timeout passes first), DefaultPreemption (PostFilter: a high-priority
pod or gang evicts lower-priority jobs; an evicted job loses its progress and queues again),
NodeReservation (a pod pending past `starvation_after_s` of simulated time holds a node), and
the placement policy. The engine only plays the roles the API server and kubelet play live:
the queue (priority, then arrival), binding (assume), eviction (forget), completion.

The report counts gangs started whole (and checks that no gang ever runs partly placed),
preemptions, timeouts, and job completion times per priority class.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.books import GangBook, GangSpec, Reservations
from alnair.scheduler.cluster.requests import NodeSpec, PodRequest
from alnair.scheduler.cluster.snapshot import ClusterSnapshot
from alnair.scheduler.framework.interface import ScheduleResult
from alnair.scheduler.framework.status import Code
from alnair.scheduler.jobsim.workload import Cluster, SimJob, load_jobs
from alnair.scheduler.plugins.registry import ProfileOptions, framework

GPUS_PER_NODE = 4
CPU_PER_GPU_MILLI = 4000
MEMORY_PER_GPU_MIB = 16 * 1024
HIGH_PRIORITY = 1000
NAMESPACE = "sim"


@dataclass(frozen=True)
class GangReplayConfig:
    policy: str = "alnair"
    seed: int = 42
    jobs: int = 400
    """How many of the trace's jobs (in arrival order)."""
    cluster: str = "k80=32,p100=32,v100=32"
    high_priority_share: float = 0.2
    gang_timeout_s: float = 600.0
    starvation_after_s: float = 0.0
    """Simulated seconds before a pending pod holds a node (0: never)."""
    max_reserved_nodes: int = 4

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise InvalidValueError("jobs", self.jobs, "at least one job")
        if not 0.0 <= self.high_priority_share <= 1.0:
            raise InvalidValueError("high_priority_share", self.high_priority_share, "0..1")
        if self.gang_timeout_s <= 0:
            raise InvalidValueError("gang_timeout_s", self.gang_timeout_s, "must be positive")


@dataclass
class _Job:
    spec: SimJob
    priority: int
    pods: list[PodRequest]
    epoch: int = 0
    """Bumped on eviction, so a completion scheduled before it is ignored."""
    started: float | None = None
    finished: float | None = None
    preempted: int = 0


@dataclass
class GangReplayResult:
    config: GangReplayConfig
    jobs: int
    gangs: int
    gangs_placed_whole: int
    """Distinct gangs that started with every member placed."""
    gang_starts: int
    """Gang starts, restarts after an eviction included."""
    partial_gangs_seen: int
    gang_timeouts: int
    preemptions: int
    """Pods evicted."""
    jobs_preempted: int
    nodes_reserved: int
    jobs_finished: int
    jct_s: dict[str, list[float]] = field(default_factory=dict)
    wait_s: dict[str, list[float]] = field(default_factory=dict)
    makespan_s: float = 0.0
    cycles: int = 0
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        def summary(values: list[float]) -> dict[str, float | int]:
            if not values:
                return {"jobs": 0}
            arr = np.array(values)
            return {
                "jobs": len(values),
                "mean": round(float(arr.mean()), 1),
                "p50": round(float(np.percentile(arr, 50)), 1),
                "p99": round(float(np.percentile(arr, 99)), 1),
            }

        return {
            "policy": self.config.policy,
            "seed": self.config.seed,
            "cluster": self.config.cluster,
            "jobs": self.jobs,
            "jobs_finished": self.jobs_finished,
            "gangs": self.gangs,
            "gangs_placed_whole": self.gangs_placed_whole,
            "gang_starts": self.gang_starts,
            "partial_gangs_seen": self.partial_gangs_seen,
            "gang_timeouts": self.gang_timeouts,
            "preemptions": self.preemptions,
            "jobs_preempted": self.jobs_preempted,
            "nodes_reserved": self.nodes_reserved,
            "jct_s": {k: summary(v) for k, v in sorted(self.jct_s.items())},
            "queue_wait_s": {k: summary(v) for k, v in sorted(self.wait_s.items())},
            "makespan_s": round(self.makespan_s, 1),
            "scheduling_cycles": self.cycles,
            "wall_s": round(self.wall_s, 3),
        }


def cluster_nodes(cluster: Cluster) -> list[NodeSpec]:
    """Nodes of `GPUS_PER_NODE` GPUs of one type each (the last one of a type may be smaller)."""
    nodes: list[NodeSpec] = []
    for gpu_type, count in cluster.gpus.items():
        for i in range(0, count, GPUS_PER_NODE):
            gpus = min(GPUS_PER_NODE, count - i)
            nodes.append(
                NodeSpec(
                    name=f"{gpu_type}-{i // GPUS_PER_NODE:03d}",
                    cpu_milli=gpus * CPU_PER_GPU_MILLI * 2,
                    memory_mib=gpus * MEMORY_PER_GPU_MIB * 2,
                    gpu_count=gpus,
                    gpu_model=gpu_type,
                )
            )
    return nodes


def job_pods(job: SimJob, priority: int, all_types: frozenset[str]) -> list[PodRequest]:
    """One 1-GPU pod per GPU of the job; a gang when the job has several."""
    models = frozenset(job.true_runtime_s)
    return [
        PodRequest(
            name=f"{job.id}-{i}",
            namespace=NAMESPACE,
            uid=f"{job.id}-{i}",
            cpu_milli=CPU_PER_GPU_MILLI,
            memory_mib=MEMORY_PER_GPU_MIB,
            num_gpu=1,
            gpu_milli=1000,
            gpu_models=frozenset() if models >= all_types else models,
            priority=priority,
            gang=f"{NAMESPACE}/{job.id}" if job.gpus > 1 else None,
            created=job.arrival_s,
            labels=(("job", job.id),),
        )
        for i in range(job.gpus)
    ]


def replay_gangs(config: GangReplayConfig) -> GangReplayResult:
    """Replay `config.jobs` jobs of the Gavel trace (module docstring)."""
    started_wall = time.perf_counter()
    cluster = Cluster.parse(config.cluster)
    specs = sorted(
        load_jobs(cluster, seed=config.seed, limit=config.jobs), key=lambda j: j.arrival_s
    )
    specs = specs[: config.jobs]
    rng = np.random.default_rng(config.seed)
    all_types = frozenset(cluster.gpus)
    jobs: dict[str, _Job] = {}
    for spec in specs:
        priority = HIGH_PRIORITY if rng.random() < config.high_priority_share else 0
        jobs[spec.id] = _Job(spec, priority, job_pods(spec, priority, all_types))
    job_of = {p.key: j for j in jobs.values() for p in j.pods}

    nodes = cluster_nodes(cluster)
    snapshot = ClusterSnapshot.build(nodes)
    pending: dict[str, PodRequest] = {}
    """Pods waiting to be scheduled (arrived, not placed)."""
    book = GangBook(pending=lambda gang: [p for p in pending.values() if p.gang == gang])
    for job in jobs.values():
        if job.spec.gpus > 1:
            book.specs[f"{NAMESPACE}/{job.spec.id}"] = GangSpec(
                job.spec.gpus, config.gang_timeout_s
            )
    reserved_count = 0

    def on_reservation(released: bool) -> None:
        nonlocal reserved_count
        if not released:
            reserved_count += 1

    snapshot.gangs = book
    snapshot.reservations = Reservations(on_change=on_reservation)
    now = 0.0
    options = ProfileOptions(
        starvation_after_s=config.starvation_after_s,
        max_reserved_nodes=config.max_reserved_nodes,
        clock=lambda: now,
    )
    fw = framework(config.policy, [p for j in jobs.values() for p in j.pods], options=options)

    # Events: (time, order, kind, job id, epoch); kinds: arrive, finish, timeout.
    events: list[tuple[float, int, str, str, int]] = []
    order = 0

    def push(at: float, kind: str, job_id: str, epoch: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, job_id, epoch))

    for job in jobs.values():
        push(job.spec.arrival_s, "arrive", job.spec.id, 0)

    waiting: dict[str, dict[str, ScheduleResult]] = defaultdict(dict)
    """Gang -> members assumed and waiting at Permit."""
    result = GangReplayResult(
        config=config,
        jobs=len(jobs),
        gangs=sum(1 for j in jobs.values() if j.spec.gpus > 1),
        gangs_placed_whole=0,
        gang_starts=0,
        partial_gangs_seen=0,
        gang_timeouts=0,
        preemptions=0,
        jobs_preempted=0,
        nodes_reserved=0,
        jobs_finished=0,
    )
    placed_at: dict[str, str] = {}
    """Pod key -> GPU type it runs on."""

    def start(job: _Job) -> None:
        keys = [p.key for p in job.pods]
        if any(k not in snapshot.placed for k in keys):
            result.partial_gangs_seen += 1
            return
        if job.spec.gpus > 1:
            result.gang_starts += 1
            result.gangs_placed_whole += job.started is None
        job.started = now if job.started is None else job.started
        runtime = max(job.spec.true_runtime_s[placed_at[k]] for k in keys)
        push(now + runtime, "finish", job.spec.id, job.epoch)

    def evict(job: _Job) -> None:
        job.epoch += 1
        job.preempted += 1
        result.jobs_preempted += 1
        gang = job.pods[0].gang
        if gang:
            waiting.pop(gang, None)
        for pod in job.pods:
            if pod.key in snapshot.placed:
                snapshot.forget(pod.key)
                result.preemptions += 1
            pending[pod.key] = pod

    def cycle() -> None:
        """Schedule pending pods in queue order (priority, then arrival) until none places."""
        progress = True
        preempted_for: set[str] = set()
        while progress:
            progress = False
            queue = sorted(pending.values(), key=lambda p: (-p.priority, p.created, p.name))
            failed_gangs: set[str] = set()
            for pod in queue:
                if pod.key not in pending or (pod.gang and pod.gang in failed_gangs):
                    continue
                result.cycles += 1
                outcome = fw.schedule(pod, snapshot, rng)
                if outcome.placement is None:
                    nomination = outcome.nomination
                    if (
                        nomination is not None
                        and nomination.victims
                        and pod.key not in preempted_for
                    ):
                        preempted_for.add(pod.key)
                        victims = {job_of[v].spec.id for v in nomination.victims if v in job_of}
                        for job_id in victims:
                            evict(jobs[job_id])
                        progress = True
                        break  # the queue changed: start over in order
                    if pod.gang:
                        failed_gangs.add(pod.gang)
                    continue
                snapshot.assume(pod, outcome.placement)
                del pending[pod.key]
                placed_at[pod.key] = snapshot.models[snapshot.model_id[outcome.placement.node]]
                progress = True
                job = job_of[pod.key]
                if outcome.status.code is Code.WAIT and pod.gang:
                    if not waiting[pod.gang]:
                        push(now + outcome.status.timeout_s, "timeout", job.spec.id, job.epoch)
                    waiting[pod.gang][pod.key] = outcome
                    continue
                if pod.gang:
                    waiting.pop(pod.gang, None)
                start(job)

    while events:
        now, _, kind, job_id, epoch = heapq.heappop(events)
        job = jobs[job_id]
        if kind == "arrive":
            for pod in job.pods:
                pending[pod.key] = pod
        elif kind == "finish":
            if epoch != job.epoch:
                continue
            for pod in job.pods:
                snapshot.forget(pod.key)
            job.finished = now
            result.jobs_finished += 1
        elif kind == "timeout":
            gang = job.pods[0].gang
            if epoch != job.epoch or gang is None or not waiting.get(gang):
                continue
            result.gang_timeouts += 1
            for key, held in waiting.pop(gang).items():
                pod = snapshot.placed[key][0]
                fw.unreserve(pod, snapshot, held)
                snapshot.forget(key)
                pending[key] = pod
        # Events at the same instant are applied before one scheduling pass.
        if events and events[0][0] == now:
            continue
        cycle()

    for job in jobs.values():
        klass = "high" if job.priority else "low"
        if job.finished is not None:
            result.jct_s.setdefault(klass, []).append(job.finished - job.spec.arrival_s)
        if job.started is not None:
            result.wait_s.setdefault(klass, []).append(job.started - job.spec.arrival_s)
    result.makespan_s = now
    result.nodes_reserved = reserved_count
    result.wall_s = time.perf_counter() - started_wall
    return result
