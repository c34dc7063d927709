"""The job simulator's input: Gavel's Philly-derived arrivals, runtimes, memory, teams, predictions.

Each trace line is one job (Gavel's 2019 seven-column layout, the one the shipped trace uses:
`job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor`).
Its true runtime on a GPU type is `total_steps / throughput(job_type, scale_factor, type)` from
Gavel's measured table (the job alone on its GPUs), as Gavel's own simulator computes it.

Gavel records no GPU memory, so a job's true peak is taken from `PEAK_MEMORY_GIB` below: one
figure per model and batch size, typical PyTorch FP32 training peaks for those models (rounded
estimates, not measurements). It agrees with Gavel's table where that table says anything about
memory: the one configuration Gavel could not run on a K80 (throughput 0: ResNet-50 at batch
size 128) is the one above a K80 device's 12 GiB. Transformer at batch size 256 sits just
below it (11 GiB): with predicted memory, the upper bound usually keeps it off K80s.

Jobs are split over teams by a seeded draw with shares `TEAM_SHARES` (unequal on purpose, so that
some teams borrow what others lend). Predictions are either the oracle (true runtime, no
interval) or a noisy predictor: lognormal error with sigma `RUNTIME_SIGMA` (about 13% mean
absolute percentage error, the spread of the project's predictor on held-out jobs) and an upper
bound at the 90% quantile of that error; peak memory predicted with sigma `MEMORY_SIGMA` (the
point prediction is what admission checks: an upper bound would put ResNet-50 at batch size 128,
14.5 GiB, above a V100's 16 GiB half the time and leave it waiting for a GPU that never comes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from alnair.common.data import GAVEL_ARRIVALS, data_file, gavel_throughputs
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.scheduler.queueing.model import ClusterQueueSpec, FlavorQuota, RuntimeEstimate

GIB = 1024.0
GPU_MEMORY_MIB: Mapping[str, float] = {"k80": 12 * GIB, "p100": 16 * GIB, "v100": 16 * GIB}
"""Memory of one device (a K80 board holds two 12 GiB devices; Gavel counts devices)."""

PEAK_MEMORY_GIB: Mapping[str, float] = {
    "A3C": 1.0,
    "CycleGAN": 6.5,
    "LM (batch size 5)": 1.5,
    "LM (batch size 10)": 2.0,
    "LM (batch size 20)": 3.0,
    "LM (batch size 40)": 5.0,
    "LM (batch size 80)": 9.0,
    "Recommendation (batch size 512)": 1.5,
    "Recommendation (batch size 1024)": 2.0,
    "Recommendation (batch size 2048)": 3.0,
    "Recommendation (batch size 4096)": 5.0,
    "Recommendation (batch size 8192)": 9.0,
    "ResNet-18 (batch size 16)": 1.2,
    "ResNet-18 (batch size 32)": 1.5,
    "ResNet-18 (batch size 64)": 2.1,
    "ResNet-18 (batch size 128)": 3.2,
    "ResNet-18 (batch size 256)": 5.4,
    "ResNet-50 (batch size 16)": 3.5,
    "ResNet-50 (batch size 32)": 5.5,
    "ResNet-50 (batch size 64)": 9.0,
    "ResNet-50 (batch size 128)": 14.5,
    "Transformer (batch size 16)": 2.5,
    "Transformer (batch size 32)": 3.5,
    "Transformer (batch size 64)": 6.0,
    "Transformer (batch size 128)": 10.5,
    "Transformer (batch size 256)": 11.0,
}
"""True peak GPU memory per device, GiB (estimates; see the module docstring)."""

TEAMS = ("team-a", "team-b", "team-c", "team-d")
TEAM_SHARES = (0.4, 0.3, 0.2, 0.1)
RUNTIME_SIGMA = 0.163
"""Lognormal sigma whose mean absolute percentage error is about 13%."""
RUNTIME_UPPER_Z = 1.2816
"""Upper bound of the runtime interval: the 90% quantile of the error."""
MEMORY_SIGMA = 0.03
"""Peak memory of a known model and batch size is nearly deterministic; 3% keeps the one
configuration near a 16 GiB device (14.5 GiB) predicted below it, as a predictor with a
measurement of that model would."""
RESTART_COST_S = 120.0
"""Work lost when a job is preempted: reload the last checkpoint and warm up."""

Predictions = Literal["oracle", "predicted"]


@dataclass(frozen=True, slots=True)
class SimJob:
    """One trace job with its truth and what the scheduler is told."""

    id: str
    job_type: str
    gpus: int
    arrival_s: float
    team: str
    true_runtime_s: Mapping[str, float]
    predicted: Mapping[str, RuntimeEstimate]
    true_peak_mib: float
    predicted_peak_mib: float


@dataclass(frozen=True, slots=True)
class Cluster:
    """GPUs per type (device memory from `GPU_MEMORY_MIB`)."""

    name: str
    gpus: Mapping[str, int]

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """`k80=32,p100=32,v100=32` (or Gavel's `v100:p100:k80` form, `32:32:32`)."""
        gpus: dict[str, int] = {}
        try:
            if "=" in text:
                for part in text.split(","):
                    name, number = part.split("=")
                    gpus[name.strip().lower()] = int(number)
            else:
                for name, number in zip(("v100", "p100", "k80"), text.split(":"), strict=True):
                    gpus[name] = int(number)
        except ValueError:
            raise InvalidValueError(
                "cluster", text, "expected k80=N,p100=N,v100=N or V100:P100:K80"
            ) from None
        for name, count in gpus.items():
            if name not in GPU_MEMORY_MIB:
                raise InvalidValueError(
                    "cluster", name, f"unknown GPU type ({list(GPU_MEMORY_MIB)})"
                )
            if count < 0:
                raise InvalidValueError("cluster", count, f"{name}: must be >= 0")
        ordered = {t: gpus[t] for t in ("k80", "p100", "v100") if gpus.get(t)}
        return cls(text, ordered)

    @property
    def total(self) -> int:
        return sum(self.gpus.values())


def team_queues(
    cluster: Cluster, teams: Sequence[str] = TEAMS, *, cohort: str | None = "all"
) -> dict[str, ClusterQueueSpec]:
    """One cluster queue per team, nominal quota an equal split of each GPU type (the
    remainder to the first teams), all in one cohort with no borrowing or lending limit."""
    queues: dict[str, ClusterQueueSpec] = {}
    for index, team in enumerate(teams):
        quota = {}
        for gpu_type, count in cluster.gpus.items():
            share = count // len(teams) + (1 if index < count % len(teams) else 0)
            quota[gpu_type] = FlavorQuota(share)
        queues[team] = ClusterQueueSpec(team, quota, cohort=cohort)
    return queues


def throughput_table() -> dict[tuple[str, int, str], float]:
    """(job type, GPUs, GPU type) -> steps/s of the job alone."""
    table: dict[tuple[str, int, str], float] = {}
    for row in gavel_throughputs():
        if not row.partner and row.own > 0:
            table[(row.job, row.scale, row.gpu.lower())] = row.own
    return table


def job_throughput(
    table: Mapping[tuple[str, int, str], float], job_type: str, gpus: int, gpu_type: str
) -> float | None:
    """Steps/s of `job_type` on `gpus` GPUs of `gpu_type`. Gavel measured A3C, CycleGAN and
    Recommendation on one GPU only, yet the trace asks 2-8 GPUs for some of them: those are
    scaled linearly from one GPU (ideal data parallelism), in our simulator and in the
    throughput file `bench/gavel_reference.py` gives Gavel, so both see the same runtimes."""
    measured = table.get((job_type, gpus, gpu_type))
    if measured is not None:
        return measured
    single = table.get((job_type, 1, gpu_type))
    return single * gpus if single is not None else None


def load_jobs(
    cluster: Cluster,
    *,
    predictions: Predictions = "oracle",
    seed: int = 0,
    trace: Path | None = None,
    teams: Sequence[str] = TEAMS,
    shares: Sequence[float] = TEAM_SHARES,
    limit: int | None = None,
    noise_seed: int | None = None,
) -> list[SimJob]:
    """The trace's jobs, with runtimes on the cluster's GPU types and predictions.

    `seed` draws the team split and, unless `noise_seed` is given, the prediction errors:
    `noise_seed` varies the errors alone over the same teams (the benchmark's repeats).
    """
    if len(teams) != len(shares):
        raise InvalidValueError("shares", list(shares), f"one share per team ({len(teams)})")
    path = trace if trace is not None else data_file(*GAVEL_ARRIVALS)
    table = throughput_table()
    team_rng = random.Random(seed)
    noise_rng = random.Random(seed + 1 if noise_seed is None else noise_seed)
    jobs: list[SimJob] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 7:
            raise ConfigError(
                f"{path}:{number}: expected 7 tab-separated fields, got {len(fields)}",
                line=number,
            )
        job_type, total_steps, arrival_s, scale = (
            fields[0],
            int(fields[4]),
            float(fields[5]),
            int(fields[6]),
        )
        if job_type not in PEAK_MEMORY_GIB:
            raise ConfigError(f"{path}:{number}: no peak memory for job type {job_type!r}")
        true_runtime = {
            t: total_steps / throughput
            for t in cluster.gpus
            if (throughput := job_throughput(table, job_type, scale, t)) is not None
        }
        if not true_runtime:
            raise ConfigError(f"{path}:{number}: no throughput for {job_type} x{scale}")
        team = team_rng.choices(list(teams), weights=list(shares))[0]
        predicted: dict[str, RuntimeEstimate] = {}
        for gpu_type, runtime_s in true_runtime.items():
            if predictions == "oracle":
                predicted[gpu_type] = RuntimeEstimate.exact(runtime_s)
            else:
                guess = runtime_s * math.exp(noise_rng.gauss(0.0, RUNTIME_SIGMA))
                predicted[gpu_type] = RuntimeEstimate(
                    guess, guess * math.exp(RUNTIME_UPPER_Z * RUNTIME_SIGMA)
                )
        true_peak = PEAK_MEMORY_GIB[job_type] * GIB
        if predictions == "oracle":
            predicted_peak = true_peak
        else:
            predicted_peak = true_peak * math.exp(noise_rng.gauss(0.0, MEMORY_SIGMA))
        jobs.append(
            SimJob(
                id=f"job-{number:05d}",
                job_type=job_type,
                gpus=scale,
                arrival_s=arrival_s,
                team=team,
                true_runtime_s=true_runtime,
                predicted=predicted,
                true_peak_mib=true_peak,
                predicted_peak_mib=predicted_peak,
            )
        )
        if limit is not None and len(jobs) >= limit:
            break
    return jobs
