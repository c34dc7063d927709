"""Where a job should run among several clusters: predicted completion, and the snapshot for it.

A job's predicted completion on worker cluster C and GPU type T is

    queue wait on C/T  +  transfer of what C lacks  +  predicted runtime on T

- *queue wait*: when `gpus` GPUs of T are predicted free on C, from the free GPUs now and the
  predicted ends of the jobs holding the rest (the same release model the `alnair` queueing
  policy uses for reservations);
- *transfer*: the image, model and data the job names (`Artifact`, sizes in MB) over C's link
  bandwidth, minus what C already holds (it ran a job with the same image or dataset before);
- *runtime*: the predictor's estimate for T at the job's GPU count.

The hub does not apply this as a separate filter-and-score step after its queue: it turns every
(cluster, GPU type) into one capacity key `<cluster>/<type>` of a `QueueSnapshot`, with the job's
runtime on that key being transfer + runtime (`hub_snapshot`). Then any queueing policy orders
the jobs, keeps quotas and fair share (quota is per GPU type, across clusters: see
`queueing.model.gpu_type_of`) and picks the key; `alnair` picks the key with the lowest
predicted completion and waits for a busy cluster when its wait + transfer + runtime beats the
free ones by its `patience` margin. Transfer counts as time the job holds its GPUs, which is what
happens: the pods are placed, then pull the image and the data. `score` gives the same numbers
per cluster for explanations and tests; `unplaceable` says when no cluster could ever hold a job.

Everything here is pure (no I/O, no clock): the live hub and the multi-cluster simulator share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from alnair.common.errors import InvalidValueError
from alnair.scheduler.queueing.model import (
    ClusterQueueSpec,
    GpuPool,
    JobSpec,
    QueueSnapshot,
    RunningJob,
    RuntimeEstimate,
)

SEP = "/"
INF = math.inf


def pool_key(cluster: str, gpu_type: str) -> str:
    """The capacity key of GPU type `gpu_type` on `cluster`."""
    if not cluster or SEP in cluster:
        raise InvalidValueError("cluster", cluster, f"a cluster name must be non-empty, no {SEP!r}")
    return f"{cluster}{SEP}{gpu_type}"


def split_key(key: str) -> tuple[str, str]:
    """(cluster, GPU type) of a capacity key made by `pool_key`."""
    cluster, sep, gpu_type = key.partition(SEP)
    if not sep or not cluster or not gpu_type:
        raise InvalidValueError("key", key, f"expected <cluster>{SEP}<gpu type>")
    return cluster, gpu_type


@dataclass(frozen=True, slots=True)
class Artifact:
    """Something a job needs on the cluster before it computes: an image, a model, a dataset."""

    name: str
    """Identity: equal names are the same bytes (an image reference, a dataset name)."""
    size_mb: float

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidValueError("name", self.name, "an artifact needs a name")
        if not (self.size_mb >= 0 and math.isfinite(self.size_mb)):
            raise InvalidValueError("size_mb", self.size_mb, f"{self.name}: must be >= 0, finite")


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker cluster as the hub sees it now."""

    name: str
    bandwidth_mbps: float
    """Link bandwidth from where the jobs' data lives to this cluster, megabits per second."""
    pools: Mapping[str, GpuPool]
    """GPUs by type (the node label value)."""
    releases: Mapping[str, Sequence[tuple[float, int]]] = field(default_factory=dict)
    """Per GPU type: (predicted end, GPUs) of the jobs holding GPUs there (inf: unknown)."""
    artifacts: frozenset[str] = frozenset()
    """Artifact names the cluster already holds."""
    region: str = ""
    reachable: bool = True

    def __post_init__(self) -> None:
        if not (self.bandwidth_mbps > 0 and math.isfinite(self.bandwidth_mbps)):
            raise InvalidValueError(
                "bandwidth_mbps", self.bandwidth_mbps, f"cluster {self.name}: must be > 0, finite"
            )


@dataclass(frozen=True, slots=True)
class Transfer:
    seconds: float
    megabytes: float
    missing: tuple[str, ...]


def transfer(artifacts: Iterable[Artifact], view: WorkerView) -> Transfer:
    """What moving the job's artifacts to `view` costs: the ones it lacks, over its link."""
    missing: dict[str, float] = {}
    for artifact in artifacts:
        if artifact.name not in view.artifacts:
            missing[artifact.name] = max(missing.get(artifact.name, 0.0), artifact.size_mb)
    megabytes = sum(missing.values())
    return Transfer(megabytes * 8.0 / view.bandwidth_mbps, megabytes, tuple(sorted(missing)))


def earliest_start_s(
    now_s: float, free: int, releases: Sequence[tuple[float, int]], gpus: int
) -> float:
    """When `gpus` GPUs are predicted free, given `free` now and predicted (end, GPUs) releases."""
    if free >= gpus:
        return now_s
    for end_s, count in sorted(releases):
        free += count
        if free >= gpus:
            return max(now_s, end_s)
    return INF


