"""The event-driven job simulator: arrivals and completions on a heap, the policy on each event.

Time jumps from event to event (no fixed step): at each instant every event due is applied
(arrival: the job joins the pending set; completion: its GPUs and quota free), then the policy
gets a `QueueSnapshot` and its decisions are applied: preemptions stop jobs (their progress is
kept, as from a checkpoint, and their next run pays `restart_cost_s` again), admissions start
jobs. If the policy preempted, it is asked again at once, since the preempted GPUs are free now.

Truth and belief are kept apart: the policy sees predicted runtimes and predicted peak memory;
the simulator runs each job for its *true* runtime, and a job whose true peak memory exceeds
its GPU type's memory fails with an out-of-memory error `OOM_AFTER_S` seconds after it starts
(the first forward and backward pass). The user then resubmits it pinned to the fastest GPU
type with room for it (`gpu_model`), which is what a person reading the OOM would do.

Every decision is checked against the shared quota ledger and the free GPUs: a policy that
over-commits a GPU or exceeds a quota stops the run with an error naming the job.

Two physics. The default is the product's: a job keeps its GPUs until it ends or is preempted,
and each restart costs `restart_cost_s`. With `round_s` (Gavel-compatible, for comparing with
Gavel's simulator) the policy decides only at round boundaries, as Gavel's does: a round
lasts `round_s` or until the last job placed in it ends, whichever is sooner; jobs that arrive
during a round wait for the next one; at each boundary every running job is stopped at no
cost (its progress kept exactly) and the policy places the whole set again, so a job may move
to another GPU type every round for free; GPUs freed during a round stay idle until its end;
with nothing running the next round starts at the next arrival. Restarts cost nothing there.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from time import perf_counter

from alnair.common.errors import AlnairError, InvalidValueError
from alnair.scheduler.jobsim.workload import GPU_MEMORY_MIB, RESTART_COST_S, Cluster, SimJob
from alnair.scheduler.queueing.history import UsageHistory
from alnair.scheduler.queueing.model import (
    ClusterQueueSpec,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    RunningJob,
    RuntimeEstimate,
)
from alnair.scheduler.queueing.quota import QuotaLedger
from alnair.scheduler.queueing.registry import QueuePolicy

OOM_AFTER_S = 60.0
MAX_ROUNDS_PER_INSTANT = 32


class PolicyViolation(AlnairError):
    """A policy's decision broke an invariant (over-committed GPUs, exceeded quota)."""


@dataclass(slots=True)
class _State:
    job: SimJob
    remaining: float = 1.0
    """Fraction of the job's work still to do."""
    runs: int = 0
    preempted: int = 0
    pinned: str | None = None
    spec: JobSpec | None = None
    ran_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    gpu_s_by_type: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass(slots=True)
class _Run:
    running: RunningJob
    start_s: float
    end_s: float
    oom: bool
    token: int


