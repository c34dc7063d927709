"""The job simulator over several clusters: one hub, worker clusters with their GPU mixes and links.

Each worker cluster (`Site`) has its own GPUs and a link of `bandwidth_mbps` to where the jobs'
data lives. A job needs its artifacts on the cluster before it computes (`job_artifacts`: the
workload's image and dataset, sizes in `ARTIFACT_MB`); the first job on a cluster that needs one
moves it (those bytes are counted), holding its GPUs meanwhile (its pods are placed, then pull).
A job that starts while the same artifact is still arriving waits for the rest of that transfer
only. After that the cluster has it.

How jobs reach clusters (`dispatch`):

- `alnair`: late binding at the hub. Jobs wait in the hub's queue; at every event the hub's
  queueing policy (default `alnair`) decides over every cluster's GPUs at once, with runtimes on
  `<cluster>/<type>` that include the predicted transfer (`multicluster.scoring.hub_snapshot`),
  so the cluster is chosen by predicted completion = wait + transfer + runtime.
- `round-robin`: each job goes, on arrival, to the next cluster (in turn) that could ever hold it.
- `least-loaded`: on arrival, to the cluster whose GPUs in use plus queued are the smallest
  fraction of its GPUs.
- `first-fit`: MultiKueue's behaviour: the job is offered to every cluster and goes to the first
  one (in the configured order) that can admit it now; until one can, it waits at the hub.

With the three baselines, each cluster then runs its own queue with `local_policy` (default
`fifo`, Kueue's arrival order), over its own GPU types and its share of the team quotas.

Truth and belief are apart as in `engine`: policies see predicted runtimes and the transfer time
computed from artifact sizes and bandwidth; the simulator runs the true runtime. Memory-aware
policies only (no OOM modelling here; `engine` covers that).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.scheduler.jobsim.engine import PolicyViolation, _quantile
from alnair.scheduler.jobsim.workload import GPU_MEMORY_MIB, RESTART_COST_S, Cluster, SimJob
from alnair.scheduler.multicluster.scoring import (
    Artifact,
    WorkerView,
    hub_snapshot,
    split_key,
    transfer,
)
from alnair.scheduler.queueing.model import (
    ClusterQueueSpec,
    Decisions,
    FlavorQuota,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    RunningJob,
    RuntimeEstimate,
)
from alnair.scheduler.queueing.quota import QuotaLedger
from alnair.scheduler.queueing.registry import QueuePolicy, queue_policy

DISPATCHERS = ("alnair", "round-robin", "least-loaded", "first-fit")
MAX_ROUNDS_PER_INSTANT = 32


@dataclass(frozen=True, slots=True)
class Site:
    """One worker cluster: GPUs per type, link bandwidth to the data (megabits/s), region."""

    name: str
    gpus: Mapping[str, int]
    bandwidth_mbps: float
    region: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise InvalidValueError("site", self.name, "a cluster name, without '/'")
        if not self.bandwidth_mbps > 0:
            raise InvalidValueError("bandwidth_mbps", self.bandwidth_mbps, f"{self.name}: > 0")
        for gpu_type, count in self.gpus.items():
            if gpu_type not in GPU_MEMORY_MIB:
                raise InvalidValueError("gpu type", gpu_type, f"known: {list(GPU_MEMORY_MIB)}")
            if count < 0:
                raise InvalidValueError("gpus", count, f"{self.name}/{gpu_type}: >= 0")

    @classmethod
    def parse(cls, text: str) -> Site:
        """`name:k80=8,v100=24@1000` (GPUs per type, then link bandwidth in Mbit/s)."""
        try:
            name, rest = text.split(":", 1)
            gpus_text, bandwidth = rest.rsplit("@", 1)
            gpus = Cluster.parse(gpus_text).gpus
            return cls(name.strip(), dict(gpus), float(bandwidth))
        except ValueError:
            raise InvalidValueError(
                "site", text, "expected name:k80=N,p100=N,v100=N@<Mbit/s>"
            ) from None


DEFAULT_SITES: tuple[Site, ...] = (
    Site("us-east", {"k80": 8, "v100": 24}, 1_000.0, "us-east"),
    Site("us-west", {"p100": 24, "v100": 8}, 10_000.0, "us-west"),
    Site("eu-central", {"k80": 24, "p100": 8}, 2_500.0, "eu-central"),
)
"""Three heterogeneous clusters with Gavel's 32 K80 + 32 P100 + 32 V100 between them: the V100s
mostly behind the slowest link, the P100s behind the fastest."""

ARTIFACT_MB: Mapping[str, tuple[tuple[str, float], ...]] = {
    "ResNet-18": (("image:gavel/image-classification", 6_500.0), ("data:cifar10", 170.0)),
    "ResNet-50": (("image:gavel/image-classification", 6_500.0), ("data:imagenet", 146_000.0)),
    "Transformer": (("image:gavel/translation", 6_000.0), ("data:multi30k", 10.0)),
    "LM": (("image:gavel/language-modeling", 6_000.0), ("data:wikitext2", 13.0)),
    "Recommendation": (("image:gavel/recommendation", 5_500.0), ("data:ml-20m", 900.0)),
    "CycleGAN": (("image:gavel/cyclegan", 6_000.0), ("data:monet2photo", 300.0)),
    "A3C": (("image:gavel/rl", 5_000.0),),
}
"""What each Gavel workload pulls: its image (CUDA + PyTorch, about 5-6.5 GB) and the dataset its
command line names (published sizes: ImageNet ILSVRC-2012 train 146 GB, ML-20M, CIFAR-10, ...)."""


def job_artifacts(job_type: str) -> tuple[Artifact, ...]:
    """The artifacts a Gavel job type needs (`ResNet-50 (batch size 64)` -> its image, ImageNet)."""
    family = job_type.split(" (", 1)[0]
    entries = ARTIFACT_MB.get(family)
    if entries is None:
        raise InvalidValueError("job_type", job_type, f"no artifacts for {family!r}")
    return tuple(Artifact(name, size) for name, size in entries)


def total_cluster(sites: Sequence[Site]) -> Cluster:
    """All sites' GPUs as one `Cluster` (for `load_jobs`, which needs every GPU type)."""
    totals: Counter[str] = Counter()
    for site in sites:
        totals.update(site.gpus)
    return Cluster.parse(",".join(f"{t}={n}" for t, n in sorted(totals.items()) if n))