def _fits(job: JobSpec, pool: GpuPool) -> bool:
    return pool.total >= job.gpus and (
        job.peak_memory_mib is None or job.peak_memory_mib <= pool.memory_mib
    )


@dataclass(frozen=True, slots=True)
class ClusterOption:
    """One (cluster, GPU type) a job could run on, with its predicted completion."""

    cluster: str
    gpu_type: str
    wait_s: float
    transfer_s: float
    transfer_mb: float
    runtime_s: float
    """inf when the predictor gave no runtime for this type."""

    @property
    def key(self) -> str:
        return pool_key(self.cluster, self.gpu_type)

    @property
    def completion_s(self) -> float:
        """Predicted time from now until the job ends there."""
        return self.wait_s + self.transfer_s + self.runtime_s


def score(
    job: JobSpec,
    artifacts: Sequence[Artifact],
    views: Iterable[WorkerView],
    now_s: float,
) -> list[ClusterOption]:
    """Every reachable (cluster, GPU type) that could hold `job`, best predicted completion
    first (ties: less to transfer, then cluster name). `job.runtime` is keyed by GPU type."""
    options: list[ClusterOption] = []
    for view in views:
        if not view.reachable or not _may_use(job, view):
            continue
        cost = transfer(artifacts, view)
        for gpu_type in job.allowed_types(list(view.pools)):
            pool = view.pools[gpu_type]
            if not _fits(job, pool):
                continue
            start = earliest_start_s(now_s, pool.free, view.releases.get(gpu_type, ()), job.gpus)
            estimate = job.runtime.get(gpu_type)
            options.append(
                ClusterOption(
                    cluster=view.name,
                    gpu_type=gpu_type,
                    wait_s=start - now_s,
                    transfer_s=cost.seconds,
                    transfer_mb=cost.megabytes,
                    runtime_s=estimate.expected_s if estimate is not None else INF,
                )
            )
    options.sort(key=lambda o: (o.completion_s, o.transfer_mb, o.cluster, o.gpu_type))
    return options


def _may_use(job: JobSpec, view: WorkerView) -> bool:
    """Whether the job may run on the view's cluster (`JobSpec.clusters`)."""
    return job.clusters is None or view.name in job.clusters


def unplaceable(job: JobSpec, views: Iterable[WorkerView]) -> str | None:
    """Why no cluster, reachable or not, could ever hold `job` (None when one could): too many
    GPUs of one type, or a predicted peak above every GPU type's memory."""
    views = [v for v in views if _may_use(job, v)]
    largest: dict[str, int] = {}
    for view in views:
        for gpu_type in job.allowed_types(list(view.pools)):
            pool = view.pools[gpu_type]
            if _fits(job, pool):
                return None
            largest[f"{view.name}/{gpu_type}"] = pool.total
    if not views:
        if job.clusters is not None:
            return "no worker cluster serves its kind"
        return "no worker cluster is registered"
    if not largest:
        wanted = job.gpu_model or "any"
        return f"no worker cluster has {wanted} GPUs"
    best = max(largest.items(), key=lambda kv: kv[1])
    if job.gpus > best[1]:
        return (
            f"asks for {job.gpus} GPUs of one type; the largest pool of any cluster is "
            f"{best[1]} ({best[0]})"
        )
    return f"predicted peak {job.peak_memory_mib:.0f} MiB per GPU exceeds every GPU type's memory"


def hub_job(job: JobSpec, artifacts: Sequence[Artifact], views: Iterable[WorkerView]) -> JobSpec:
    """`job` as the hub's queue sees it: runtime per capacity key, transfer included."""
    runtime: dict[str, RuntimeEstimate] = {}
    for view in views:
        if not view.reachable:
            continue
        moved = transfer(artifacts, view).seconds
        for gpu_type, estimate in job.runtime.items():
            if gpu_type in view.pools:
                runtime[pool_key(view.name, gpu_type)] = RuntimeEstimate(
                    estimate.expected_s + moved, estimate.upper_s + moved
                )
    return replace(job, runtime=runtime)


def hub_snapshot(
    now_s: float,
    pending: Sequence[tuple[JobSpec, Sequence[Artifact]]],
    running: Sequence[RunningJob],
    queues: Mapping[str, ClusterQueueSpec],
    views: Sequence[WorkerView],
) -> QueueSnapshot:
    """One `QueueSnapshot` over every reachable cluster's GPUs.

    `pending` jobs carry runtimes keyed by GPU type, with their artifacts; `running` jobs are
    already keyed by `<cluster>/<type>` (the key they were admitted on) and all count against
    their queue's quota, those on unreachable clusters too. Views' pools give the free GPUs.
    Unreachable clusters contribute no capacity: nothing new goes there.
    """
    capacity: dict[str, GpuPool] = {}
    for view in views:
        if not view.reachable:
            continue
        for gpu_type, pool in view.pools.items():
            capacity[pool_key(view.name, gpu_type)] = pool
    specs = [hub_job(job, artifacts, views) for job, artifacts in pending]
    return QueueSnapshot(
        now_s=now_s,
        pending=specs,
        running=list(running),
        queues=queues,
        capacity=capacity,
    )
