"""Every event Alnair publishes, as versioned pydantic models in a CloudEvents 1.0 envelope.

Events are the only way services talk besides HTTP queries. Each model names its CloudEvents
`type` (with a version suffix: a breaking change is a new type, old consumers keep working) and
derives its NATS subject from its own fields, so publishers can never send an event to the wrong
subject. `python -m alnair.common.events schema --out DIR` writes one JSON Schema per event type
(the envelope with that data) for subscribers written in other languages.

| event | subject | transport |
|---|---|---|
| PodMetric | alnair.metrics.pod.<node> | core NATS (1 Hz samples: loss of one is harmless) |
| PodSummary | alnair.summaries.pod.<node> | JetStream stream SUMMARIES (a pod's whole run, once) |
| GpuInventory | KV bucket gpu-inventory, key <node> | JetStream KV |
| GpuHealthChanged | alnair.health.<node>.<gpu> | JetStream stream HEALTH |
| JobEvent | alnair.jobs.<cluster>.<ns>.<kind> | JetStream stream JOBS |
| ScaleEvent | alnair.scale.<ns>.<job> | JetStream stream SCALE |
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alnair.common.errors import PermanentError
from alnair.common.progress import Progress

SPEC_VERSION: Literal["1.0"] = "1.0"
_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def subject_token(value: str) -> str:
    """Make `value` safe as one NATS subject token (no dots, spaces or wildcards)."""
    return _TOKEN.sub("_", value) or "_"


def now() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every event payload (the CloudEvents `data`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    TYPE: ClassVar[str]
    STREAM: ClassVar[str | None] = None
    """JetStream stream holding this event, or None for core NATS (fire and forget)."""
    SUBJECT_PREFIX: ClassVar[str]

    def subject(self) -> str:
        raise NotImplementedError

    @classmethod
    def subject_filter(cls) -> str:
        """Wildcard subject matching every event of this type."""
        return f"{cls.SUBJECT_PREFIX}.>"


class PodMetric(Event):
    """One sample of a pod's resource use on one GPU (or with no GPU), published at 1 Hz."""

    TYPE: ClassVar[str] = "io.alnair.metrics.pod.v1"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.metrics.pod"

    node: str
    namespace: str
    pod: str
    pod_uid: str
    gpu_uuid: str | None = None
    gpu_index: int | None = Field(default=None, ge=0)
    gpu_util_pct: float = Field(default=0.0, ge=0, le=100)
    gpu_mem_used_mib: float = Field(default=0.0, ge=0)
    sm_util_pct: float = Field(default=0.0, ge=0, le=100)
    cpu_util_cores: float = Field(default=0.0, ge=0)
    mem_used_mib: float = Field(default=0.0, ge=0)
    io_read_bps: float = Field(default=0.0, ge=0)
    io_write_bps: float = Field(default=0.0, ge=0)
    progress_step: int | None = Field(default=None, ge=0)
    """Training progress the pod reported (`alnair.common.progress`): steps done, steps in
    all, the last checkpoint's step, and where it was read (metric, log, annotation)."""
    progress_total: int | None = Field(default=None, ge=1)
    checkpoint_step: int | None = Field(default=None, ge=0)
    progress_source: Literal["metric", "log", "annotation"] | None = None
    ts: datetime = Field(default_factory=now)

    def subject(self) -> str:
        return f"{self.SUBJECT_PREFIX}.{subject_token(self.node)}"

    def progress(self) -> Progress | None:
        if self.progress_step is None or self.progress_source is None:
            return None
        return Progress(
            self.progress_step, self.progress_total, self.checkpoint_step, self.progress_source
        )

    def with_progress(self, progress: Progress | None) -> PodMetric:
        if progress is None:
            return self
        return self.model_copy(
            update={
                "progress_step": progress.step,
                "progress_total": progress.total,
                "checkpoint_step": progress.checkpoint,
                "progress_source": progress.source,
            }
        )


