"""`make demo`, live part: the whole system on the local control plane, fed Gavel's Philly trace.

After the trace replay (`alnair.scheduler.simulator.demo`, no Kubernetes), this starts the local
stack (`alnair.dev.devstack`: nats, redis, the control plane, a few hundred KWOK GPU nodes
across K80/P100/V100, and the scheduler, the dispatcher, the elastic controller, the sim
profiler agent, the aggregator and the predictor as processes). Four teams get a ClusterQueue
each, a quarter of every GPU model, in one cohort. The trace's jobs are submitted to the teams'
queues as batch/v1 Jobs written as users write them (no `suspend`: the dispatcher's webhook
holds them for their queue), every fifth one-GPU job as fractional inference (half a GPU), one
training job in seven as an ElasticJob (`alnair.dev.demo_elastic`: the elastic controller runs it
too), time-compressed so the run takes a few minutes. Halfway, the console's GPU map is captured
in headless Chromium through `kubectl proxy`.

A job's runtime depends on where it runs, as on a real cluster: once the scheduler binds its pod
this demo (standing in for the training process) reads the node's GPU model and writes the
pod's `alnair.io/duration` = total steps / Gavel's measured throughput on that GPU type and
count, compressed; KWOK then completes the pod after that long. Arrivals and runtimes are
compressed by separate factors (printed): squeezing 85 days of arrivals into minutes with the
same factor would leave runtimes of a second or two and an idle cluster, so runtimes are scaled
to a median of `--median-runtime-s` on the job's fastest GPU type and capped at
`--max-runtime-s` (the trace's runtimes span four orders of magnitude).

What it measures, from one pod watch and one Job watch: jobs done, job completion time
(submission to the pod's success), scheduling latency (pod creation seen to bind seen), GPUs
allocated over time (the PNG), waits by the dispatcher's reason, each team's share of the GPU
time against its entitlement, the jobs done by kind, and what the rest of the system did with
the jobs (execution records, predictor version).

    python -m alnair.dev.live_demo [--nodes ...] [--jobs N] [--out out/demo]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from alnair.common import resources as res
from alnair.common.data import GAVEL_ARRIVALS, data_file, gavel_throughputs
from alnair.common.errors import AlnairError, ConfigError, InvalidValueError
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    ELASTICJOBS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    KubeClient,
    Obj,
    Resource,
)
from alnair.common.tasks import cancel_all, spawn, within
from alnair.dev import devstack
from alnair.dev.demo_elastic import ElasticTrainer, elastic_manifest
from alnair.dev.localstack import parse_node_specs
from alnair.dev.supervise import RESTART_MARK
from alnair.profiler.trialjob import LABEL_TRIALJOB
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE

LIVE_ENV = "ALNAIR_DEMO_LIVE"
DEFAULT_NODES = "67x K80, 67x P100, 66x V100M16"
ADMITTED = "alnair.io/Admitted"
COHORTS = Resource("alnair.io", "v1alpha1", "cohorts", namespaced=False)
CLUSTERQUEUES = Resource("alnair.io", "v1alpha1", "clusterqueues", namespaced=False)
LOCALQUEUES = Resource("alnair.io", "v1alpha1", "localqueues")
LABEL_JOB = "alnair.io/demo-job"
GAVEL_TYPE = {"K80": "k80", "P100": "p100", "V100M16": "v100", "V100M32": "v100"}
"""Node GPU model (the profiler's label) -> Gavel's GPU type. Gavel measured 16 GB V100s."""
SERVICES = ("profiler-agent", "aggregator", "predictor", "scheduler", "dispatcher", "elastic")
TEAMS = ("team-a", "team-b", "team-c", "team-d")
"""Four teams, each a ClusterQueue with a quarter of every GPU model, in one cohort."""
LOCAL_QUEUE = "default"
FRACTION_EVERY = 5
"""Every fifth one-GPU job runs as fractional inference: half a GPU's compute, 8 GiB."""
ELASTIC_EVERY = 7
"""Training jobs numbered 3 mod 7 run as ElasticJobs (`alnair.dev.demo_elastic`); 7 is prime
to the four teams, so every team has some."""
KINDS = ("training", "inference", "elastic")
LABEL_KIND = "alnair.io/demo-kind"
LATE_SAMPLES_S = 10
SERVICE_ENV = {
    # 1 Hz samples of hundreds of pods would keep two cores busy with metrics alone; every
    # 5 s still shows each job's utilization in its annotations and record.
    "profiler-agent": {"ALNAIR_PROFILER_SAMPLE_INTERVAL_S": "5"},
    # A job shorter than the sampling gets no sample; its record (usage unknown) is written
    # once no sample can still be on its way: on one machine's loopback that is two sampling
    # intervals, not the 90 s a cluster's default allows for an agent cut off from the bus.
    "aggregator": {"ALNAIR_PROFILER_LATE_SAMPLES_S": str(LATE_SAMPLES_S)},
}
_BATCH = re.compile(r"^(?P<family>.+?) \(batch size (?P<bs>\d+)\)$")


# --- the workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceJob:
    """One job of the trace and how long it runs alone on each GPU type it can use."""

    id: str
    job_type: str
    gpus: int
    arrival_s: float
    runtime_s: Mapping[str, float]
    """Gavel GPU type -> seconds (types where Gavel measured no throughput are absent)."""

    @property
    def number(self) -> int:
        """The job's line number in the trace (its id is `<prefix>-<number>`)."""
        return int(self.id.rsplit("-", 1)[1])


def load_trace(gpu_types: Sequence[str], limit: int | None = None) -> list[TraceJob]:
    """The shipped Philly-derived trace: Gavel's seven tab-separated columns `job_type,
    command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor`; the
    runtime on a type is total steps / Gavel's throughput for that job, GPU count and type
    (jobs Gavel measured on one GPU only are scaled linearly to their count, as Gavel's own
    simulator does)."""
    rate: dict[tuple[str, int, str], float] = {}
    for row in gavel_throughputs():
        if not row.partner and row.own > 0:
            rate[(row.job, row.scale, row.gpu.lower())] = row.own
    path = data_file(*GAVEL_ARRIVALS)
    jobs: list[TraceJob] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            job_type, steps, arrival_s, scale = (
                fields[0],
                int(fields[4]),
                float(fields[5]),
                int(fields[6]),
            )
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"{path}:{number}: not a Gavel trace line ({exc})") from exc
        runtime: dict[str, float] = {}
        for gpu_type in gpu_types:
            measured = rate.get((job_type, scale, gpu_type))
            if measured is None and (single := rate.get((job_type, 1, gpu_type))) is not None:
                measured = single * scale
            if measured is not None:
                runtime[gpu_type] = steps / measured
        if runtime:
            jobs.append(TraceJob(f"job-{number:05d}", job_type, scale, arrival_s, runtime))
        if limit is not None and len(jobs) >= limit:
            break
    return jobs