@dataclass(slots=True)
class _State:
    job: SimJob
    artifacts: tuple[Artifact, ...]
    remaining: float = 1.0
    runs: int = 0
    ran_s: float = 0.0
    site: str | None = None
    """Where a baseline dispatched it (None while at the hub)."""
    spec: JobSpec | None = None


@dataclass(slots=True)
class _Run:
    running: RunningJob
    site: str
    gpu_type: str
    start_s: float
    transfer_s: float
    token: int


@dataclass(frozen=True, slots=True)
class MultiJobOutcome:
    id: str
    gpus: int
    arrival_s: float
    end_s: float
    wait_s: float
    """Time between arrival and completion not holding GPUs."""
    site: str
    transfer_s: float


@dataclass(slots=True)
class MultiResult:
    dispatch: str
    policy: str
    jobs: list[MultiJobOutcome]
    moved_mb: float
    busy_gpu_s: float
    total_gpus: int
    preemptions: int
    decisions: int
    wall_s: float
    jobs_per_site: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float | int | dict[str, int]]:
        if not self.jobs:
            return {"jobs": 0}
        jct = sorted(j.end_s - j.arrival_s for j in self.jobs)
        waits = sorted(j.wait_s for j in self.jobs)
        makespan = max(j.end_s for j in self.jobs) - min(j.arrival_s for j in self.jobs)
        return {
            "jobs": len(self.jobs),
            "avg_jct_s": round(sum(jct) / len(jct), 1),
            "p99_jct_s": round(_quantile(jct, 0.99), 1),
            "avg_wait_s": round(sum(waits) / len(waits), 1),
            "p99_wait_s": round(_quantile(waits, 0.99), 1),
            "makespan_s": round(makespan, 1),
            "moved_gb": round(self.moved_mb / 1000.0, 1),
            "avg_transfer_s": round(sum(j.transfer_s for j in self.jobs) / len(self.jobs), 1),
            "utilization": round(self.busy_gpu_s / (self.total_gpus * makespan), 4)
            if makespan > 0
            else 0.0,
            "preemptions": self.preemptions,
            "jobs_per_site": dict(sorted(self.jobs_per_site.items())),
        }


