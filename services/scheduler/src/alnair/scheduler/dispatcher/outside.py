"""GPUs held by pods outside the queues, whoever bound them (issue 24).

The dispatcher plans with what its queues hold (each admitted workload's request). A pod that
belongs to no admitted workload (one kube-scheduler or another scheduler bound, a Deployment
nobody queued, the pods of a workload that was suspended and is still terminating) holds GPUs
all the same: they are taken from the free pool before any admission is decided.

Which pods are inside (the queues' to account for) is decided by ownership: the pods of a
workload the dispatcher admitted or holds (a held one's remaining pods are leaving, as it was
suspended or preempted, and the GPUs they free are already planned for):

- a pod that is itself such a workload (a queued Pod), or a member of such a serving workload
  or PodGroup (the `alnair.io/workload` value its template or the webhook gave it);
- a pod whose chain of controller owners reaches such a workload's uid, through the objects
  the workload kinds make in between (a JobSet's Jobs, a TrainJob's JobSet, a RayJob's
  RayCluster, an ElasticJob's StatefulSet). Each such owner is read once (GET) and remembered
  by uid, as ownership does not change. One the dispatcher cannot read leads nowhere, so its
  pods count as held: the safe side, as GPUs counted twice make a job wait, while GPUs
  counted free would leave an admitted job's pods unbound.

Held GPUs are whole GPUs by node: whole requests add up, and the fractions on one node are
summed and rounded up (they share GPUs). Only bound, unfinished pods are watched (a field
selector), and only pods holding GPUs are kept; a change to one wakes the dispatcher.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from alnair.common import resources as res
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    JOBS,
    JOBSETS,
    PODS,
    RAYCLUSTERS,
    STATEFULSETS,
    ApiError,
    KubeClient,
    NotFound,
    Obj,
    Resource,
    Unavailable,
)
from alnair.scheduler.cluster.pods import parse_bound_pod
from alnair.scheduler.dispatcher.parsing import LABEL_WORKLOAD, controller_ref

log = logging.getLogger(__name__)

BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""The pods that hold a node's resources: bound, not finished."""

BETWEEN: dict[tuple[str, str], Resource] = {
    ("batch", "Job"): JOBS,
    ("jobset.x-k8s.io", "JobSet"): JOBSETS,
    ("ray.io", "RayCluster"): RAYCLUSTERS,
    ("apps", "StatefulSet"): STATEFULSETS,
}
"""The owners a workload kind makes between itself and its pods, walked up to find whose pod
it is. An owner of any other kind that is not an admitted workload leads outside."""

MAX_DEPTH = 4  # pod → Job → JobSet → TrainJob is the deepest chain a kind makes
MAX_REMEMBERED = 50_000


@dataclass(frozen=True, slots=True)
class Held:
    """What one bound pod holds: its node, whole GPUs, and the share (milli) of a fraction."""

    node: str
    whole: int
    milli: int


@dataclass(frozen=True, slots=True)
class Inside:
    """What the queues hold now: admitted workloads' uids, and the `alnair.io/workload`
    values (by namespace) of admitted serving workloads and PodGroups."""

    uids: frozenset[str]
    members: frozenset[tuple[str, str]]


def held_by(pod: Obj) -> Held | None:
    """The GPUs a bound pod holds (None: none). A request that cannot be read in full still
    holds what can be read (`parse_bound_pod`)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    request, _ = parse_bound_pod(pod)
    if request.num_gpu <= 0:
        return None
    if request.gpu_milli >= res.MILLI_PER_GPU:
        return Held(node, request.num_gpu, 0)
    return Held(node, 0, request.gpu_milli)


class OutsidePods:
    """Bound pods holding GPUs, and which of them no admitted workload owns."""

    def __init__(self, kube: KubeClient, wake: Callable[[], None]) -> None:
        self.kube = kube
        self.wake = wake
        self.informer = Informer(kube, PODS, field_selector=BOUND_PODS, name="bound-pods")
        self.informer.add_handler(self._on_pod)
        self.gpu_pods: dict[str, Held] = {}
        # uid of an owner → its own controller reference (None: it has none, or is unreadable)
        self.parents: OrderedDict[str, Obj | None] = OrderedDict()
        self.reads = 0
        self._refused: set[str] = set()

    def _on_pod(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        held = None if event is WatchEvent.DELETED else held_by(obj)
        before = self.gpu_pods.pop(key, None)
        if held is not None:
            self.gpu_pods[key] = held
        if held != before:
            self.wake()

    async def held(self, inside: Inside, model_of: dict[str, str]) -> Counter[str]:
        """GPUs held outside the queues, by model, on the nodes in `model_of` (node → model)."""
        whole: Counter[str] = Counter()
        milli: Counter[str] = Counter()
        for key, held in list(self.gpu_pods.items()):
            if held.node not in model_of:
                continue
            pod = self.informer.get(key)
            if pod is None or await self._inside(pod, inside):
                continue
            whole[held.node] += held.whole
            milli[held.node] += held.milli
        by_model: Counter[str] = Counter()
        for node in whole.keys() | milli.keys():
            by_model[model_of[node]] += whole[node] + math.ceil(milli[node] / res.MILLI_PER_GPU)
        return by_model

    async def _inside(self, pod: Obj, inside: Inside) -> bool:
        meta = pod["metadata"]
        ns = meta.get("namespace") or ""
        member = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
        if meta.get("uid") in inside.uids or (member and (ns, member) in inside.members):
            return True
        ref = controller_ref(pod)
        for _ in range(MAX_DEPTH):
            if ref is None:
                return False
            if ref.get("uid") in inside.uids:
                return True
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            resource = BETWEEN.get((group, str(ref.get("kind"))))
            if resource is None:
                return False
            ref = await self._parent(resource, ns, ref)
        return False

    async def _parent(self, resource: Resource, ns: str, ref: Obj) -> Obj | None:
        uid = str(ref.get("uid"))
        if uid in self.parents:
            self.parents.move_to_end(uid)
            return self.parents[uid]
        self.reads += 1
        try:
            owner = await self.kube.get(resource, str(ref.get("name")), ns)
        except NotFound:
            parent = None  # gone: its pods lead nowhere now
        except Unavailable:
            return None  # counted as held this time, read again at the next reconcile
        except ApiError as exc:
            if resource.plural not in self._refused:
                self._refused.add(resource.plural)
                log.warning(
                    "an owner cannot be read: its pods count as held outside the queues",
                    extra={"resource": resource.plural, "error": str(exc)},
                )
            parent = None
        else:
            # (a new object under the old name is not the pod's owner: that one is gone)
            same = owner["metadata"].get("uid") == uid
            parent = controller_ref(owner) if same else None
        self.parents[uid] = parent
        if len(self.parents) > MAX_REMEMBERED:
            self.parents.popitem(last=False)
        return parent