@dataclass(frozen=True)
class Compression:
    """Trace time -> demo time: arrivals and runtimes each by their own factor."""

    arrival_factor: float
    runtime_factor: float
    max_runtime_s: float

    def arrival(self, trace_s: float) -> float:
        return trace_s / self.arrival_factor

    def runtime(self, trace_s: float) -> float:
        return max(1.0, min(trace_s / self.runtime_factor, self.max_runtime_s))


def compression(
    jobs: Sequence[TraceJob], window_s: float, median_runtime_s: float, max_runtime_s: float
) -> Compression:
    """Arrivals squeezed into `window_s`; the median fastest-type runtime to `median_runtime_s`."""
    for name, value in (
        ("window_s", window_s),
        ("median_runtime_s", median_runtime_s),
        ("max_runtime_s", max_runtime_s),
    ):
        if value <= 0:
            raise InvalidValueError(name, value, "must be > 0")
    if not jobs:
        raise InvalidValueError("jobs", 0, "the workload is empty")
    last = max(j.arrival_s for j in jobs)
    fastest = statistics.median(min(j.runtime_s.values()) for j in jobs)
    return Compression(
        arrival_factor=max(last / window_s, 1.0),
        runtime_factor=max(fastest / median_runtime_s, 1.0),
        max_runtime_s=max_runtime_s,
    )


def model_annotations(job_type: str) -> dict[str, str]:
    """The profiler's and predictor's model annotations for a Gavel job type."""
    m = _BATCH.match(job_type)
    if m is None:
        return {res.ANN_MODEL_NAME: job_type}
    return {res.ANN_MODEL_NAME: m.group("family"), res.ANN_BATCH_SIZE: m.group("bs")}


def team_of(job: TraceJob) -> str:
    return TEAMS[job.number % len(TEAMS)]


def fractional(job: TraceJob) -> bool:
    return job.gpus == 1 and job.number % FRACTION_EVERY == 0


def kind_of(job: TraceJob) -> str:
    """training (a batch Job), inference (fractional) or elastic (an ElasticJob)."""
    if fractional(job):
        return "inference"
    return "elastic" if job.number % ELASTIC_EVERY == 3 else "training"