class SeriesSummary(BaseModel):
    """count, sum and max of one series over a pod's run (enough for mean and peak)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(default=0, ge=0)
    total: float = Field(default=0.0, ge=0)
    max: float = Field(default=0.0, ge=0)


class PodSummary(Event):
    """A pod's whole run as its node agent sampled it, published when the pod ends.

    Samples travel on core NATS and a pod that runs while the bus is away leaves none; the
    agent keeps this running summary of every pod it samples and publishes it durably once
    the pod ends (again, from its on-disk spool, once an unreachable bus returns or after a
    restart). GPU series count one value per (GPU, tick), CPU and memory one per tick, as the
    samples do. The event id is `<pod_uid>.summary`, so a repeat is dropped by the stream or
    the consumer; folding one twice changes nothing either (counts are replaced by the larger,
    maxima by the larger).
    """

    TYPE: ClassVar[str] = "io.alnair.metrics.pod-summary.v1"
    STREAM: ClassVar[str | None] = "SUMMARIES"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.summaries.pod"

    node: str
    namespace: str
    pod: str
    pod_uid: str = Field(min_length=1)
    owner_api_version: str = Field(default="", description="the pod's controller, if known")
    owner_kind: str = ""
    owner_name: str = ""
    owner_uid: str = ""
    gpu_model: str = ""
    gpus: list[str] = Field(default_factory=list, max_length=64, description="GPU UUIDs used")
    first_ts: datetime
    last_ts: datetime
    ticks: int = Field(default=0, ge=0, description="sample periods the pod was seen in")
    gpu_util_pct: SeriesSummary = Field(default_factory=SeriesSummary)
    gpu_mem_used_mib: SeriesSummary = Field(default_factory=SeriesSummary)
    sm_util_pct: SeriesSummary = Field(default_factory=SeriesSummary)
    cpu_util_cores: SeriesSummary = Field(default_factory=SeriesSummary)
    mem_used_mib: SeriesSummary = Field(default_factory=SeriesSummary)
    ts: datetime = Field(default_factory=now)

    SERIES: ClassVar[tuple[str, ...]] = (
        "gpu_util_pct",
        "gpu_mem_used_mib",
        "sm_util_pct",
        "cpu_util_cores",
        "mem_used_mib",
    )

    def subject(self) -> str:
        return f"{self.SUBJECT_PREFIX}.{subject_token(self.node)}"

    def event_id(self) -> str:
        return f"{self.pod_uid}.summary"

    def series(self, name: str) -> SeriesSummary:
        if name not in self.SERIES:
            raise KeyError(name)
        value: SeriesSummary = getattr(self, name)
        return value


class GpuLink(StrEnum):
    """How two GPUs of a node are connected, best first (as `nvidia-smi topo -m` reports)."""

    NVLINK = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"
    SELF = "X"


class GpuDevice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    uuid: str
    model: str
    memory_mib: int = Field(gt=0)
    compute_capability: str = ""
    numa_node: int | None = None
    healthy: bool = True
    pcie_root: str = Field(
        default="", description="PCIe root complex (e.g. pci0000:00), empty when unknown"
    )


class GpuInventory(Event):
    """A node's GPUs and their topology; the value of KV bucket `gpu-inventory` at key <node>."""

    TYPE: ClassVar[str] = "io.alnair.inventory.gpu.v1"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.inventory"
    BUCKET: ClassVar[str] = "gpu-inventory"

    node: str
    gpus: list[GpuDevice]
    topology: list[list[GpuLink]] = Field(
        default_factory=list, description="topology[i][j]: link between GPU i and GPU j"
    )
    ts: datetime = Field(default_factory=now)

    def subject(self) -> str:
        return f"{self.SUBJECT_PREFIX}.{subject_token(self.node)}"

    def kv_key(self) -> str:
        return subject_token(self.node)

    @classmethod
    def read(cls, key: str, value: bytes) -> GpuInventory:
        """The inventory stored at `key`; DecodeError when unreadable, or when it names
        another node than its key does (one node's agent writing another node's GPUs, which
        that node's device plugin would advertise to its kubelet)."""
        try:
            inventory = cls.model_validate_json(value)
        except ValidationError as exc:
            raise DecodeError(f"unreadable GPU inventory at {key!r}: {exc}") from exc
        if inventory.kv_key() != key:
            raise DecodeError(
                f"GPU inventory of node {inventory.node!r} stored under {key!r}: refused"
            )
        return inventory


class GpuHealthChanged(Event):
    """A GPU became unhealthy (XID, ECC, lost) or healthy again."""

    TYPE: ClassVar[str] = "io.alnair.health.gpu.v1"
    STREAM: ClassVar[str | None] = "HEALTH"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.health"

    node: str
    gpu_index: int = Field(ge=0)
    gpu_uuid: str
    healthy: bool
    reason: str = ""
    xid: int | None = None
    ts: datetime = Field(default_factory=now)

    def subject(self) -> str:
        return f"{self.SUBJECT_PREFIX}.{subject_token(self.node)}.{self.gpu_index}"


class JobPhase(StrEnum):
    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    BOUND = "bound"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    PREEMPTED = "preempted"


class JobEvent(Event):
    """A step in a job's life; completion events replace any polling for job ends."""

    TYPE: ClassVar[str] = "io.alnair.jobs.lifecycle.v1"
    STREAM: ClassVar[str | None] = "JOBS"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.jobs"

    phase: JobPhase
    cluster: str = "default"
    namespace: str
    kind: str = Field(description="owner kind: Job, StatefulSet, ElasticJob, Pod, ...")
    name: str
    uid: str
    detail: dict[str, Any] = Field(default_factory=dict)
    ts: datetime = Field(default_factory=now)

    def subject(self) -> str:
        return ".".join(
            [
                self.SUBJECT_PREFIX,
                subject_token(self.cluster),
                subject_token(self.namespace),
                subject_token(self.kind),
            ]
        )


