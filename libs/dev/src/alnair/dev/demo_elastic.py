"""The live demo's elastic training jobs: their ElasticJob, and the trainer's part the demo
plays for them.

An elastic job of the trace runs between half its GPU count and twice it (one GPU per worker,
at least one and at least two), queued like the batch Jobs: the dispatcher admits it at its
minimum, the elastic controller grows it onto free GPUs and shrinks it when the scheduler takes
workers back. Nothing in a KWOK pod trains, so the demo stands in for the training process:
it integrates the job's progress over the workers it holds (Gavel's runtime at the trace's GPU
count, compressed, scaled linearly with the workers, which is the optimistic end of data
parallelism) and, when the steps are done, writes `status.phase: Succeeded` on the ElasticJob
as a trainer's completion hook does. The controller then removes the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from alnair.common import resources as res
from alnair.common.errors import TemporaryError
from alnair.common.kube import ELASTICJOBS, ApiError, KubeClient, Obj
from alnair.common.tasks import in_flight, within
from alnair.elastic.sizing import holds_gpus

COOLDOWN_S = 5
"""Seconds between two resizes of one job: the demo's runtimes are tens of seconds, the
controller's default (60 s) would never let a job grow."""


def elastic_sizes(gpus: int) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of one-GPU workers for a trace job of `gpus` GPUs."""
    return max(1, gpus // 2), max(2, 2 * gpus)


def elastic_manifest(
    name: str,
    namespace: str,
    gpus: int,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    pod_labels: Mapping[str, str],
    pod_annotations: Mapping[str, str],
) -> Obj:
    """An ElasticJob as a user writes one for a queue (its labels name it; the dispatcher's
    webhook holds it)."""
    low, high = elastic_sizes(gpus)
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(annotations),
        },
        "spec": {
            "minReplicas": low,
            "maxReplicas": high,
            "gpusPerWorker": 1,
            "scaleCooldownSeconds": COOLDOWN_S,
            "template": {
                "metadata": {"labels": dict(pod_labels), "annotations": dict(pod_annotations)},
                "spec": {
                    "schedulerName": res.SCHEDULER_NAME,
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.invalid/gavel-job:1",
                            "resources": {
                                "limits": {res.GPU: "1"},
                                "requests": {"cpu": "2", "memory": "8Gi"},
                            },
                        }
                    ],
                },
            },
        },
    }


@dataclass
class Progress:
    """One elastic job's training progress: the fraction of its steps done, integrated over
    the workers it held."""

    gpus: int
    """The trace's GPU count: `runtime_s` is measured there."""
    runtime_s: float | None = None
    """Seconds at `gpus` workers on the GPU type it runs on (known once a worker is bound)."""
    done: float = 0.0
    since: float = 0.0
    workers: set[str] = field(default_factory=set)
    peak: int = 0
    """The most workers it held at once."""
    completing: bool = False

    def rate(self) -> float:
        """Fraction of the steps per second now."""
        if not self.runtime_s or not self.workers:
            return 0.0
        return len(self.workers) / self.gpus / self.runtime_s

    def advance(self, now: float) -> None:
        self.done = min(1.0, self.done + self.rate() * max(0.0, now - self.since))
        self.since = now

    def finishes_at(self) -> float | None:
        """When the steps are done at the current size (None: it is not running)."""
        rate = self.rate()
        return self.since + (1.0 - self.done) / rate if rate > 0 else None


def holds_gpu(pod: Obj, deleted: bool) -> bool:
    """A worker trains from its binding until it ends or is being deleted (the controller's
    sizing counts a terminating pod's GPUs as taken; the trainer stops counting its work)."""
    if deleted or pod["metadata"].get("deletionTimestamp"):
        return False
    return holds_gpus(pod)


class ElasticTrainer:
    """Plays the training process of every elastic job: follows its workers, completes it
    when its steps are done. `clock` is the demo's clock; `runtime` gives a job's compressed
    runtime at its trace GPU count on a node's GPU model (None: it cannot run there)."""

    def __init__(
        self,
        kube: KubeClient,
        clock: Callable[[], float],
        runtime: Callable[[str, str], float | None],
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.runtime = runtime
        self.jobs: dict[str, tuple[str, Progress]] = {}
        """Job name -> (namespace, its progress)."""
        self.changed = asyncio.Event()
        self.problems: list[str] = []
        self.retries = 0
        """Completions written again after the API server did not answer."""
        self._later: set[asyncio.Task[None]] = set()

    def add(self, name: str, namespace: str, gpus: int) -> None:
        self.jobs[name] = (namespace, Progress(gpus))

    def __contains__(self, name: object) -> bool:
        return name in self.jobs

    def grew(self, jobs: Iterable[str]) -> int:
        """How many of `jobs` ran above their minimum size at some point."""
        return sum(
            1
            for job in jobs
            if job in self.jobs
            and self.jobs[job][1].peak > elastic_sizes(self.jobs[job][1].gpus)[0]
        )

    def on_worker(self, job: str, pod: Obj, model: str, deleted: bool) -> int:
        """A worker pod of `job` changed; returns the GPUs the job holds now."""
        progress = self.jobs[job][1]
        now = self.clock()
        progress.advance(now)
        name = pod["metadata"]["name"]
        if holds_gpu(pod, deleted):
            progress.workers.add(name)
            progress.peak = max(progress.peak, len(progress.workers))
            if progress.runtime_s is None:
                progress.runtime_s = self.runtime(job, model)
        else:
            progress.workers.discard(name)
        self.changed.set()
        return len(progress.workers)

    async def run(self) -> None:
        """Complete each job when its steps are done; woken by every change of workers."""
        while True:
            now = self.clock()
            due: list[str] = []
            soonest: float | None = None
            for job, (_, progress) in self.jobs.items():
                at = progress.finishes_at()
                if progress.completing or at is None:
                    continue
                if at <= now:
                    due.append(job)
                elif soonest is None or at < soonest:
                    soonest = at
            for job in due:
                await self._complete(job)
            self.changed.clear()
            timeout = None if soonest is None else max(0.05, soonest - self.clock())
            with contextlib.suppress(TimeoutError):
                await within(self.changed.wait(), timeout)

    async def _complete(self, job: str) -> None:
        namespace, progress = self.jobs[job]
        progress.completing = True
        try:
            await self.kube.patch(
                ELASTICJOBS, job, {"status": {"phase": "Succeeded"}}, namespace, sub="status"
            )
        except TemporaryError as exc:
            # The API server is away (a restart): a trainer's hook tries again.
            self.retries += 1
            in_flight(self._again(job, exc), name=f"elastic-trainer.{job}", into=self._later)
        except ApiError as exc:
            self.problems.append(f"{namespace}/{job}: completion not written: {exc}")

    async def _again(self, job: str, _why: Exception) -> None:
        await asyncio.sleep(1.0)
        self.jobs[job][1].completing = False
        self.changed.set()


__all__ = ["COOLDOWN_S", "ElasticTrainer", "Progress", "elastic_manifest", "elastic_sizes"]