def job_manifest(job: TraceJob, node_models: Sequence[str]) -> Obj:
    """A batch/v1 Job (or an ElasticJob) for one trace job, submitted to its team's queue as a
    user writes it (no `suspend`: the dispatcher's webhook holds it); GPU types it cannot run
    on are excluded. A fractional one asks half a GPU's compute and 8 GiB of its memory."""
    name = job.id.lower()
    runs_on = [m for m in node_models if GAVEL_TYPE.get(m) in job.runtime_s]
    pod_annotations = model_annotations(job.job_type)
    if set(runs_on) != set(node_models):
        pod_annotations[res.GPU_MODEL_REQUEST] = "|".join(runs_on)
    kind = kind_of(job)
    if kind == "elastic":
        return elastic_manifest(
            name,
            team_of(job),
            job.gpus,
            labels={LABEL_JOB: name, LABEL_QUEUE: LOCAL_QUEUE, LABEL_KIND: kind},
            annotations=model_annotations(job.job_type),
            pod_labels={LABEL_JOB: name},
            pod_annotations=pod_annotations,
        )
    limits = (
        {res.GPU_COMPUTE: "50", res.GPU_MEMORY_GIB: "8"}
        if kind == "inference"
        else {res.GPU: str(job.gpus)}
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": team_of(job),
            "labels": {LABEL_JOB: name, LABEL_QUEUE: LOCAL_QUEUE, LABEL_KIND: kind},
            "annotations": model_annotations(job.job_type),
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {LABEL_JOB: name}, "annotations": pod_annotations},
                "spec": {
                    "schedulerName": res.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.invalid/gavel-job:1",
                            "resources": {
                                "limits": limits,
                                "requests": {"cpu": str(2 * job.gpus), "memory": "8Gi"},
                            },
                        }
                    ],
                },
            },
        },
    }


# --- what one run observed ---------------------------------------------------------------


@dataclass
class Observed:
    """Everything measured, in seconds since the workload started."""

    total_gpus: int
    submitted: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    finished: dict[str, tuple[float, str]] = field(default_factory=dict)
    gpus: dict[str, float] = field(default_factory=dict)
    """GPUs each batch job holds while it runs (half of one for fractional inference)."""
    held: dict[str, tuple[float, float]] = field(default_factory=dict)
    """GPUs each job holds now, and since when (an elastic job's changes as it resizes)."""
    used: dict[str, float] = field(default_factory=dict)
    """GPU-seconds each job held before its current holding."""
    team: dict[str, str] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    waits: dict[str, float] = field(default_factory=dict)
    """Seconds jobs spent waiting, by the dispatcher's reason (its `alnair.io/Admitted`
    condition while queued)."""
    waited: dict[str, set[str]] = field(default_factory=dict)
    """The jobs that waited for each reason."""
    waiting_since: dict[str, tuple[str, float]] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    """Why each job still waits (the dispatcher's reason and message)."""
    ended: float = 0.0
    """When the run stopped watching."""
    console: str = "not taken"
    """The console screenshot's path, or why there is none."""
    problems: list[str] = field(default_factory=list)
    """What the demo's own part could not do (an elastic job's completion not written)."""
    elastic_grew: int = 0
    """Elastic jobs that ran above their minimum size at some point."""
    unfinished: dict[str, int] = field(default_factory=dict)
    """Jobs not done when the run ended, by kind and what the dispatcher says of them."""
    timeline: list[tuple[float, float, int]] = field(default_factory=list)
    """(t, GPUs allocated, pods waiting) after every change."""

    @property
    def allocated(self) -> float:
        return sum(gpus for gpus, _ in self.held.values())

    def hold(self, job: str, gpus: float, now: float) -> None:
        """`job` holds `gpus` GPUs from `now` on."""
        before, since = self.held.get(job, (0.0, now))
        self.used[job] = self.used.get(job, 0.0) + before * (now - since)
        self.held[job] = (gpus, now)

    def wait(self, job: str, reason: str | None, now: float) -> None:
        """The job waits for `reason` from `now` (None: it waits no more)."""
        current = self.waiting_since.get(job)
        if current is not None and current[0] == reason:
            return
        if current is not None:
            self.waits[current[0]] = self.waits.get(current[0], 0.0) + now - current[1]
            del self.waiting_since[job]
        if reason is not None:
            self.waiting_since[job] = (reason, now)
            self.waited.setdefault(reason, set()).add(job)

    def team_shares(self) -> dict[str, float]:
        """Each team's share of the GPU-seconds used (until the run ended)."""
        used: dict[str, float] = dict.fromkeys(TEAMS, 0.0)
        for job in self.used.keys() | self.held.keys():
            gpus, since = self.held.get(job, (0.0, self.ended))
            seconds = self.used.get(job, 0.0) + gpus * max(0.0, self.ended - since)
            used[self.team.get(job, TEAMS[0])] += seconds
        total = sum(used.values()) or 1.0
        return {team: used[team] / total for team in TEAMS}

    @property
    def waiting(self) -> int:
        return sum(1 for j in self.seen if j not in self.bound and j not in self.finished)

    def mark(self, now: float) -> None:
        self.timeline.append((now, self.allocated, self.waiting))


