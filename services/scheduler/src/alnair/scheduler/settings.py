"""Scheduler settings (env prefix `ALNAIR_SCHEDULER_`; connections under `ALNAIR_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from alnair.common.settings import DEFAULT_HTTP_PORTS, LeaderElectionSettings, ServiceSettings


class SchedulerSettings(ServiceSettings, LeaderElectionSettings):
    model_config = SettingsConfigDict(env_prefix="ALNAIR_SCHEDULER_", extra="ignore")

    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["scheduler"],
        ge=0,
        le=65535,
        description="HTTP API port (0: any)",
    )
    scheduler_name: str = Field(
        default="alnair", description="pods with this spec.schedulerName are ours"
    )
    query_cert_dir: str | None = Field(
        default=None,
        description="folder of the serving certificate (tls.crt, tls.key: a mounted Secret, "
        "reloaded when it changes) of the aggregated query API (scheduler.query.alnair.io/"
        "v1alpha1: GPUs and their holders, pod metrics, why a pod waits); unset: not served",
    )
    query_port: int = Field(
        default=9444, ge=0, le=65535, description="HTTPS port of the query API (0: any)"
    )
    policy: str = Field(
        default="alnair",
        description="placement policy (alnair, FGD, BestFit, DotProd, GpuPacking, "
        "GpuClustering, binpack, spread, Random)",
    )
    utilization_weight: float = Field(
        default=0.1, ge=0, description="weight of the measured-GPU-use score (0 disables it)"
    )
    max_colocation_slowdown: float = Field(
        default=2.5,
        gt=1,
        description="a fraction may not join a GPU where the predictor's co-location table "
        "says it or a pod already there would run this many times slower than alone",
    )
    max_sharing_util_pct: float = Field(
        default=70.0,
        gt=0,
        le=100,
        description="a GPU whose measured use is at or past this takes no further fraction "
        "(seed 000: GPU util no more than 70%)",
    )
    interference_weight: float = Field(
        default=1.0, ge=0, description="weight of the co-location score (0: caps only)"
    )
    workload_window: int = Field(
        default=5000, ge=1, description="recent pods whose shapes tune fragmentation-aware policies"
    )
    max_binds_in_flight: int = Field(
        default=256, ge=1, description="concurrent Binding requests to the API server"
    )
    event_writers: int = Field(default=16, ge=1, description="concurrent Event writers")
    initial_backoff_s: float = Field(default=1.0, gt=0, description="first retry delay")
    max_backoff_s: float = Field(default=10.0, gt=0, description="longest retry delay")
    starvation_after_s: float = Field(
        default=300.0,
        ge=0,
        description="a pod pending this long reserves the node closest to fitting it (0: never)",
    )
    max_reserved_nodes: int = Field(
        default=16, ge=0, description="most nodes reserved for starving pods at once"
    )
    dra: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="allocate ResourceClaims (resource.k8s.io/v1) for our pods: auto = when the "
        "API server serves DRA and RBAC lets the scheduler list claims, slices and classes; on = "
        "always (informers retry until allowed; readiness stays false); off = never",
    )
    seed: int | None = Field(default=None, description="random seed for tie-breaking (tests)")
    lease_name: str = Field(default="alnair-scheduler", description="leader Lease name")
    nats_enabled: bool = Field(
        default=True, description="subscribe to GPU health, pod metrics and job events on NATS"
    )
    tracemalloc_dir: str = Field(
        default="",
        description="debug, off when empty: write memory figures (RSS, malloc, objects) here at "
        "start and on each SIGUSR1, and tracemalloc snapshots when tracemalloc_frames > 0 "
        "(`python -m alnair.common.memtrace OLD NEW` compares two)",
    )
    tracemalloc_frames: int = Field(
        default=16, ge=0, description="frames kept per traced allocation (0: figures only)"
    )
