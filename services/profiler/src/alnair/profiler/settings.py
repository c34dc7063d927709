"""Settings of the profiler's two processes (env prefix `ALNAIR_PROFILER_`).

The same image runs as the node agent (DaemonSet, one per GPU node, `nvml` backend) or, for
KWOK clusters and demos, as one `sim` agent serving every fake GPU node; and as the
aggregator (a Deployment). Connection settings also answer to the plain `ALNAIR_` names so one
ConfigMap serves every service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from alnair.common.errors import InvalidValueError
from alnair.common.kube import Resource
from alnair.common.settings import DEFAULT_HTTP_PORTS, ServiceSettings


class ProfilerSettings(ServiceSettings):
    """Everything the agent and the aggregator read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="ALNAIR_PROFILER_", extra="ignore", populate_by_name=True
    )

    role: Literal["agent", "aggregator", "bus-auth"] = Field(
        default="agent",
        description="which process this is: node agent, aggregator, or the bus's auth callout",
    )
    bus_auth_issuer_seed: SecretStr | None = Field(
        default=None,
        description="bus-auth: the callout account's nkey seed, which signs node users",
    )
    bus_auth_ttl_s: int = Field(
        default=3600, ge=60,
        description="bus-auth: how long a node user stays admitted before it authenticates again",
    )  # fmt: skip
    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["profiler-agent"],
        ge=0,
        le=65535,
        description="HTTP API port (0: any); unset: 8083 for the agent, 8084 for the aggregator",
    )
    backend: Literal["nvml", "sim"] = Field(
        default="nvml", description="agent GPU backend: real GPUs (nvml) or simulated (sim)"
    )
    node_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("ALNAIR_PROFILER_NODE_NAME", "NODE_NAME"),
        description="node the nvml agent runs on (from the downward API)",
    )
    sim_node_selector: str | None = Field(
        default=None,
        description="label selector of the nodes the sim agent serves (unset: every GPU node)",
    )
    sample_interval_s: float = Field(
        default=1.0, gt=0, description="period of pod-metric samples (1 Hz by design)"
    )
    state_dir: Path | None = Field(
        default=None,
        description="agent: folder for the spool of pod summaries not yet published (survives "
        "a kill; a node path or the pod's emptyDir); unset: kept in memory only",
    )
    max_pending_summaries: int = Field(
        default=10000,
        ge=1,
        description="agent: pod summaries kept while the bus is unreachable; the oldest go first",
    )
    label_nodes: bool = Field(
        default=True, description="write GPU model/memory/count/compute-capability node labels"
    )
    gavel_path: Path | None = Field(
        default=None,
        description="Gavel throughputs (shipped CSV layout or Gavel's throughputs.json) for the "
        "sim backend's throughput and slowdown; unset: the copy shipped in alnair.common.data",
    )
    progress_log_namespaces: list[str] = Field(
        default=[],
        description="agent: namespaces whose pods' training progress may be read from their "
        "log files (opt-in per namespace: only pattern matches leave the node)",
    )
    progress_log_root: Path = Field(
        default=Path("/var/log/pods"), description="agent: the kubelet's pod log folder"
    )
    proc_root: Path = Field(default=Path("/proc"), description="host /proc (nvml agent)")
    cgroup_root: Path = Field(
        default=Path("/sys/fs/cgroup"),
        description="host cgroup mount (nvml agent): the v2 hierarchy, or the folder holding "
        "the v1 hierarchies (cpuacct, memory, blkio)",
    )
    kubelet_cgroup_root: str = Field(
        default="",
        description="the kubelet's --cgroup-root (cgroupRoot), where kubepods sits below the "
        "cgroup mount; empty: the mount's root",
    )
    nvml_recover_after_s: float = Field(
        default=60.0,
        gt=0,
        description="quiet time after a GPU fault before it may count as healthy",
    )
    owner_kinds: list[str] = Field(
        default=["batch/v1/jobs", "alnair.io/v1alpha1/elasticjobs"],
        description="group/version/plural of owners whose completion the aggregator watches",
    )
    live_annotation_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="how often at most a running owner's utilization annotations are refreshed "
        "(0: only when it finishes)",
    )
    redis_idle_ttl_s: int = Field(
        default=7 * 24 * 3600,
        ge=60,
        description="the aggregator's working keys of a pod and its owner expire this long after"
        " the pod's last sample (owners that never finish leave nothing behind)",
    )
    redis_finished_ttl_s: int = Field(
        default=3600,
        ge=1,
        description="once a job's record is written, its working keys expire this much later"
        " (its live profile stays readable meanwhile)",
    )
    late_samples_s: float = Field(
        default=90.0,
        gt=0,
        description="how long after a GPU job's end its first samples may still arrive (an agent"
        " that was cut off from the bus); after that it is recorded without usage",
    )
    trialjobs: bool = Field(
        default=True, description="run the TrialJob controller in the aggregator process"
    )
    durable: str = Field(
        default="profiler-aggregator", description="queue group / durable name of the aggregator"
    )
    source: str = Field(default="alnair/profiler", description="CloudEvents source of our events")

    @model_validator(mode="after")
    def _aggregator_port(self) -> ProfilerSettings:
        # Both roles share this class; unless configured, each gets its own port so an agent
        # and an aggregator run side by side on one machine.
        if "http_port" not in self.model_fields_set and self.role != "agent":
            self.http_port = DEFAULT_HTTP_PORTS[self.role]
        return self


def parse_resource(spec: str) -> Resource:
    """A Resource from "group/version/plural" ("batch/v1/jobs") or "version/plural" (core)."""
    parts = spec.strip("/").split("/")
    if len(parts) == 3:
        return Resource(parts[0], parts[1], parts[2])
    if len(parts) == 2:
        return Resource("", parts[0], parts[1])
    raise InvalidValueError(
        "owner_kinds", spec, "expected group/version/plural, e.g. batch/v1/jobs"
    )