@dataclass(frozen=True, slots=True)
class JobOutcome:
    id: str
    team: str
    gpus: int
    arrival_s: float
    end_s: float
    wait_s: float
    """Time spent not running between arrival and completion."""
    runs: int


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    cluster: str
    predictions: str
    jobs: list[JobOutcome]
    oom: int
    preemptions: int
    decisions: int
    busy_gpu_s: float
    gpu_s_by_team: Mapping[str, float]
    entitlement: Mapping[str, float]
    total_gpus: int
    wall_s: float

    def metrics(self) -> dict[str, float | int]:
        """The figures `make bench-queue` reports, and more."""
        if not self.jobs:
            return {"jobs": 0}
        jct = sorted(j.end_s - j.arrival_s for j in self.jobs)
        waits = sorted(j.wait_s for j in self.jobs)
        first = min(j.arrival_s for j in self.jobs)
        last = max(j.end_s for j in self.jobs)
        makespan = last - first
        big = [j.wait_s for j in self.jobs if j.gpus >= 8]
        return {
            "jobs": len(self.jobs),
            "avg_jct_s": round(sum(jct) / len(jct), 1),
            "p99_jct_s": round(_quantile(jct, 0.99), 1),
            "avg_wait_s": round(sum(waits) / len(waits), 1),
            "p99_wait_s": round(_quantile(waits, 0.99), 1),
            "makespan_s": round(makespan, 1),
            "utilization": round(self.busy_gpu_s / (self.total_gpus * makespan), 4)
            if makespan > 0
            else 0.0,
            "oom": self.oom,
            "preemptions": self.preemptions,
            "preemptions_per_job": round(self.preemptions / len(self.jobs), 3),
            "max_wait_8gpu_s": round(max(big), 1) if big else 0.0,
        }

    def team_shares(self) -> dict[str, dict[str, float]]:
        """Each team's share of the GPU time used, beside its entitlement (nominal share)."""
        used = sum(self.gpu_s_by_team.values()) or 1.0
        return {
            team: {
                "share": round(self.gpu_s_by_team.get(team, 0.0) / used, 4),
                "entitlement": round(entitled, 4),
            }
            for team, entitled in self.entitlement.items()
        }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def simulate(
    policy: QueuePolicy,
    jobs: Sequence[SimJob],
    cluster: Cluster,
    queues: Mapping[str, ClusterQueueSpec],
    *,
    predictions: str = "oracle",
    restart_cost_s: float = RESTART_COST_S,
    progress: Callable[[int, int], None] | None = None,
    usage_half_life_s: float | None = None,
    round_s: float | None = None,
) -> SimResult:
    """Replay `jobs` on `cluster` under `policy`; every job runs to completion. With
    `usage_half_life_s`, the policy sees each queue's decayed GPU use (fair sharing by
    history, `queueing/history.py`); with `round_s`, Gavel's round physics (module doc)."""
    if round_s is not None:
        if round_s <= 0:
            raise InvalidValueError("round_s", round_s, "must be > 0")
        restart_cost_s = 0.0
    started = perf_counter()
    next_round_s: float | None = None
    history = UsageHistory(usage_half_life_s) if usage_half_life_s else None
    states = {job.id: _State(job) for job in jobs}
    capacity_types = list(cluster.gpus)
    free = dict(cluster.gpus)
    ledger = QuotaLedger(queues)
    pending: dict[str, _State] = {}
    running: dict[str, _Run] = {}
    events: list[tuple[float, int, str, str, int]] = []
    sequence = 0
    for job in jobs:
        events.append((job.arrival_s, sequence, "arrive", job.id, 0))
        sequence += 1
    heapq.heapify(events)
    oom = preemptions = decisions = done = 0
    busy_gpu_s = 0.0
    gpu_s_by_team: dict[str, float] = defaultdict(float)
    outcomes: list[JobOutcome] = []

    def spec_of(state: _State, now: float) -> JobSpec:
        waited = max(0.0, now - state.job.arrival_s - state.ran_s)
        if state.spec is not None and state.spec.waited_s != waited:
            state.spec = replace(state.spec, waited_s=waited)
        if state.spec is None:
            job = state.job
            restart = restart_cost_s if state.runs > 0 else 0.0
            runtime = {
                t: RuntimeEstimate(
                    e.expected_s * state.remaining + restart, e.upper_s * state.remaining + restart
                )
                for t, e in job.predicted.items()
            }
            state.spec = JobSpec(
                id=job.id,
                queue=job.team,
                gpus=job.gpus,
                arrival_s=job.arrival_s,
                runtime=runtime,
                team=job.team,
                gpu_model=state.pinned,
                peak_memory_mib=job.predicted_peak_mib,
                restart_cost_s=restart_cost_s,
                preemptions=state.preempted,
                waited_s=waited,
            )
        return state.spec

    def stop(run: _Run, now: float) -> _State:
        spec = run.running.job
        state = states[spec.id]
        gpu_type = run.running.gpu_type
        elapsed = now - run.start_s
        free[gpu_type] += spec.gpus
        ledger.release(spec.queue, gpu_type, spec.gpus)
        busy_gpu_s_delta = elapsed * spec.gpus
        gpu_s_by_team[state.job.team] += busy_gpu_s_delta
        state.gpu_s_by_type[gpu_type] += busy_gpu_s_delta
        state.ran_s += elapsed
        del running[spec.id]
        return state

    def suspend(run: _Run, now: float) -> _State:
        """Stop a run with its progress kept (as from a checkpoint, less the restart it was
        still paying) and put its job back in the pending set."""
        nonlocal busy_gpu_s
        state = stop(run, now)
        busy_gpu_s += (now - run.start_s) * run.running.gpus
        true_total = state.job.true_runtime_s[run.running.gpu_type]
        restart = restart_cost_s if state.runs > 1 else 0.0
        worked = max(0.0, now - run.start_s - restart)
        state.remaining = max(0.0, state.remaining - worked / true_total)
        state.spec = None
        pending[state.job.id] = state
        return state

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, job_id, token = heapq.heappop(events)
            if kind == "round":
                continue
            if kind == "arrive":
                pending[job_id] = states[job_id]
                continue
            run = running.get(job_id)
            if run is None or run.token != token:
                continue  # a completion of a run that was preempted
            state = stop(run, now)
            busy_gpu_s += (now - run.start_s) * run.running.gpus
            state.spec = None
            if kind == "oom":
                oom += 1
                state.pinned = _fastest_fitting(state.job, capacity_types)
                pending[job_id] = state
            else:
                state.remaining = 0.0
                state.end_s = now
                done += 1
                outcomes.append(
                    JobOutcome(
                        state.job.id,
                        state.job.team,
                        state.job.gpus,
                        state.job.arrival_s,
                        now,
                        now - state.job.arrival_s - state.ran_s,
                        state.runs,
                    )
                )
                if progress is not None:
                    progress(done, len(jobs))
        boundary = round_s is None or (
            bool(pending) if next_round_s is None else now >= next_round_s
        )  # mid-round, GPUs a completion frees stay idle until the round ends
        if boundary and round_s is not None:
            for run in list(running.values()):  # every job is placed again, at no cost
                suspend(run, now)
        for _ in range(MAX_ROUNDS_PER_INSTANT if boundary else 0):
            if not pending:
                break
            snapshot = QueueSnapshot(
                now_s=now,
                pending=[spec_of(s, now) for s in pending.values()],
                running=[r.running for r in running.values()],
                queues=queues,
                capacity={
                    t: GpuPool(cluster.gpus[t], free[t], GPU_MEMORY_MIB[t]) for t in capacity_types
                },
                usage=history.advance(now) if history is not None else {},
            )
            result = policy.decide(snapshot)
            decisions += 1
            for preemption in result.preemptions:
                run = running.get(preemption.job_id)
                if run is None:
                    raise PolicyViolation(
                        "preempted a job that is not running", job=preemption.job_id
                    )
                suspend(run, now).preempted += 1
                preemptions += 1
            for admission in result.admissions:
                waiting = pending.pop(admission.job_id, None)
                if waiting is None:
                    raise PolicyViolation(
                        "admitted a job that is not pending", job=admission.job_id
                    )
                state = waiting
                spec = spec_of(state, now)
                gpu_type = admission.gpu_type
                if admission.gpus != spec.gpus or free.get(gpu_type, 0) < spec.gpus:
                    raise PolicyViolation(
                        "over-committed GPUs", job=spec.id, gpu_type=gpu_type, gpus=admission.gpus
                    )
                check = ledger.check(spec.queue, gpu_type, spec.gpus)
                if not check.ok:
                    raise PolicyViolation("exceeded quota", job=spec.id, reason=check.reason)
                free[gpu_type] -= spec.gpus
                ledger.take(spec.queue, gpu_type, spec.gpus)
                restart = restart_cost_s if state.runs > 0 else 0.0
                state.runs += 1
                if state.first_start_s is None:
                    state.first_start_s = now
                true_runtime = state.job.true_runtime_s.get(gpu_type)
                oom_here = (
                    state.job.true_peak_mib > GPU_MEMORY_MIB[gpu_type] or true_runtime is None
                )
                if oom_here:
                    end, kind = now + OOM_AFTER_S, "oom"
                else:
                    assert true_runtime is not None
                    end, kind = now + restart + true_runtime * state.remaining, "finish"
                sequence += 1
                running[spec.id] = _Run(
                    RunningJob(spec, gpu_type, now, admission.borrowing),
                    now,
                    end,
                    oom_here,
                    sequence,
                )
                heapq.heappush(events, (end, sequence, kind, spec.id, sequence))
            if not result.preemptions:
                break
        if boundary and round_s is not None:
            ends = [min(r.end_s, now + round_s) for r in running.values()]
            next_round_s = max(ends) if ends else None
            if next_round_s is not None:
                sequence += 1
                heapq.heappush(events, (next_round_s, sequence, "round", "", sequence))
        if history is not None:  # what runs from this instant on, for the next interval
            history.advance(now)
            held: dict[str, int] = defaultdict(int)
            for r in running.values():
                held[r.running.job.queue] += r.running.gpus
            history.hold(held)
    if pending or running:
        stuck = sorted(pending)[:5]
        raise PolicyViolation(
            "jobs never started", policy=policy.name, pending=len(pending), first=stuck
        )
    total = sum(sum(q.quota[t].nominal for t in q.quota) for q in queues.values()) or 1
    entitlement = {
        name: sum(q.quota[t].nominal for t in q.quota) / total for name, q in queues.items()
    }
    return SimResult(
        policy=policy.name,
        cluster=cluster.name,
        predictions=predictions,
        jobs=outcomes,
        oom=oom,
        preemptions=preemptions,
        decisions=decisions,
        busy_gpu_s=busy_gpu_s,
        gpu_s_by_team=dict(gpu_s_by_team),
        entitlement=entitlement,
        total_gpus=cluster.total,
        wall_s=perf_counter() - started,
    )


def _fastest_fitting(job: SimJob, types: Sequence[str]) -> str | None:
    fitting = [
        t for t in types if GPU_MEMORY_MIB[t] >= job.true_peak_mib and t in job.true_runtime_s
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda t: job.true_runtime_s[t])
