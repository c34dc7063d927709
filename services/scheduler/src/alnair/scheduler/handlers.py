"""NATS subscriptions of the scheduler: GPU health, measured use, and job completions.

- GpuHealthChanged (durable `scheduler-health`): unhealthy GPUs are withheld from placement and
  come back when healthy; a GPU coming back drains the unschedulable pool.
- PodMetric (core NATS, a queue group per replica so every replica sees every sample): each
  pod's latest GPU utilization, summed per (node, GPU), feeds the GpuUtilization score.
- JobEvent completed/failed (durable `scheduler-jobs`): room may have freed; drain the pool.
- GpuInventory (a watch on the whole `gpu-inventory` KV bucket): each node's GPU link matrix,
  so multi-GPU pods get the best-connected GPUs (`TopologyAwareGpus`).
- The co-location table (a watch on key `table` of the `alnair-colocation` bucket, which the
  predictor rewrites on each new model): the `Interference` plugin's slowdowns.
"""

from __future__ import annotations

import logging
from datetime import datetime

from alnair.common.bus import Bus
from alnair.common.delivery import Subscription
from alnair.common.events import (
    DecodeError,
    Envelope,
    GpuHealthChanged,
    GpuInventory,
    JobEvent,
    JobPhase,
    PodMetric,
    subject_token,
)
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.tables import follow_table

log = logging.getLogger(__name__)


REPLICA_DURABLE_INACTIVE_S = 3600.0
"""A scheduler replica's own durables outlive it by this much (a rollout's old pods)."""


async def subscribe(bus: Bus, scheduler: Scheduler, identity: str) -> list[Subscription]:
    # The time of the last flip applied per GPU: one older than that (an agent's event that
    # reached the bus late, a redelivery) says nothing new and is not applied.
    applied_at: dict[tuple[str, int], datetime] = {}

    async def on_health(ev: GpuHealthChanged, env: Envelope[GpuHealthChanged]) -> None:
        key = (ev.node, ev.gpu_index)
        if key in applied_at and env.time < applied_at[key]:
            log.info(
                "older GPU health event ignored",
                extra={"node": ev.node, "gpu": ev.gpu_index, "healthy": ev.healthy, "id": env.id},
            )
            return
        applied_at[key] = env.time
        scheduler.on_gpu_health(ev.node, ev.gpu_index, ev.healthy)

    async def on_metric(ev: PodMetric, env: Envelope[PodMetric]) -> None:
        if ev.gpu_index is not None:
            scheduler.on_gpu_util(
                ev.node, ev.gpu_index, ev.gpu_util_pct, ev.pod_uid, ev.gpu_mem_used_mib
            )

    async def on_job(ev: JobEvent, env: Envelope[JobEvent]) -> None:
        if ev.phase in (JobPhase.COMPLETED, JobPhase.FAILED):
            scheduler.on_job_finished()

    # Every replica needs every event (the standby's caches stay warm), so each has its own
    # durables, named after its identity (the pod name: a restarted container resumes them);
    # the server deletes those of a replica gone for longer than REPLICA_DURABLE_INACTIVE_S.
    me = subject_token(identity)
    return [
        # One at a time: a GPU's health flips must apply in the order they happened.
        await bus.subscribe(GpuHealthChanged, on_health, durable=f"scheduler-health-{me}",
                            inactive_s=REPLICA_DURABLE_INACTIVE_S, max_in_flight=1),
        await bus.subscribe(PodMetric, on_metric, durable=f"scheduler-{me}"),
        await bus.subscribe(JobEvent, on_job, durable=f"scheduler-jobs-{me}",
                            inactive_s=REPLICA_DURABLE_INACTIVE_S),
    ]  # fmt: skip


async def watch_inventory(bus: Bus, scheduler: Scheduler) -> None:
    """Follow every node's inventory until cancelled: its topology feeds GPU selection."""
    kv = await bus.kv(GpuInventory.BUCKET)
    watcher = await kv.watchall()
    node_of_key: dict[str, str] = {}
    try:
        async for entry in watcher:
            if entry is None:
                continue  # the end-of-history marker
            if not entry.value:  # deleted or purged: the node's agent is gone
                node = node_of_key.pop(entry.key, None)
                if node is not None:
                    scheduler.on_inventory(node, [])
                continue
            try:
                inventory = GpuInventory.read(entry.key, entry.value)
            except DecodeError as exc:
                log.error("GPU inventory refused", extra={"key": entry.key, "error": str(exc)})
                continue
            node_of_key[entry.key] = inventory.node
            scheduler.on_inventory(inventory.node, inventory.topology)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


async def watch_colocation(bus: Bus, scheduler: Scheduler) -> None:
    """Follow the predictor's co-location table until cancelled (`alnair.scheduler.tables`)."""
    await follow_table(bus, scheduler.on_colocation)
