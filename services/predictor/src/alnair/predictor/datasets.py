"""Training data: Gavel's measured throughputs and the execution records the profiler writes.

Both sources become the same two shapes: `Observation` (one job alone on `gpu_count` GPUs of one
type, its throughput in steps/s) and `ColocObservation` (two jobs sharing one GPU, each one's
throughput next to its throughput alone).

Gavel (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads", OSDI 2020; MIT licence, github.com/stanford-futuredata/gavel) measured 26 job types
on K80, P100 and V100 with 1-8 GPUs, alone and in pairs. The consolidated (one-node) part ships
once for every service in `alnair.common.data` (`gavel/throughputs.csv`), made from Gavel's
`throughputs.json` by `convert_gavel_json`. In that file a zero throughput means the pair was not
measured or did not fit;
zero rows are dropped here rather than read as "infinitely slow".

Execution records are the profiler's, in the format of `alnair.common.records` (Redis hashes
indexed by end time); `parse_record` turns one into an observation or says why it cannot.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from alnair.common.data import GavelRow, gavel_throughputs, read_gavel_csv
from alnair.predictor.catalog import default_batch_size, normalize_model_name
from alnair.predictor.gpus import canonical_gpu

SUCCESS_OUTCOMES = frozenset({"succeeded", "completed", "success", "ok"})

_GAVEL_GPUS = ("k80", "p100", "v100")
_BATCH = re.compile(r"^(?P<name>.+?)\s*\(batch size (?P<batch>\d+)\)$")


class JobKey(NamedTuple):
    """What identifies a job type for learning: its model and its per-step batch size.

    A named tuple rather than a dataclass: models hash and compare these keys hundreds of
    thousands of times per fit, and tuple hashing runs in C.
    """

    model_name: str
    batch_size: int

    def __str__(self) -> str:
        return f"{self.model_name}@{self.batch_size}"


@dataclass(frozen=True, slots=True)
class Observation:
    """A job measured alone: `throughput` steps/s on `gpu_count` GPUs of `gpu_type`."""

    job: JobKey
    gpu_type: str
    gpu_count: int
    throughput: float
    source: str = "gavel"
    peak_gpu_mem_mib: float | None = None


@dataclass(frozen=True, slots=True)
class ColocObservation:
    """`job` sharing each of its GPUs with `partner`: its throughput then and alone."""

    job: JobKey
    partner: JobKey
    gpu_type: str
    gpu_count: int
    throughput: float
    alone_throughput: float

    @property
    def fraction(self) -> float:
        """Share of its alone throughput the job keeps when co-located."""
        return self.throughput / self.alone_throughput


@dataclass(frozen=True, slots=True)
class TrainingData:
    """Everything a model is trained on."""

    alone: tuple[Observation, ...]
    colocated: tuple[ColocObservation, ...]

    def with_records(self, records: Iterable[Observation]) -> TrainingData:
        return TrainingData(self.alone + tuple(records), self.colocated)


def gavel_job_key(job_type: str) -> JobKey:
    """Gavel's job-type string ("ResNet-18 (batch size 16)", "A3C") as a JobKey.

    A3C and CycleGAN carry no batch size in Gavel; both run one sample per step there
    (`default_batch_size`).
    """
    match = _BATCH.match(job_type.strip())
    if match is None:
        return JobKey(normalize_model_name(job_type), default_batch_size(job_type))
    return JobKey(normalize_model_name(match.group("name")), int(match.group("batch")))


def convert_gavel_json(text: str) -> str:
    """Gavel's throughputs.json as the packaged CSV (consolidated placements only)."""
    raw = json.loads(text)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["gpu", "job", "scale", "partner", "partner_scale", "own", "partner_own"])
    for gpu in _GAVEL_GPUS:
        for key, entries in raw[gpu].items():
            job, scale = ast.literal_eval(key)
            for other, value in entries.items():
                if other == "null":
                    writer.writerow([gpu, job, scale, "", "", value, ""])
                else:
                    partner, partner_scale = ast.literal_eval(other)
                    writer.writerow([gpu, job, scale, partner, partner_scale, *value])
    return out.getvalue()