class ScalePhase(StrEnum):
    REQUESTED = "requested"
    APPLIED = "applied"
    REFUSED = "refused"


class ScaleEvent(Event):
    """The scheduler asks an elastic job to change size; the controller applies or refuses."""

    TYPE: ClassVar[str] = "io.alnair.scale.v1"
    STREAM: ClassVar[str | None] = "SCALE"
    SUBJECT_PREFIX: ClassVar[str] = "alnair.scale"

    phase: ScalePhase
    namespace: str
    job: str
    replicas: int = Field(ge=0)
    previous_replicas: int | None = Field(default=None, ge=0)
    reason: str = ""
    ts: datetime = Field(default_factory=now)

    def subject(self) -> str:
        return f"{self.SUBJECT_PREFIX}.{subject_token(self.namespace)}.{subject_token(self.job)}"


class DeadLetter(BaseModel):
    """What the dead-letter subject carries: the original bytes and why they were refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    TYPE: ClassVar[str] = "io.alnair.deadletter.v1"

    subject: str
    consumer: str
    reason: str
    payload: str = Field(description="the original message, decoded as UTF-8 with replacement")
    headers: dict[str, str] = Field(default_factory=dict)
    ts: datetime = Field(default_factory=now)


EVENT_TYPES: tuple[type[Event], ...] = (
    PodMetric,
    PodSummary,
    GpuInventory,
    GpuHealthChanged,
    JobEvent,
    ScaleEvent,
)
BY_TYPE: dict[str, type[Event]] = {cls.TYPE: cls for cls in EVENT_TYPES}
STREAMS: dict[str, str] = {
    cls.STREAM: cls.subject_filter() for cls in EVENT_TYPES if cls.STREAM is not None
}

E = TypeVar("E", bound=Event)


class Envelope(BaseModel, Generic[E]):
    """CloudEvents 1.0 structured-mode JSON envelope."""

    model_config = ConfigDict(extra="allow", frozen=True)

    specversion: Literal["1.0"] = SPEC_VERSION
    id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    type: str = Field(min_length=1)
    time: datetime
    subject: str | None = None
    datacontenttype: Literal["application/json"] = "application/json"
    data: E


def wrap(event: E, source: str, event_id: str | None = None) -> Envelope[E]:
    env_cls: Any = Envelope[type(event)]  # type: ignore[misc]
    env: Envelope[E] = env_cls(
        id=event_id or str(uuid.uuid4()),
        source=source,
        type=event.TYPE,
        time=now(),
        subject=event.subject(),
        data=event,
    )
    return env


def encode(envelope: Envelope[Any]) -> bytes:
    return envelope.model_dump_json(exclude_none=True).encode()


class DecodeError(PermanentError):
    """Bytes that are not a valid envelope of a known event type."""


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser accepts them, our numbers must be finite.
    raise ValueError(f"{name} is not a JSON number")


def decode(raw: bytes, expected: type[E] | None = None) -> Envelope[E]:
    """Parse and validate an envelope; raise DecodeError naming what is wrong.

    Nothing but DecodeError escapes for any input (the bus dead-letters it with the reason):
    hostile documents nested deeper than the parser recurses, integers longer than Python
    converts, NaN/Infinity and invalid UTF-8 are all "not JSON" here."""
    try:
        doc = json.loads(raw, parse_constant=_no_constants)
    except RecursionError as exc:
        raise DecodeError("not JSON: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise DecodeError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise DecodeError(f"envelope must be a JSON object, got {type(doc).__name__}")
    etype = doc.get("type")
    cls = BY_TYPE.get(etype) if isinstance(etype, str) else None
    if cls is None:
        raise DecodeError(f"unknown event type {etype!r}", type=etype)
    if expected is not None and cls is not expected:
        raise DecodeError(f"event type {etype!r} where {expected.TYPE!r} was expected")
    try:
        return Envelope[cls].model_validate(doc)  # type: ignore[valid-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise DecodeError(f"invalid {etype}: {problems}", type=etype) from exc


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of the envelope for every event type, keyed by CloudEvents type."""
    out: dict[str, dict[str, Any]] = {}
    for cls in EVENT_TYPES:
        schema = Envelope[cls].model_json_schema()  # type: ignore[valid-type]
        schema["title"] = cls.TYPE
        schema["description"] = (cls.__doc__ or "").strip()
        out[cls.TYPE] = schema
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.common.events")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sch = sub.add_parser("schema", help="write the JSON Schema of every event type")
    sch.add_argument("--out", type=Path, help="directory for one <type>.schema.json per event")
    args = parser.parse_args(argv)
    schemas = json_schemas()
    if args.out is None:
        json.dump(schemas, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for etype, schema in schemas.items():
        (args.out / f"{etype}.schema.json").write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {len(schemas)} schemas to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