def open_queues(gpus: Mapping[str, int], teams: Sequence[str]) -> dict[str, ClusterQueueSpec]:
    """One queue per team, each allowed every GPU: quotas and fair share are issue 13's subject
    (`engine`); here they would only add borrowing and reclaim, so the comparison isolates
    where jobs go and in which order."""
    return {
        team: ClusterQueueSpec(team, {t: FlavorQuota(n) for t, n in gpus.items()}) for team in teams
    }


def simulate_multicluster(
    jobs: Sequence[SimJob],
    sites: Sequence[Site],
    *,
    dispatch: str = "alnair",
    policy: str = "alnair",
    policy_options: Mapping[str, Any] | None = None,
    restart_cost_s: float = RESTART_COST_S,
) -> MultiResult:
    """Replay `jobs` over `sites`; every job runs to completion.

    `policy` is the hub's queueing policy with `dispatch="alnair"`, and each cluster's local
    queueing policy with the baselines.
    """
    if dispatch not in DISPATCHERS:
        raise InvalidValueError("dispatch", dispatch, f"known: {', '.join(DISPATCHERS)}")
    if len({s.name for s in sites}) != len(sites) or not sites:
        raise InvalidValueError("sites", [s.name for s in sites], "distinct names, at least one")
    started = perf_counter()
    # As the live hub: it places and never preempts across clusters (a remote restart pays
    # the transfer again), so `alnair`'s shortest-remaining-time preemption is off here.
    defaults: dict[str, Any] = {"preempt": False} if policy == "alnair" else {}
    chooser: QueuePolicy = queue_policy(policy, **(defaults | dict(policy_options or {})))
    by_name = {s.name: s for s in sites}
    teams = sorted({j.team for j in jobs})
    hub_queues = open_queues(
        {t: sum(s.gpus.get(t, 0) for s in sites) for t in GPU_MEMORY_MIB}, teams
    )
    local_queues = {s.name: open_queues(s.gpus, teams) for s in sites}
    free = {(s.name, t): n for s in sites for t, n in s.gpus.items()}
    ledgers = {s.name: QuotaLedger(local_queues[s.name]) for s in sites}
    hub_ledger = QuotaLedger(hub_queues)
    ready: dict[str, dict[str, float]] = {s.name: {} for s in sites}
    """Per site: artifact -> when its transfer completes (present from then on)."""
    states = {j.id: _State(j, job_artifacts(j.job_type)) for j in jobs}
    hub_pending: dict[str, _State] = {}
    local_pending: dict[str, dict[str, _State]] = {s.name: {} for s in sites}
    running: dict[str, _Run] = {}
    seq = itertools.count()
    events = [(job.arrival_s, next(seq), "arrive", job.id, 0) for job in jobs]
    heapq.heapify(events)
    outcomes: list[MultiJobOutcome] = []
    moved_mb = busy_gpu_s = 0.0
    preemptions = decisions = 0
    rr = itertools.cycle([s.name for s in sites])
    transfer_of: dict[str, float] = defaultdict(float)
    per_site: Counter[str] = Counter()

    def fits(state: _State, site: Site) -> bool:
        job = state.job
        return any(
            n >= job.gpus
            and GPU_MEMORY_MIB[t] >= job.predicted_peak_mib
            and t in job.true_runtime_s
            for t, n in site.gpus.items()
        )

    def spec_of(state: _State) -> JobSpec:
        if state.spec is None:
            job = state.job
            restart = restart_cost_s if state.runs > 0 else 0.0
            state.spec = JobSpec(
                id=job.id,
                queue=job.team,
                gpus=job.gpus,
                arrival_s=job.arrival_s,
                runtime={
                    t: RuntimeEstimate(
                        e.expected_s * state.remaining + restart,
                        e.upper_s * state.remaining + restart,
                    )
                    for t, e in job.predicted.items()
                },
                team=job.team,
                peak_memory_mib=job.predicted_peak_mib,
                restart_cost_s=restart_cost_s,
            )
        return state.spec

    def view(site: Site, now: float) -> WorkerView:
        return WorkerView(
            name=site.name,
            bandwidth_mbps=site.bandwidth_mbps,
            pools={
                t: GpuPool(n, free[(site.name, t)], GPU_MEMORY_MIB[t])
                for t, n in site.gpus.items()
                if n > 0
            },
            artifacts=frozenset(ready[site.name]),
            region=site.region,
        )

    def start(state: _State, site: Site, gpu_type: str, now: float, borrowing: bool) -> None:
        nonlocal moved_mb
        spec = spec_of(state)
        if free[(site.name, gpu_type)] < spec.gpus:
            raise PolicyViolation("over-committed GPUs", job=spec.id, site=site.name)
        true_runtime = state.job.true_runtime_s.get(gpu_type)
        if true_runtime is None or GPU_MEMORY_MIB[gpu_type] < state.job.true_peak_mib:
            raise PolicyViolation("placed where it cannot run", job=spec.id, gpu_type=gpu_type)
        free[(site.name, gpu_type)] -= spec.gpus
        # Transfers: what is present costs nothing, what is arriving costs the rest of its
        # transfer, what is missing is moved now (and counted).
        arrivals = ready[site.name]
        wait_transfer = 0.0
        missing = [a for a in state.artifacts if a.name not in arrivals]
        cost = transfer(missing, view(site, now))
        for artifact in state.artifacts:
            if artifact.name in arrivals:
                wait_transfer = max(wait_transfer, arrivals[artifact.name] - now)
        for artifact in missing:
            arrivals[artifact.name] = now + cost.seconds
        moved_mb += cost.megabytes
        transfer_s = max(wait_transfer, cost.seconds)
        restart = restart_cost_s if state.runs > 0 else 0.0
        state.runs += 1
        state.site = site.name
        end = now + transfer_s + restart + true_runtime * state.remaining
        token = next(seq)
        key = f"{site.name}/{gpu_type}" if dispatch == "alnair" else gpu_type
        running[spec.id] = _Run(
            RunningJob(spec, key, now, borrowing), site.name, gpu_type, now, transfer_s, token
        )
        transfer_of[spec.id] += transfer_s
        heapq.heappush(events, (end, token, "finish", spec.id, token))

    def stop(run: _Run, now: float) -> _State:
        nonlocal busy_gpu_s
        spec = run.running.job
        state = states[spec.id]
        free[(run.site, run.gpu_type)] += spec.gpus
        if dispatch == "alnair":
            hub_ledger.release(spec.queue, run.running.gpu_type, spec.gpus)
        else:
            ledgers[run.site].release(spec.queue, run.gpu_type, spec.gpus)
        busy_gpu_s += (now - run.start_s) * spec.gpus
        state.ran_s += now - run.start_s
        del running[spec.id]
        return state

    def apply(
        decided: Decisions, pending: dict[str, _State], now: float, site: Site | None
    ) -> bool:
        """Apply a policy's decisions; True when it preempted (ask again)."""
        nonlocal preemptions
        for preemption in decided.preemptions:
            run = running.get(preemption.job_id)
            if run is None:
                raise PolicyViolation("preempted a job not running", job=preemption.job_id)
            state = stop(run, now)
            true_total = state.job.true_runtime_s[run.gpu_type]
            worked = max(0.0, now - run.start_s - run.transfer_s)
            worked -= restart_cost_s if state.runs > 1 else 0.0
            state.remaining = max(0.0, state.remaining - max(0.0, worked) / true_total)
            state.spec = None
            pending[state.job.id] = state
            preemptions += 1
        for admission in decided.admissions:
            admitted = pending.pop(admission.job_id, None)
            if admitted is None:
                raise PolicyViolation("admitted a job not pending", job=admission.job_id)
            state = admitted
            if site is None:
                cluster, gpu_type = split_key(admission.gpu_type)
                ledger = hub_ledger
                key = admission.gpu_type
                where = by_name[cluster]
            else:
                gpu_type, ledger, key, where = (
                    admission.gpu_type,
                    ledgers[site.name],
                    admission.gpu_type,
                    site,
                )
            check = ledger.check(state.job.team, key, state.job.gpus)
            if not check.ok:
                raise PolicyViolation("exceeded quota", job=state.job.id, reason=check.reason)
            ledger.take(state.job.team, key, state.job.gpus)
            start(state, where, gpu_type, now, admission.borrowing)
        return bool(decided.preemptions)

    while events:
        now = events[0][0]
        arrived: list[_State] = []
        while events and events[0][0] == now:
            _, _, kind, job_id, token = heapq.heappop(events)
            if kind == "arrive":
                arrived.append(states[job_id])
                continue
            run = running.get(job_id)
            if run is None or run.token != token:
                continue
            state = stop(run, now)
            per_site[run.site] += 1
            outcomes.append(
                MultiJobOutcome(
                    job_id,
                    state.job.gpus,
                    state.job.arrival_s,
                    now,
                    now - state.job.arrival_s - state.ran_s,
                    run.site,
                    transfer_of[job_id],
                )
            )
        for state in arrived:
            fitting = [s for s in sites if fits(state, s)]
            if not fitting:
                raise PolicyViolation("no cluster can hold the job", job=state.job.id)
            if dispatch in ("alnair", "first-fit"):
                hub_pending[state.job.id] = state
                continue
            if dispatch == "round-robin":
                name = next(n for n in rr if by_name[n] in fitting)
            else:  # least-loaded
                name = min(
                    fitting,
                    key=lambda s: (
                        (
                            sum(s.gpus.values())
                            - sum(free[(s.name, t)] for t in s.gpus)
                            + sum(p.job.gpus for p in local_pending[s.name].values())
                        )
                        / max(1, sum(s.gpus.values())),
                        s.name,
                    ),
                ).name
            local_pending[name][state.job.id] = state
        if dispatch == "alnair":
            for _ in range(MAX_ROUNDS_PER_INSTANT):
                if not hub_pending:
                    break
                views = [view(s, now) for s in sites]
                snapshot = hub_snapshot(
                    now,
                    [(spec_of(s), s.artifacts) for s in hub_pending.values()],
                    [r.running for r in running.values()],
                    hub_queues,
                    views,
                )
                decisions += 1
                if not apply(chooser.decide(snapshot), hub_pending, now, None):
                    break
            continue
        if dispatch == "first-fit":
            room = dict(free)
            for state in sorted(hub_pending.values(), key=lambda s: (s.job.arrival_s, s.job.id)):
                for site in sites:
                    fit = next(
                        (
                            t
                            for t in site.gpus
                            if room[(site.name, t)] >= state.job.gpus
                            and GPU_MEMORY_MIB[t] >= state.job.predicted_peak_mib
                            and t in state.job.true_runtime_s
                        ),
                        None,
                    )
                    if fit is not None:
                        room[(site.name, fit)] -= state.job.gpus
                        del hub_pending[state.job.id]
                        local_pending[site.name][state.job.id] = state
                        break
        for site in sites:
            pending = local_pending[site.name]
            for _ in range(MAX_ROUNDS_PER_INSTANT):
                if not pending:
                    break
                snapshot = QueueSnapshot(
                    now_s=now,
                    pending=[spec_of(s) for s in pending.values()],
                    running=[r.running for r in running.values() if r.site == site.name],
                    queues=local_queues[site.name],
                    capacity={
                        t: GpuPool(n, free[(site.name, t)], GPU_MEMORY_MIB[t])
                        for t, n in site.gpus.items()
                        if n > 0
                    },
                )
                decisions += 1
                if not apply(chooser.decide(snapshot), pending, now, site):
                    break
            if dispatch == "first-fit":
                # MultiKueue withdraws the job from a cluster that did not admit it.
                for job_id in list(pending):
                    hub_pending[job_id] = pending[job_id]
                pending.clear()
    if hub_pending or running or any(local_pending.values()):
        raise PolicyViolation("jobs never finished", dispatch=dispatch, hub=len(hub_pending))
    return MultiResult(
        dispatch=dispatch,
        policy=policy,
        jobs=outcomes,
        moved_mb=moved_mb,
        busy_gpu_s=busy_gpu_s,
        total_gpus=sum(sum(s.gpus.values()) for s in sites),
        preemptions=preemptions,
        decisions=decisions,
        wall_s=perf_counter() - started,
        jobs_per_site=dict(per_site),
    )
