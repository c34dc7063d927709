"""What the live scheduler learns from its informers (nodes, pods, PodGroups,
PodDisruptionBudgets) and from the profiler's events (GPU health, utilization, link
topology, finished jobs), and how each wakes the queue.

A pending pod of ours joins the queue (a gated one is only listed; one whose request cannot
be read is parked with a Warning Event and the reason); a bound pod is counted on its node,
whichever scheduler bound it; a pod that leaves frees its room and wakes the pods that may
fit now. `Scheduler` (`live.scheduler`) is built on this class: the handlers write into the
collaborators it owns, through their methods.
"""

from __future__ import annotations

from collections.abc import Callable

from alnair.common import resources as r
from alnair.common.colocation import ColocationTable
from alnair.common.informer import WatchEvent
from alnair.common.kube import Obj
from alnair.common.topology import Topology
from alnair.scheduler.cluster.pods import (
    InvalidPodError,
    LivePod,
    is_terminal,
    parse_pod,
    timestamp,
    wants_us,
)
from alnair.scheduler.dra.live import DraSupport
from alnair.scheduler.framework import ScheduleResult
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.live.gang import GangManager
from alnair.scheduler.live.queue import SchedulingQueue
from alnair.scheduler.live.reporting import Reporter
from alnair.scheduler.plugins.interference import ColocationBook
from alnair.scheduler.settings import SchedulerSettings


def _scheduling_relevant_change(old: Obj | None, new: Obj) -> bool:
    """Did anything but status and bookkeeping change (upstream's isPodUpdated)?"""
    if old is None:
        return True
    if old.get("spec") != new.get("spec"):
        return True
    om, nm = old["metadata"], new["metadata"]
    return bool(
        om.get("labels") != nm.get("labels") or om.get("annotations") != nm.get("annotations")
    )


