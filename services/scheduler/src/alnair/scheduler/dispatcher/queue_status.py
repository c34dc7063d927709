"""The status the dispatcher keeps on ClusterQueues and LocalQueues, in Kueue's fields, so
`kubectl get clusterqueues` and tools written for Kueue read it: pending and admitted
workloads, GPUs used and borrowed per flavor (GPU model), and whether the queue is active.

Counted after each reconcile from the snapshot the policy decided on and its decisions (the
admissions of this round included). Pure; the loop writes what changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.core import QueueState
from alnair.scheduler.dispatcher.parsing import Workload
from alnair.scheduler.dispatcher.writing import JobState
from alnair.scheduler.queueing import Decisions, QueueSnapshot

EMPTY_LOCAL_QUEUE = {"pendingWorkloads": 0, "admittedWorkloads": 0}


def cluster_queue_statuses(
    snapshot: QueueSnapshot,
    decisions: Decisions,
    cluster_queues: Iterable[Obj],
    queues: Mapping[str, QueueState],
) -> dict[str, dict[str, Any]]:
    """Each ClusterQueue's `status`, by name."""
    admitted_now = {a.job_id for a in decisions.admissions}
    pending: Counter[str] = Counter(j.queue for j in snapshot.pending if j.id not in admitted_now)
    admitted: Counter[str] = Counter(r.job.queue for r in snapshot.running)
    used: dict[str, Counter[str]] = {}
    borrowed: Counter[str] = Counter()
    for run in snapshot.running:
        used.setdefault(run.job.queue, Counter())[run.gpu_type] += run.gpus
        if run.borrowing:
            borrowed[run.job.queue] += run.gpus
    by_id = {j.id: j for j in snapshot.pending}
    for adm in decisions.admissions:
        queue = by_id[adm.job_id].queue
        admitted[queue] += 1
        used.setdefault(queue, Counter())[adm.gpu_type] += adm.gpus
        if adm.borrowing:
            borrowed[queue] += adm.gpus
    out: dict[str, dict[str, Any]] = {}
    for obj in cluster_queues:
        name = obj["metadata"]["name"]
        state = queues.get(name)
        active = state is not None and state.spec is not None
        flavors = used.get(name, Counter())
        out[name] = {
            "pendingWorkloads": pending[name],
            "admittedWorkloads": admitted[name],
            "usedGPUs": sum(flavors.values()),
            "borrowedGPUs": borrowed[name],
            "flavorsUsage": [
                {"name": m, "total": n, "borrowed": 0} for m, n in sorted(flavors.items())
            ],
            "conditions": [
                {
                    "type": "Active",
                    "status": "True" if active else "False",
                    "reason": "Ready" if active else "InvalidSpec",
                    "message": "" if active else (state.problem if state else "") or "",
                }
            ],
        }
    return out


def local_queue_statuses(
    states: Mapping[str, JobState],
    workloads: Mapping[str, Workload],
    admitted_now: Collection[str],
) -> dict[str, dict[str, int]]:
    """Each LocalQueue's `status` (pending and admitted workloads), by namespace/name; a
    queue none of the known workloads names is not in it (its counts are 0)."""
    pending: Counter[str] = Counter()
    admitted: Counter[str] = Counter()
    for key, state in states.items():
        known = workloads.get(key)
        if known is None:
            continue
        lq = f"{known.namespace}/{known.local_queue}"
        if state.admitted_type is not None or key in admitted_now:
            admitted[lq] += 1
        elif state.invalid is None:
            pending[lq] += 1
    return {
        lq: {"pendingWorkloads": pending[lq], "admittedWorkloads": admitted[lq]}
        for lq in pending.keys() | admitted.keys()
    }
