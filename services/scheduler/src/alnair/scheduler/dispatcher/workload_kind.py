"""What a kind of workload is to the dispatcher (`WorkloadKind`), and the pieces several
kinds' adapters share: holding at creation (a suspension or a scheduling gate), the pod-template
label that gates a serving workload's pods, the model written into a template, the generic
status reading. The adapters are in `kinds.py` (Kubernetes' own kinds, JobSet, LeaderWorkerSet,
PodGroup, ElasticJob) and `peer_kinds.py` (KubeRay, Kubeflow Trainer and Kubeflow v1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from alnair.common import resources as res
from alnair.common.kube import (
    Obj,
    Resource,
)
from alnair.scheduler.dispatcher.parsing import (
    ADMISSION_GATE,
    LABEL_WORKLOAD,
    Workload,
    controller_ref,
    gpus_asked,
    queue_label,
    workload_label,
)
from alnair.scheduler.dispatcher.training import (
    pod_group_of,
)

Patch = list[dict[str, Any]]
Lookup = Callable[[Resource, str | None, str], Obj | None]
"""An object the dispatcher's informers hold: (resource, namespace or None, name)."""

JOB_CONTROLLER = "kubernetes.io/job-controller"
"""`spec.managedBy` of a Job the built-in Job controller runs (the default)."""
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"


@dataclass(frozen=True, slots=True)
class StatusWrites:
    """The `status` of each merge patch (on the status subresource) of a kind whose object is
    its own admission record."""

    admitted: Callable[[Workload, str, Mapping[str, str], str], Obj]
    """(workload, ClusterQueue, resource -> flavor, message): admitted."""
    evicted: Callable[[Workload, str, str], Obj]
    """(workload, cause, message): its admission taken back."""
    pending: Callable[[Workload, str], Obj | None]
    """(workload, why it waits): said on it (None: said already)."""


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    kind: str
    api_version: str
    resource: Resource
    label_selectors: tuple[str | None, ...]
    """What its informers list, one informer each (a selector cannot say "this label or that
    one"; None: every object, `queued` decides)."""
    queued: Callable[[Obj], bool]
    key: Callable[[str, str], str]
    parse: Callable[[Obj, float], Workload]
    finished: Callable[[Obj], str | None]
    writes_conditions: bool
    hold: Callable[[Obj], Patch]
    """The JSON Patch that holds a new object for its queue ([] when it is held already)."""
    release: Callable[[Workload, str], Obj]
    """The `spec` of the merge patch that admits it onto a GPU model."""
    reclaim: Literal["suspend", "evict", "regate"]
    ready: Callable[[Workload], bool]
    """Whether every pod it was admitted for is ready (or already done)."""
    references: tuple[Resource, ...] = ()
    """Other objects its workloads name and `parse` reads (a TrainJob's runtime): the
    dispatcher keeps an informer on each while the kind is served."""
    resolve: Callable[[Obj, Lookup], Obj] | None = None
    """The object `parse` reads: this one with what it names, found by the lookup."""
    refuse: Callable[[Obj], str | None] | None = None
    """What the holding webhook refuses at creation (422, the message): a queued object its
    own controller would not let be held."""
    members_first: bool = False
    """Admitted only once every pod it asks for exists (a group of plain pods: no controller
    makes the rest, so quota is not held for pods that may never come)."""
    finished_by_pods: Callable[[Obj, list[Obj]], str | None] | None = None
    """For a kind whose object never says it finished (a PodGroup of plain pods): whether it
    did, from its pods (`alnair.io/workload`)."""
    optional: bool = False
    """Its API comes from another project (a CRD): queued only where the cluster serves it."""
    suspension: Obj | None = None
    """The `spec` of the merge patch that suspends it again when reclaimed (None:
    `{"suspend": true}`, where most kinds keep it)."""
    delegable: bool = False
    """Whether its objects can name another controller in `spec.managedBy`, so the
    multi-cluster hub can take the ones naming it and run a copy on a worker cluster while
    this cluster's controller leaves them alone."""
    export: Callable[[Obj], Obj] | None = None
    """The `spec` of such a copy, from the original's (what this cluster's API server
    defaulted and another's must not get: a Job's selector and controller labels)."""
    status_writes: StatusWrites | None = None
    """Where its admission is written in its own status (Kueue's Workload: `status.admission`
    and conditions, `kueue_workload.py`) instead of annotations and a spec patch: how."""
    kueue_only: bool = False
    """Queued only with Kueue's queue objects (`queue_api: kueue`): it names a Kueue
    LocalQueue."""
    writable: bool = True
    """Whether the dispatcher writes the object itself (its admission in annotations). A
    serving workload's admission lives on its pods instead: the dispatcher may not patch
    Deployments anywhere, alnair-system's included."""

    def informer(self, selector: str | None) -> str:
        """The name of its informer for `selector` (logs, metrics)."""
        by = f"-by-{selector.split('/')[0]}" if selector else ""
        return f"queued-{self.resource.plural}{by}"

    def ref(self, obj: Obj) -> Obj:
        """The object with its kind, for Events (list results carry no kind)."""
        return {**obj, "apiVersion": self.api_version, "kind": self.kind}

    def key_of(self, obj: Obj) -> str:
        meta = obj["metadata"]
        return self.key(str(meta["namespace"]), str(meta["name"]))