class ClusterWatch:
    """The watch handlers; the attributes below are set by `Scheduler`'s constructor."""

    settings: SchedulerSettings
    cache: SchedulerCache
    queue: SchedulingQueue
    gangs: GangManager
    reporter: Reporter
    dra: DraSupport | None
    last_result: dict[str, ScheduleResult]
    health_listeners: list[Callable[[], None]]
    colocation: ColocationBook
    """Told when a GPU's health changes (the console's live updates)."""

    def _podgroup_status(self, gang: str, message: str | None = None) -> None:
        raise NotImplementedError

    def _add_shape(self, req: LivePod) -> None:
        raise NotImplementedError

    def _on_node(self, event: WatchEvent, node: Obj, old: Obj | None) -> None:
        if event is WatchEvent.DELETED:
            self.cache.delete_node(node["metadata"]["name"])
            self.cache.reservations.drop_node(node["metadata"]["name"])
            return
        if self.cache.upsert_node(node):
            self.queue.move_all_to_active()

    def _on_podgroup(self, event: WatchEvent, pg: Obj, old: Obj | None) -> None:
        key = f"{pg['metadata']['namespace']}/{pg['metadata']['name']}"
        if event is WatchEvent.DELETED:
            self.gangs.delete_group(key)
            self.queue.group_created(key, None)
            return
        self.gangs.upsert_group(pg)
        ts = pg["metadata"].get("creationTimestamp")
        if ts:
            self.queue.group_created(key, timestamp(ts))
        if old is None:
            self.queue.move_all_to_active()

    def _on_pdb(self, event: WatchEvent, pdb: Obj, old: Obj | None) -> None:
        if event is WatchEvent.DELETED:
            self.cache.budgets.delete(pdb)
        else:
            self.cache.budgets.upsert(pdb)

    def _on_pod(self, event: WatchEvent, pod: Obj, old: Obj | None) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        gang = (meta.get("labels") or {}).get(r.POD_GROUP_LABEL)
        gang_key = f"{meta.get('namespace')}/{gang}" if gang else None
        if event is WatchEvent.DELETED or is_terminal(pod):
            known = self.cache.bound.get(uid)
            victim = uid in self.cache.nominations.leaving
            freed = self.cache.remove_pod(uid)
            self.queue.remove(uid)
            if self.dra is not None:
                self.dra.forget_pod(uid)
            self.last_result.pop(uid, None)  # bounded: nothing kept for pods that are gone
            self.cache.reservations.release(uid)
            if gang_key:
                phase = (pod.get("status") or {}).get("phase")
                self.gangs.member_gone(gang_key, uid, phase)
                self._podgroup_status(gang_key)
            if freed:
                self._room_freed(known[1] if known is not None and victim else None)
            return
        if spec.get("nodeName"):
            problem = self.cache.add_bound(pod)
            if problem is not None:
                held = self.cache.bound[uid][0]
                self.reporter.event(
                    pod, "Warning", "UnreadableRequest",
                    f"bound to {spec['nodeName']}; Alnair counts it as holding {held.num_gpu} "
                    f"GPU(s), {held.cpu_milli}m CPU, {held.memory_mib} MiB, the parts of its "
                    f"request it can read: {problem}",
                )  # fmt: skip
            labels = meta.get("labels") or {}
            if (
                old is None
                or not (old.get("spec") or {}).get("nodeName")
                or (old["metadata"].get("labels") or {}) != labels
            ):
                namespace = meta.get("namespace", "default")
                self.queue.move_to_active(lambda req: req.counts_pod(namespace, labels))
            if uid in self.queue.pods:
                self.queue.done(uid)
            if self.cache.reservations.node_of(uid) is not None:  # bound by another replica
                self.cache.reservations.release(uid)
            if gang_key:
                self.gangs.mark_bound(gang_key, uid)
                if old is None or (old.get("status") or {}).get("phase") != (
                    pod.get("status") or {}
                ).get("phase"):
                    self._podgroup_status(gang_key)
            return
        if not wants_us(pod, self.settings.scheduler_name) or meta.get("deletionTimestamp"):
            return
        if spec.get("schedulingGates"):
            # Gated (a queueing controller such as Kueue holds it; the API server has set
            # PodScheduled=False/SchedulingGated): not ours to place until every gate is gone,
            # which arrives as an update of the spec.
            gates = [g.get("name", "") for g in spec["schedulingGates"]]
            self.queue.hold_gated(uid, pod, gates)
            return
        try:
            req: LivePod | None = parse_pod(pod, self.cache.gpu_memory_table())
        except InvalidPodError as exc:
            req = None
            entry = self.queue.pods.get(uid)
            if entry is None or entry.last_message != str(exc):
                self.reporter.event(pod, "Warning", "InvalidRequest", str(exc))
                self.reporter.condition(pod, "InvalidRequest", str(exc))
            self.queue.hold_invalid(uid, pod, str(exc))
            return
        if old is None and req is not None and not spec.get("resourceClaims"):
            self._add_shape(req)  # a claim pod joins once its claims are read
        self.queue.add(uid, pod, req, changed=_scheduling_relevant_change(old, pod))

    def _room_freed(self, victim_node: str | None) -> None:
        """A pod left: every parked pod may fit now. When it was a preemption victim (on
        `victim_node`), preemptors nominated on other nodes stay parked: their own victims'
        deletions wake them, and the room here goes to the pods nominated here first. Without
        this, each victim of a wave of preemptions would send every waiting preemptor through
        a cycle that only finds its nomination again."""
        book = self.cache.nominations
        if victim_node is None or not len(book):
            self.queue.move_all_to_active()
            return

        def elsewhere(uid: str) -> bool:
            nominated = book.by_pod.get(uid)
            return nominated is not None and nominated.node != victim_node

        self.queue.move_all_to_active(keep=elsewhere)

    def on_gpu_health(self, node: str, gpu: int, healthy: bool) -> None:
        changed = ((node, gpu) in self.cache.unhealthy) == healthy
        if self.cache.set_gpu_health(node, gpu, healthy):
            self.queue.move_all_to_active()
        if changed:
            for listener in self.health_listeners:
                listener()

    def on_gpu_util(
        self, node: str, gpu: int, pct: float, pod_uid: str = "", mem_mib: float = 0.0
    ) -> None:
        self.cache.set_gpu_util(node, gpu, pct, pod_uid, mem_mib)

    def on_inventory(self, node: str, topology: Topology) -> None:
        """A node's GPU link matrix from the profiler (an empty one forgets it)."""
        if topology:
            self.cache.topology[node] = topology
        else:
            self.cache.topology.pop(node, None)

    def on_colocation(self, table: ColocationTable | None) -> None:
        """A new co-location table (a retrained predictor): pods refused for interference
        are judged again by it."""
        self.colocation.table = table
        self.queue.move_all_to_active()

    def on_job_finished(self) -> None:
        self.queue.move_all_to_active()