def _read_gavel_rows(rows: Iterable[GavelRow]) -> TrainingData:
    alone: dict[tuple[JobKey, str, int], float] = {}
    pairs: list[tuple[JobKey, JobKey, str, int, float]] = []
    for row in rows:
        gpu = canonical_gpu(row.gpu)
        if gpu is None:
            continue
        job, scale, own = gavel_job_key(row.job), row.scale, row.own
        if not row.partner:
            if own > 0:
                alone[(job, gpu, scale)] = own
        elif own > 0 and (row.partner_own or 0.0) > 0:
            pairs.append((job, gavel_job_key(row.partner), gpu, scale, own))
    colocated = tuple(
        ColocObservation(job, partner, gpu, scale, own, alone[(job, gpu, scale)])
        for job, partner, gpu, scale, own in pairs
        if (job, gpu, scale) in alone
    )
    observations = tuple(
        Observation(job, gpu, scale, value) for (job, gpu, scale), value in alone.items()
    )
    return TrainingData(observations, colocated)


def load_gavel(path: Path | None = None) -> TrainingData:
    """The shipped Gavel measurements, or Gavel's own throughputs.json (or a CSV of the shipped
    layout) at `path`."""
    if path is None:
        return _read_gavel_rows(gavel_throughputs())
    content = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        content = convert_gavel_json(content)
    return _read_gavel_rows(read_gavel_csv(content))


@dataclass(frozen=True, slots=True)
class RecordProblem:
    """Why an execution record cannot be learned from."""

    key: str
    field: str
    reason: str


def steps_of(epoch: int | None, data_size: int | None, batch_size: int) -> int | None:
    """Total steps of a job from epochs and data size (samples): one step is one batch."""
    if epoch is None or data_size is None:
        return None
    return epoch * math.ceil(data_size / batch_size)


def _number(fields: Mapping[str, str], name: str) -> float | None:
    value = fields.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(name) from None
    if not math.isfinite(number):
        raise ValueError(name)
    return number


def parse_record(key: str, fields: Mapping[str, str]) -> Observation | RecordProblem:
    """An execution record (string fields, as Redis returns them) as an Observation."""
    outcome = fields.get("outcome", "")
    if outcome.lower() not in SUCCESS_OUTCOMES:
        return RecordProblem(key, "outcome", f"outcome {outcome!r} is not a success")
    model = fields.get("model_name", "")
    if not model:
        return RecordProblem(key, "model_name", "missing")
    gpu = canonical_gpu(fields.get("gpu_model", ""))
    if gpu is None:
        return RecordProblem(key, "gpu_model", f"unknown GPU {fields.get('gpu_model')!r}")
    try:
        batch = _number(fields, "batch_size")
        count = _number(fields, "gpu_count")
        duration = _number(fields, "duration_s")
        steps = _number(fields, "steps")
        throughput = _number(fields, "throughput_steps_per_s")
        epoch = _number(fields, "epoch")
        data_size = _number(fields, "data_size")
        peak = _number(fields, "peak_gpu_mem_mib")
    except ValueError as error:
        name = str(error)
        return RecordProblem(key, name, f"{fields.get(name)!r} is not a finite number")
    if batch is None:
        batch = float(default_batch_size(model))  # as a request that states none is read
    if batch < 1:
        return RecordProblem(key, "batch_size", f"must be a positive integer, got {batch!r}")
    if count is None or count < 1:
        return RecordProblem(key, "gpu_count", f"must be a positive integer, got {count!r}")
    if throughput is None:
        if steps is None:
            total = steps_of(
                None if epoch is None else int(epoch),
                None if data_size is None else int(data_size),
                int(batch),
            )
            steps = None if total is None else float(total)
        if steps is None or duration is None or duration <= 0:
            return RecordProblem(
                key, "throughput_steps_per_s", "absent and not derivable from steps/duration_s"
            )
        throughput = steps / duration
    if throughput <= 0:
        return RecordProblem(key, "throughput_steps_per_s", f"must be > 0, got {throughput}")
    job = JobKey(normalize_model_name(model), int(batch))
    return Observation(job, gpu, int(count), throughput, source="record", peak_gpu_mem_mib=peak)