def managed_queued(obj: Obj, controller: str) -> bool:
    """Labelled for a queue, run by `controller` (`spec.managedBy` unset or naming it), and
    owned by no other controller: a JobSet's child Job, or the multi-cluster hub's copy on a
    worker, is admitted with its owner."""
    managed_by = (obj.get("spec") or {}).get("managedBy")
    return (
        bool(queue_label(obj.get("metadata") or {}))
        and managed_by in (None, "", controller)
        and controller_ref(obj) is None
    )


def suspend_patch(obj: Obj) -> Patch:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [{"op": "add", "path": "/spec", "value": {"suspend": True}}]
    if spec.get("suspend") is True:
        return []
    return [{"op": "add", "path": "/spec/suspend", "value": True}]


def gate_patch(obj: Obj) -> Patch:
    """Gate a queued pod. A pod of a PodGroup is also labelled `alnair.io/workload`, so the
    dispatcher finds the group's pods as it does a serving workload's."""
    gate = {"name": ADMISSION_GATE}
    gates = (obj.get("spec") or {}).get("schedulingGates")
    patch: Patch = []
    if not gates:
        patch.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    elif not any(g.get("name") == ADMISSION_GATE for g in gates):
        patch.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    group = pod_group_of(obj)
    if group is not None:  # (so it has labels)
        label = LABEL_WORKLOAD.replace("/", "~1")
        value = workload_label("PodGroup", group)
        patch.append({"op": "add", "path": f"/metadata/labels/{label}", "value": value})
    return patch


def ungated_spec(pod: Obj, gpu_type: str) -> Obj:
    """The `spec` of the merge patch that releases a gated pod onto `gpu_type`: one patch, the
    admission gate goes and the node selector gains the model (allowed while gated)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    rest = [g for g in gates if g.get("name") != ADMISSION_GATE]
    return {"schedulingGates": rest or None, "nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}


def with_model(template: Obj, gpu_type: str) -> Obj:
    """A pod template with the model in its node selector, if it asks for GPUs (a Ray head
    that asks none may run anywhere)."""
    if gpus_asked({"spec": {"template": template}}) is None:
        return template
    spec = dict(template.get("spec") or {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), res.LABEL_GPU_MODEL: gpu_type}
    return {**template, "spec": spec}


def workload_status(wl: Workload) -> dict[str, Any]:
    return wl.obj.get("status") or {}


def label_pods(kind: str, *templates: tuple[str, ...]) -> Callable[[Obj], Patch]:
    """Hold a serving workload: its pod templates (at these paths) gain `alnair.io/workload`,
    so every pod its controller makes is gated at creation (pods.hold.alnair.io) until the
    dispatcher admits the whole workload and takes the gates off. A template path the object
    lacks is skipped (a LeaderWorkerSet without a leader template)."""

    def hold(obj: Obj) -> Patch:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return []  # no name yet: the API server refuses it anyway
        value = workload_label(kind, name)
        patch: Patch = []
        for path in templates:
            template: Any = obj
            for part in path:
                template = template.get(part) if isinstance(template, dict) else None
            if not isinstance(template, dict):
                continue  # absent, or not an object: the API server refuses the latter
            at = "/" + "/".join(path)
            meta = template.get("metadata")
            if not isinstance(meta, dict):
                patch.append({"op": "add", "path": f"{at}/metadata",
                              "value": {"labels": {LABEL_WORKLOAD: value}}})  # fmt: skip
            elif not isinstance(meta.get("labels"), dict):
                patch.append({"op": "add", "path": f"{at}/metadata/labels",
                              "value": {LABEL_WORKLOAD: value}})  # fmt: skip
            else:
                label = LABEL_WORKLOAD.replace("/", "~1")
                patch.append({"op": "add", "path": f"{at}/metadata/labels/{label}", "value": value})
        return patch

    return hold


def no_release(_wl: Workload, _gpu_type: str) -> Obj:
    # Nothing in the spec changes (a template change would roll every pod); the dispatcher
    # takes the gates off its pods, each given the model's node selector, instead.
    return {}


def own_queued(obj: Obj) -> bool:
    """Labelled for a queue, and owned by no controller."""
    return bool(queue_label(obj.get("metadata") or {})) and controller_ref(obj) is None