@dataclass(frozen=True)
class Report:
    jobs: int
    done: int
    failed: int
    mean_jct_s: float
    median_jct_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    mean_util_pct: float
    peak_util_pct: float
    makespan_s: float


def report(obs: Observed) -> Report:
    ok = {j: t for j, (t, phase) in obs.finished.items() if phase == "Succeeded"}
    jct = [t - obs.submitted[j] for j, t in ok.items() if j in obs.submitted]
    lat = sorted((obs.bound[j] - obs.seen[j]) * 1000 for j in obs.bound if j in obs.seen)
    end = max((t for t, _ in obs.finished.values()), default=0.0)
    # time-weighted allocation from the first submission to the last completion
    area = 0.0
    for (t0, gpus, _), (t1, _, _) in zip(obs.timeline, obs.timeline[1:], strict=False):
        area += gpus * (t1 - t0)
    busy = end - min(obs.submitted.values(), default=0.0)
    return Report(
        jobs=len(obs.submitted),
        done=len(ok),
        failed=len(obs.finished) - len(ok),
        mean_jct_s=statistics.fmean(jct) if jct else 0.0,
        median_jct_s=statistics.median(jct) if jct else 0.0,
        latency_p50_ms=_pct(lat, 50),
        latency_p99_ms=_pct(lat, 99),
        latency_max_ms=lat[-1] if lat else 0.0,
        mean_util_pct=100 * area / (busy * obs.total_gpus) if busy > 0 else 0.0,
        peak_util_pct=100 * max((g for _, g, _ in obs.timeline), default=0) / obs.total_gpus,
        makespan_s=busy,
    )


def latency_by_kind(obs: Observed) -> dict[str, tuple[float, float]]:
    """Pod creation to bind (p50, p99, ms) per kind of job: where a latency tail comes from."""
    out: dict[str, tuple[float, float]] = {}
    for kind in KINDS:
        lat = sorted(
            (obs.bound[j] - obs.seen[j]) * 1000
            for j in obs.bound
            if j in obs.seen and obs.kind.get(j) == kind
        )
        if lat:
            out[kind] = (_pct(lat, 50), _pct(lat, 99))
    return out


