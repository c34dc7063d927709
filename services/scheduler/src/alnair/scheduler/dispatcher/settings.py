"""Dispatcher settings (env prefix `ALNAIR_DISPATCHER_`; connections under `ALNAIR_`)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from alnair.common.settings import DEFAULT_HTTP_PORTS, LeaderElectionSettings, ServiceSettings


class DispatcherSettings(ServiceSettings, LeaderElectionSettings):
    model_config = SettingsConfigDict(env_prefix="ALNAIR_DISPATCHER_", extra="ignore")

    lease_name: str = Field(
        default="",
        description="leader Lease name (default: alnair-dispatcher, or alnair-hub in hub mode)",
    )

    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["dispatcher"], ge=0, le=65535, description="HTTP API port"
    )
    policy: str = Field(default="alnair", description="queueing policy: alnair, fifo, sjf, drf")
    max_wait_s: float = Field(
        default=math.inf,
        gt=0,
        description="alnair policy: a job waiting this long goes to the front and gets a "
        "reservation that later jobs may not delay (backfill only what ends before it); "
        "off (inf) by default: the policy's wait credit bounds waits, and a hard bound "
        "turns an overloaded queue first-come-first-served",
    )
    fair_share: float = Field(
        default=0.0,
        ge=0,
        description="alnair policy: fair sharing by history; a queue that used more of the "
        "cluster recently (decayed, per weight) yields this many seconds of ordering per "
        "cluster-second it used beyond the least-served queue (0: off)",
    )
    fair_share_half_life_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="half-life of the usage history fair sharing reads (kept in memory: it "
        "starts again from none when another replica takes the lead)",
    )
    nats_enabled: bool = Field(
        default=True, description="ask the predictor over NATS and publish job lifecycle events"
    )
    predict_subject: str = Field(
        default="alnair.predict", description="NATS subject of the predictor's request-reply"
    )
    predict_timeout_s: float = Field(
        default=5.0, gt=0, description="how long one prediction request may take"
    )
    require_predictions: bool = Field(
        default=False,
        description="hold jobs that carry no model annotations (nothing to predict from) "
        "instead of admitting them with unknown runtime and memory",
    )
    trials: bool = Field(
        default=True,
        description="cold start: when the predictor has never measured a job on a GPU model, "
        "run its TrialJob (1 GPU per unmeasured model) before admitting it",
    )
    trial_duration_s: int = Field(
        default=60, ge=1, le=3600, description="how long each trial run lasts"
    )
    node_selector: str | None = Field(
        default=None,
        description="label selector of the GPU nodes this dispatcher admits onto (unset: all)",
    )
    max_colocation_slowdown: float = Field(
        default=2.5,
        gt=1,
        description="fractional workloads are planned together on one GPU only when the "
        "predictor's co-location table says none runs this many times slower (as the binder)",
    )
    default_restart_cost_s: float = Field(
        default=60.0,
        ge=0,
        description="work a preempted job is assumed to lose (checkpoint reload, warm-up) "
        "unless it says otherwise in alnair.io/restart-cost-s",
    )
    pods_ready_timeout_s: float = Field(
        default=1800.0,
        ge=0,
        description="an admitted workload whose pods are not all ready this long after "
        "admission (an image that never pulls, a gang that cannot fit) gives its quota back "
        "and is queued again after as long again; 0: never",
    )
    pods_ready_retries: int = Field(
        default=3,
        ge=1,
        description="after this many such evictions the workload stays suspended, not queued, "
        "until its alnair.io/pods-not-ready-evictions annotation is removed",
    )
    webhook_cert_dir: str | None = Field(
        default=None,
        description="folder of the admission webhook's serving certificate (tls.crt, tls.key: "
        "the mounted Secret, reloaded when it changes); unset: no webhook is served",
    )
    webhook_port: int = Field(
        default=9443, ge=0, le=65535, description="HTTPS port of the admission webhook (0: any)"
    )
    query_api: bool = Field(
        default=True,
        description="serve the aggregated query API (dispatcher.query.alnair.io/v1alpha1: "
        "queues, queued workloads, why one waits) on the webhook's HTTPS port, for an "
        "APIService; users reach it through the API server with their own RBAC",
    )
    queue_api: Literal["alnair", "kueue"] = Field(
        default="alnair",
        description="whose queue objects to read: alnair (alnair.io ClusterQueue, LocalQueue, "
        "Cohort) or kueue (Kueue's kueue.x-k8s.io/v1beta2 ClusterQueue, LocalQueue, Cohort, "
        "ResourceFlavor and WorkloadPriorityClass, with Kueue's controller not running; "
        "docs/from-kueue.md)",
    )
    mode: Literal["cluster", "hub"] = Field(
        default="cluster",
        description="cluster: admit queued Jobs on this cluster; hub: dispatch Jobs managed by "
        "alnair.io/multicluster to the worker clusters registered as Secrets",
    )
    hub_namespace: str = Field(
        default="alnair-clusters",
        description="hub: the namespace whose Secrets labelled alnair.io/worker-cluster=true "
        "register worker clusters (a namespace of its own: reading Secrets there must not "
        "reach the other services' credentials in alnair-system)",
    )
    worker_grace_s: float = Field(
        default=60.0,
        gt=0,
        description="hub: a worker whose watches fail this long is lost (its not-started jobs "
        "go elsewhere, its running ones are reported lost-contact)",
    )