def _pct(sorted_values: Sequence[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(pct / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]


def plot(obs: Observed, path: Path, title: str) -> Path:
    """GPUs allocated (% of the cluster) and pods waiting, over the run."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    ts = [t for t, _, _ in obs.timeline]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.step(ts, [100 * g / obs.total_gpus for _, g, _ in obs.timeline], where="post")
    top.set_ylabel("GPUs allocated (% of cluster)")
    top.set_ylim(0, 100)
    top.grid(alpha=0.3)
    top.set_title(title)
    bottom.step(ts, [w for _, _, w in obs.timeline], where="post", color="tab:orange")
    bottom.set_ylabel("pods waiting to be bound")
    bottom.set_xlabel("seconds since the first job was submitted")
    bottom.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


# --- the run -----------------------------------------------------------------------------


class Run:
    """Submits the jobs, writes each bound pod's duration, and records what it sees."""

    def __init__(
        self,
        kube: KubeClient,
        jobs: Sequence[TraceJob],
        comp: Compression,
        node_model: dict[str, str],
        total_gpus: int,
    ) -> None:
        self.kube = kube
        self.jobs = {j.id.lower(): j for j in jobs}
        self.comp = comp
        self.node_model = node_model
        self.obs = Observed(total_gpus)
        self.t0 = time.monotonic()
        self.durations: asyncio.Queue[tuple[str, str, float]] = asyncio.Queue()
        """(namespace, pod, seconds) of each bound pod."""
        self.all_done = asyncio.Event()
        self.changed = asyncio.Event()
        self.changed_submit = asyncio.Event()
        self.node_models = sorted(set(node_model.values()))
        self.console_note = "not taken"
        self.trainer = ElasticTrainer(kube, self.now, self.runtime_on)

    def runtime_on(self, job: str, model: str) -> float | None:
        """`job`'s runtime (compressed) on GPU model `model` at its trace GPU count."""
        runtime = self.jobs[job].runtime_s.get(GAVEL_TYPE.get(model, ""))
        return None if runtime is None else self.comp.runtime(runtime)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def on_job(self, _event: WatchEvent, job: Obj, _old: Obj | None) -> None:
        """The dispatcher's reason while the Job waits, until it is admitted or ends."""
        name = (job["metadata"].get("labels") or {}).get(LABEL_JOB)
        if name not in self.jobs:
            return
        conditions = (job.get("status") or {}).get("conditions") or []
        admitted = next((c for c in conditions if c.get("type") == ADMITTED), None)
        waiting = admitted is not None and admitted.get("status") == "False"
        self.obs.wait(name, str(admitted.get("reason")) if waiting and admitted else None,
                      self.now())  # fmt: skip
        if waiting and admitted:
            self.obs.why[name] = f"{admitted.get('reason')}: {admitted.get('message')}"
        else:
            self.obs.why.pop(name, None)

    async def on_pod(self, event: WatchEvent, pod: Obj, _old: Obj | None) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        job = labels.get(LABEL_JOB)
        if job is None or job not in self.jobs or LABEL_TRIALJOB in labels:
            return  # a trial run of a job (its template's labels): not the job itself
        now = self.now()
        obs = self.obs
        obs.seen.setdefault(job, now)
        node = pod["spec"].get("nodeName")
        model = self.node_model.get(node or "", "")
        if job in self.trainer:  # an elastic job's worker: the job holds what its workers do
            if node:
                obs.bound.setdefault(job, now)
            held = self.trainer.on_worker(job, pod, model, event is WatchEvent.DELETED)
            obs.hold(job, held, now)
        elif node and job not in obs.bound:
            obs.bound[job] = now
            obs.hold(job, obs.gpus[job], now)
            runtime = self.runtime_on(job, model)
            if runtime is not None:
                self.durations.put_nowait((meta["namespace"], meta["name"], runtime))
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") and job not in self.trainer:
            self.finish(job, phase, now)
        obs.mark(now)
        self.changed.set()

    async def on_elastic(self, _event: WatchEvent, obj: Obj, _old: Obj | None) -> None:
        """An elastic job ends when its status says so (the trainer's completion, or the
        controller's Failed)."""
        job = (obj["metadata"].get("labels") or {}).get(LABEL_JOB)
        phase = (obj.get("status") or {}).get("phase")
        if job is not None and job in self.trainer and phase in ("Succeeded", "Failed"):
            self.finish(job, str(phase), self.now())
            self.obs.mark(self.now())
            self.changed.set()

    def finish(self, job: str, phase: str, now: float) -> None:
        obs = self.obs
        if job in obs.finished:
            return
        obs.finished[job] = (now, phase)
        if job not in self.trainer:  # an elastic job's GPUs go back as its workers go
            obs.hold(job, 0.0, now)
        if len(obs.finished) == len(self.jobs):
            self.all_done.set()

    async def write_durations(self) -> None:
        """The job 'runs' as long as its GPU type needs: KWOK completes it after that."""
        while True:
            namespace, pod, seconds = await self.durations.get()
            await self.kube.patch(
                PODS,
                pod,
                {"metadata": {"annotations": {res.ANN_DURATION: res.duration_value(seconds)}}},
                namespace,
            )

    async def submit(self) -> None:
        for job in sorted(self.jobs.values(), key=lambda j: j.arrival_s):
            delay = self.comp.arrival(job.arrival_s) - self.now()
            if delay > 0:
                await asyncio.sleep(delay)  # the trace's arrival time, compressed
            name = job.id.lower()
            kind = kind_of(job)
            self.obs.gpus[name] = 0.5 if kind == "inference" else job.gpus
            self.obs.team[name] = team_of(job)
            self.obs.kind[name] = kind
            if kind == "elastic":
                self.trainer.add(name, team_of(job), job.gpus)
            self.obs.submitted[name] = self.now()
            self.changed_submit.set()
            resource = ELASTICJOBS if kind == "elastic" else JOBS
            await self.kube.create(resource, job_manifest(job, self.node_models), team_of(job))


async def create_queues(kube: KubeClient, per_model: Mapping[str, int]) -> None:
    """The teams' queues as a platform team writes them: one Cohort, a ClusterQueue per team
    with a quarter of every GPU model (what a team does not use, the others borrow), a
    namespace per team with its LocalQueue."""
    await kube.create(COHORTS, {"apiVersion": "alnair.io/v1alpha1", "kind": "Cohort",
                                "metadata": {"name": "demo"}})  # fmt: skip
    flavors = [
        {
            "name": model,
            "resources": [{"name": res.GPU, "nominalQuota": max(1, gpus // len(TEAMS))}],
        }
        for model, gpus in sorted(per_model.items())
        if model
    ]
    for team in TEAMS:
        await kube.create(CLUSTERQUEUES, {
            "apiVersion": "alnair.io/v1alpha1", "kind": "ClusterQueue",
            "metadata": {"name": team},
            "spec": {"cohort": "demo", "resourceGroups": [
                {"coveredResources": [res.GPU], "flavors": flavors},
            ]},
        })  # fmt: skip
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": team}})  # fmt: skip
        await kube.create(LOCALQUEUES, {
            "apiVersion": "alnair.io/v1alpha1", "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": team},
            "spec": {"clusterQueue": team},
        }, team)  # fmt: skip


async def screenshot(run: Run, state: devstack.State, path: Path) -> None:
    """The console, mid-run, as a user opens it (`kubectl proxy`, headless Chromium): its GPU
    map once half the jobs have arrived. Said and skipped when no Chromium is installed."""
    from alnair.dev.browser import Browser, chromium

    try:
        chromium()
    except ConfigError as exc:
        run.obs.console = f"skipped ({exc})"
        return
    while len(run.obs.submitted) < max(1, len(run.jobs) // 2):
        run.changed_submit.clear()
        await run.changed_submit.wait()
    kubectl = Path(sys.executable).parent / "kubectl"
    proxy = await asyncio.create_subprocess_exec(
        str(kubectl), "proxy", "--port=0", f"--kubeconfig={state.kubeconfig}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proxy.stdout is not None
        line = (await proxy.stdout.readline()).decode()
        port = line.rsplit(":", 1)[-1].strip()
        async with Browser() as page:
            await page.open(
                f"http://127.0.0.1:{port}/apis/scheduler.query.alnair.io/v1alpha1/console/#gpus"
            )
            await page.wait_for("document.querySelectorAll('.node').length > 0")
            await asyncio.sleep(1.0)  # let the map settle after its first updates
            await page.screenshot(path)
        run.obs.console = str(path)
    except (OSError, TimeoutError, RuntimeError, AlnairError) as exc:
        run.obs.console = f"not taken: {exc}"
    finally:
        proxy.terminate()
        await proxy.wait()


async def run_workload(
    state: devstack.State,
    jobs: Sequence[TraceJob],
    comp: Compression,
    timeout_s: float,
    shot: Path,
) -> Observed:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    async with KubeClient.from_config(state.kubeconfig, max_connections=64) as kube:
        nodes = (await kube.list(NODES))["items"]
        node_model = {
            n["metadata"]["name"]: n["metadata"]["labels"].get(res.LABEL_GPU_MODEL, "")
            for n in nodes
        }
        total = sum(int(n["status"]["capacity"].get(res.GPU, 0)) for n in nodes)
        per_model: dict[str, int] = {}
        for n in nodes:
            model = n["metadata"]["labels"].get(res.LABEL_GPU_MODEL, "")
            per_model[model] = per_model.get(model, 0) + int(
                n["status"]["capacity"].get(res.GPU, 0)
            )
        await create_queues(kube, per_model)
        run = Run(kube, jobs, comp, node_model, total)
        informer = Informer(kube, PODS, label_selector=LABEL_JOB, name="live-demo.pods")
        informer.add_handler(run.on_pod)
        job_informer = Informer(kube, JOBS, label_selector=LABEL_JOB, name="live-demo.jobs")
        job_informer.add_handler(run.on_job)
        elastic_informer = Informer(
            kube, ELASTICJOBS, label_selector=LABEL_JOB, name="live-demo.elasticjobs"
        )
        elastic_informer.add_handler(run.on_elastic)
        died = asyncio.Event()

        def on_death(_exc: BaseException) -> None:
            died.set()
            run.changed.set()

        tasks = [
            spawn(informer.run(), name="live-demo.pods", on_death=on_death),
            spawn(job_informer.run(), name="live-demo.jobs", on_death=on_death),
            spawn(elastic_informer.run(), name="live-demo.elasticjobs", on_death=on_death),
            spawn(run.trainer.run(), name="live-demo.trainer", on_death=on_death),
            spawn(screenshot(run, state, shot), name="live-demo.console"),
        ]
        tasks += [
            spawn(run.write_durations(), name=f"live-demo.durations-{i}", on_death=on_death)
            for i in range(8)
        ]
        await informer.synced.wait()
        await job_informer.synced.wait()
        await elastic_informer.synced.wait()
        tasks.append(spawn(run.submit(), name="live-demo.submit", on_death=on_death, ends=True))
        deadline = time.monotonic() + timeout_s
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
        )
        try:
            with Progress(*columns, transient=False) as progress:
                bar = progress.add_task("jobs done", total=len(jobs), status="")
                while not run.all_done.is_set() and not died.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    run.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await within(run.changed.wait(), min(remaining, 1.0))
                    obs = run.obs
                    progress.update(
                        bar,
                        completed=len(obs.finished),
                        status=f"submitted {len(obs.submitted)}, waiting {obs.waiting}, "
                        f"running {len(obs.bound) - len(obs.finished)}, GPUs "
                        f"{100 * obs.allocated / max(total, 1):.0f}%",
                    )
        finally:
            run.obs.ended = run.now()
            run.obs.problems.extend(run.trainer.problems)
            run.obs.elastic_grew = run.trainer.grew(run.obs.finished)
            await cancel_all(tasks)
        if died.is_set():
            raise AlnairError("a part of the live demo died; see the log lines above")
        await count_unfinished(run, state.services["dispatcher"].url)
        return run.obs


async def count_unfinished(run: Run, dispatcher_url: str) -> None:
    """What the dispatcher says of each job not done when the run ends (its explanation):
    counted by kind, status and reason, so a run that times out says where the rest were."""
    obs = run.obs
    left = [j for j in run.jobs if j not in obs.finished]
    async with httpx.AsyncClient(base_url=dispatcher_url, timeout=10) as http:
        for job in left:
            plural = "elasticjobs" if obs.kind.get(job) == "elastic" else "jobs"
            try:
                doc = (await http.get(f"/v1/{plural}/{obs.team.get(job)}/{job}")).json()
            except (httpx.HTTPError, ValueError):
                doc = {}
            status = str(doc.get("status") or "unknown")
            reason = (doc.get("reason") or {}).get("kind")
            if status == "admitted" and job in obs.bound:
                status = "running"
            key = f"{obs.kind.get(job, '?')} {status}" + (f" ({reason})" if reason else "")
            obs.unfinished[key] = obs.unfinished.get(key, 0) + 1


def queue_lines(obs: Observed) -> list[str]:
    """What the queues did: waits by the dispatcher's reason, each team's share of the GPU
    time against its entitlement (a quarter), the kinds of jobs that finished."""
    for job in list(obs.waiting_since):  # still waiting when the run ended
        obs.wait(job, None, obs.ended)
    waits = (
        ", ".join(
            f"{reason} {seconds:.0f} s ({len(obs.waited[reason])} jobs)"
            for reason, seconds in sorted(obs.waits.items(), key=lambda kv: -kv[1])
        )
        or "none"
    )
    shares = ", ".join(f"{team} {100 * share:.0f}%" for team, share in obs.team_shares().items())
    done = [j for j, (_, phase) in obs.finished.items() if phase == "Succeeded"]
    kinds = {k: sum(1 for j in done if obs.kind.get(j) == k) for k in KINDS}
    held = [f"{job} ({obs.why[job]})" for job in sorted(obs.why) if job not in obs.finished]
    return [
        *([f"problems            {'; '.join(obs.problems)}"] if obs.problems else []),
        *(
            [
                "not done            "
                + ", ".join(f"{n} {k}" for k, n in sorted(obs.unfinished.items()))
            ]
            if obs.unfinished
            else []
        ),
        f"waits by reason     {waits} (demo seconds)",
        *([f"still held          {'; '.join(held)}"] if held else []),
        f"team shares         {shares} of the GPU time (each entitled to 25%)",
        f"jobs by kind        {kinds['training']} training, {kinds['inference']} fractional "
        f"inference (half a GPU), {kinds['elastic']} elastic training done "
        f"({obs.elastic_grew} grew past their minimum)",
    ]


def restarts(state: devstack.State) -> dict[str, int]:
    """How often each service was started again by its supervisor during the run."""
    counts: dict[str, int] = {}
    for name, proc in state.services.items():
        with contextlib.suppress(OSError):
            text = Path(proc.log).read_text(errors="replace")
            counts[name] = sum(1 for line in text.splitlines() if line.startswith(RESTART_MARK))
    return {name: n for name, n in counts.items() if n}


def system_summary(
    state: devstack.State, done: int, wait_s: float = LATE_SAMPLES_S + 30.0
) -> list[str]:
    """What the other services made of the run: execution records (one per finished job,
    given up to `wait_s` to catch up with the last completions, the unsampled ones included),
    the predictor's serving model, and any service that exited and was started again (with
    why, in its log)."""
    again = restarts(state)
    lines = [
        "restarts            "
        + (", ".join(f"{name} {n}x" for name, n in sorted(again.items())) or "none")
        + (f" (see {state.dir}/logs)" if again else "")
    ]
    with httpx.Client(timeout=10) as http:
        agg = state.services["aggregator"]
        deadline = time.monotonic() + wait_s
        while True:
            records = http.get(f"{agg.url}/v1/records", params={"limit": 10000}).json()
            if len(records) >= done or time.monotonic() > deadline:
                break
            time.sleep(1.0)  # an outside view of the aggregator's asynchronous work
        unsampled = sum(1 for rec in records if rec.get("peak_gpu_mem_mib") is None)
        lines.append(
            f"records             {len(records)} execution records for {done} finished jobs "
            f"({unsampled} without usage: they ended between two samples)"
        )
        models = http.get(f"{state.services['predictor'].url}/v1/models").json()
        size = models.get("training_size", {})
        lines.append(
            f"predictor           model v{models.get('version')} ({models.get('kind')}) "
            f"trained on {size.get('records', 0)} records + Gavel's table, retrained "
            f"{int(models.get('version', 1)) - 1} times during the run"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.dev.live_demo")
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="KWOK GPU nodes")
    parser.add_argument("--jobs", type=int, default=None, help="first N trace jobs (all)")
    parser.add_argument("--window-s", type=float, default=150.0, help="arrivals span this long")
    parser.add_argument("--median-runtime-s", type=float, default=40.0)
    parser.add_argument("--max-runtime-s", type=float, default=120.0)
    parser.add_argument("--timeout-s", type=float, default=480.0, help="give up after")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="plot directory")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if os.environ.get(LIVE_ENV, "1") in ("0", "false", "no"):
        print(f"live demo skipped ({LIVE_ENV}=0)")
        return 0
    try:
        specs = parse_node_specs(args.nodes)
        unknown = sorted({s.model for s in specs} - set(GAVEL_TYPE))
        if unknown:
            raise InvalidValueError("--nodes", args.nodes, f"Gavel has no {unknown}")
        total_gpus = sum(s.count * s.gpus for s in specs)
        jobs = load_trace(sorted({GAVEL_TYPE[s.model] for s in specs}), limit=args.jobs)
        comp = compression(jobs, args.window_s, args.median_runtime_s, args.max_runtime_s)
    except AlnairError as exc:
        print(f"live demo: {exc}", file=sys.stderr)
        return 2

    stack_dir = args.out / "live-stack"
    devstack.down(stack_dir)  # a previous run that was interrupted
    shutil.rmtree(stack_dir, ignore_errors=True)
    nodes = sum(s.count for s in specs)
    print(
        f"\nLive: the whole system on a local control plane with {nodes} KWOK GPU nodes "
        f"({args.nodes}; {total_gpus} GPUs), {len(jobs)} jobs of Gavel's Philly trace.\n"
        f"  arrivals compressed {comp.arrival_factor:,.0f}x (into {args.window_s:.0f} s), "
        f"runtimes {comp.runtime_factor:,.0f}x (median {args.median_runtime_s:.0f} s on the "
        f"job's fastest GPU, at most {args.max_runtime_s:.0f} s)",
        flush=True,
    )
    started = time.perf_counter()
    # SIGTERM (and SIGINT where a shell left it ignored) stops the run like Ctrl-C, so the
    # stack below is always stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        state = devstack.up(
            stack_dir,
            devstack.UpOptions(nodes=args.nodes, free_ports=True, only=SERVICES, env=SERVICE_ENV),
        )
        print(f"  stack up in {time.perf_counter() - started:.0f} s (logs in {stack_dir}/logs)")
        obs = asyncio.run(run_workload(state, jobs, comp, args.timeout_s, args.out / "console.png"))
        extra = system_summary(state, len(obs.finished))
    except AlnairError as exc:
        print(f"live demo: {exc}", file=sys.stderr)
        devstack.down(stack_dir)
        return 1
    except BaseException:
        devstack.down(stack_dir)
        raise
    devstack.down(stack_dir)

    r = report(obs)
    chart = plot(
        obs,
        args.out / "live-gpu-allocation.png",
        f"Live: {len(jobs)} Gavel jobs on {nodes} KWOK nodes ({total_gpus} GPUs)",
    )
    lines = [
        f"jobs done           {r.done} of {r.jobs} ({r.failed} failed)",
        f"job completion time mean {r.mean_jct_s:.1f} s, median {r.median_jct_s:.1f} s "
        "(submission to success, demo seconds)",
        f"scheduling latency  pod creation to bind: p50 {r.latency_p50_ms:.0f} ms, "
        f"p99 {r.latency_p99_ms:.0f} ms, max {r.latency_max_ms:.0f} ms ("
        + ", ".join(f"{k} {a:.0f}/{b:.0f}" for k, (a, b) in latency_by_kind(obs).items())
        + " ms p50/p99)",
        f"GPUs allocated      mean {r.mean_util_pct:.0f}%, peak {r.peak_util_pct:.0f}% "
        f"over {r.makespan_s:.0f} s",
        *queue_lines(obs),
        *extra,
        f"plot                {chart}",
        f"console             {obs.console}",
        f"live part took {time.perf_counter() - started:.0f} s",
    ]
    print("\n" + "\n".join(f"  {line}" for line in lines), flush=True)
    # Every job is accounted for: done, or still held by the dispatcher with its reason (a
    # job it predicts would run out of memory on every GPU here is not admitted, by design).
    held = sum(1 for job in obs.why if job not in obs.finished)
    return 0 if r.failed == 0 and r.done + held == r.jobs and not obs.problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
