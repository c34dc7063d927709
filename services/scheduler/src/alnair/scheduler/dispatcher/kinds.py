"""The kinds of workload the dispatcher queues: one adapter per kind, one core for all.

The core (`controller.Dispatcher`) owns queues, quota, the policy, reservations, explanations,
Events and metrics. An adapter says only what is particular to its kind:

- which objects of the kind go through a queue (`queued`), the same test the admission webhook
  holds them by;
- how its objects are keyed (an ElasticJob and a Job of one name must not collide);
- what it asks of the queue (`parse`: pod sets as a `Workload`);
- when it has finished (`finished`);
- how it is held at creation (`hold`: the admission webhook's JSON Patch), released with the
  chosen GPU model (`release`: the `spec` part of the admission patch) and reclaimed
  (`reclaim`: suspended again, or evicted where the kind cannot be held twice, as a Pod's
  scheduling gate cannot be put back);
- whether the core writes the `alnair.io/Admitted` condition (a Job's status conditions are
  open to other writers; an ElasticJob's belong to its controller).

`docs/admission.md` has the kind-by-behaviour table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from alnair.common import resources as res
from alnair.common.kube import (
    CLUSTERTRAININGRUNTIMES,
    DEPLOYMENTS,
    ELASTICJOBS,
    JOBS,
    JOBSETS,
    LEADERWORKERSETS,
    MPIJOBS,
    PODGROUPS,
    PODS,
    PYTORCHJOBS,
    RAYCLUSTERS,
    RAYJOBS,
    STATEFULSETS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    Obj,
    Resource,
)
from alnair.scheduler.dispatcher import kubeflow_v1
from alnair.scheduler.dispatcher.inference import (
    LWS_API_VERSION,
    parse_deployment,
    parse_leaderworkerset,
    parse_statefulset,
)
from alnair.scheduler.dispatcher.objects import (
    ADMISSION_GATE,
    LABEL_WORKLOAD,
    QUEUE_LABELS,
    Workload,
    controller_ref,
    gpus_asked,
    is_finished,
    parse_pod_workload,
    parse_workload,
    pod_finished,
    pod_key,
    queue_label,
    workload_label,
)
from alnair.scheduler.dispatcher.training import (
    PODGROUP_API_VERSION,
    RAY_API_VERSION,
    RUNTIME,
    TRAINER_API_VERSION,
    elastic_finished,
    elastic_key,
    jobset_finished,
    jobset_key,
    parse_elastic_workload,
    parse_jobset_workload,
    parse_pod_group,
    parse_ray_cluster,
    parse_ray_job,
    parse_train_job,
    pod_group_finished,
    pod_group_of,
    ray_job_finished,
    train_job_finished,
    train_job_pod_sets,
)

Patch = list[dict[str, Any]]
Lookup = Callable[[Resource, str | None, str], Obj | None]
"""An object the dispatcher's informers hold: (resource, namespace or None, name)."""

JOB_CONTROLLER = "kubernetes.io/job-controller"
"""`spec.managedBy` of a Job the built-in Job controller runs (the default)."""
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"


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


def _managed_queued(obj: Obj, controller: str) -> bool:
    """Labelled for a queue, run by `controller` (`spec.managedBy` unset or naming it), and
    owned by no other controller: a JobSet's child Job, or the multi-cluster hub's copy on a
    worker, is admitted with its owner."""
    managed_by = (obj.get("spec") or {}).get("managedBy")
    return (
        bool(queue_label(obj.get("metadata") or {}))
        and managed_by in (None, "", controller)
        and controller_ref(obj) is None
    )


def _job_queued(obj: Obj) -> bool:
    return _managed_queued(obj, JOB_CONTROLLER)


def _jobset_queued(obj: Obj) -> bool:
    return _managed_queued(obj, JOBSET_CONTROLLER)


def _pod_queued(obj: Obj) -> bool:
    """A Pod of its own names its queue with the label. A pod some controller owns (a Job's,
    a ReplicaSet's) is admitted with its owner, and a pod of a PodGroup with its group; never
    on its own."""
    return _own_queued(obj) and pod_group_of(obj) is None


def member_pod(pod: Obj) -> bool:
    """A pod admitted with a whole workload: a serving workload's (its template gave it
    `alnair.io/workload`), or one of a PodGroup's, labelled for a queue and of its own."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_WORKLOAD)) or (_own_queued(pod) and pod_group_of(pod) is not None)


def _own_queued(obj: Obj) -> bool:
    """Labelled for a queue, and owned by no controller."""
    return bool(queue_label(obj.get("metadata") or {})) and controller_ref(obj) is None


def _suspend(obj: Obj) -> Patch:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [{"op": "add", "path": "/spec", "value": {"suspend": True}}]
    if spec.get("suspend") is True:
        return []
    return [{"op": "add", "path": "/spec/suspend", "value": True}]


def _gate(obj: Obj) -> Patch:
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


_JOB_TEMPLATE_LABELS = (
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
)


def _portable_job_spec(spec: Obj) -> Obj:
    """A Job spec without what its API server set for its own Job controller (the selector,
    and the controller's labels on the template), which another cluster's would refuse."""
    spec = {k: v for k, v in spec.items() if k not in ("selector", "manualSelector")}
    template = dict(spec.get("template") or {})
    meta = dict(template.get("metadata") or {})
    labels = meta.get("labels") or {}
    meta["labels"] = {k: v for k, v in labels.items() if k not in _JOB_TEMPLATE_LABELS}
    spec["template"] = {**template, "metadata": meta}
    return spec


def _unsuspend(_wl: Workload, gpu_type: str) -> Obj:
    # The GPU model goes into the pod template while the workload is still suspended: the API
    # server refuses template changes on a Job that has started.
    return {
        "suspend": False,
        "template": {"spec": {"nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}},
    }


def ungated_spec(pod: Obj, gpu_type: str) -> Obj:
    """The `spec` of the merge patch that releases a gated pod onto `gpu_type`: one patch, the
    admission gate goes and the node selector gains the model (allowed while gated)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    rest = [g for g in gates if g.get("name") != ADMISSION_GATE]
    return {"schedulingGates": rest or None, "nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}


def _ungate(wl: Workload, gpu_type: str) -> Obj:
    return ungated_spec(wl.obj, gpu_type)


def _unsuspend_jobset(wl: Workload, gpu_type: str) -> Obj:
    # A merge patch replaces a list whole: every replicated Job, each with the model in its
    # pod template's node selector (JobSet lets a suspended JobSet's pod templates change).
    sets = []
    for rj in (wl.obj.get("spec") or {}).get("replicatedJobs") or []:
        pod_spec = dict(rj["template"]["spec"]["template"].get("spec") or {})
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}),
                                    res.LABEL_GPU_MODEL: gpu_type}  # fmt: skip
        pod_template = {**rj["template"]["spec"]["template"], "spec": pod_spec}
        job_spec = {**rj["template"]["spec"], "template": pod_template}
        sets.append({**rj, "template": {**rj["template"], "spec": job_spec}})
    return {"suspend": False, "replicatedJobs": sets}


def _with_model(template: Obj, gpu_type: str) -> Obj:
    """A pod template with the model in its node selector, if it asks for GPUs (a Ray head
    that asks none may run anywhere)."""
    if gpus_asked({"spec": {"template": template}}) is None:
        return template
    spec = dict(template.get("spec") or {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), res.LABEL_GPU_MODEL: gpu_type}
    return {**template, "spec": spec}


def _ray_cluster_spec(spec: Obj, gpu_type: str) -> Obj:
    """The head and every worker group of a RayCluster spec, the model in the node selector of
    each that asks for GPUs (a merge patch replaces the worker group list whole)."""
    head = spec.get("headGroupSpec") or {}
    return {
        "headGroupSpec": {"template": _with_model(head.get("template") or {}, gpu_type)},
        "workerGroupSpecs": [
            {**g, "template": _with_model(g.get("template") or {}, gpu_type)}
            for g in spec.get("workerGroupSpecs") or []
        ],
    }


def _unsuspend_ray_cluster(wl: Workload, gpu_type: str) -> Obj:
    return {"suspend": False, **_ray_cluster_spec(wl.obj.get("spec") or {}, gpu_type)}


def _unsuspend_ray_job(wl: Workload, gpu_type: str) -> Obj:
    # KubeRay lets a suspended RayJob's cluster spec change (as Kueue does it).
    cluster = (wl.obj.get("spec") or {}).get("rayClusterSpec") or {}
    return {"suspend": False, "rayClusterSpec": _ray_cluster_spec(cluster, gpu_type)}


def _ray_cluster_ready(wl: Workload) -> bool:
    return _status(wl).get("state") == "ready"


def _ray_job_ready(wl: Workload) -> bool:
    """Its cluster came up and the job was submitted (or is already done)."""
    return _status(wl).get("jobDeploymentStatus") in ("Running", "Complete", "Failed")


def _status(wl: Workload) -> dict[str, Any]:
    return wl.obj.get("status") or {}


def _job_ready(wl: Workload) -> bool:
    st = _status(wl)
    return int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= wl.request.pods


def _elastic_ready(wl: Workload) -> bool:
    low = int((wl.obj.get("spec") or {}).get("minReplicas", 1))
    return int(_status(wl).get("readyReplicas") or 0) >= low


def _pod_ready(wl: Workload) -> bool:
    st = _status(wl)
    if st.get("phase") == "Succeeded":
        return True
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
    )


def _jobset_ready(wl: Workload) -> bool:
    """JobSet counts child Jobs: one is ready when its ready and finished pods reach its
    parallelism; all of them, over every replicated Job."""
    jobs = sum(int(rj.get("replicas", 1)) for rj in (wl.obj.get("spec") or {}).get(
        "replicatedJobs") or [])  # fmt: skip
    done = sum(
        int(rj.get("ready") or 0) + int(rj.get("succeeded") or 0)
        for rj in _status(wl).get("replicatedJobsStatus") or []
    )
    return done >= jobs


def _serving_queued(obj: Obj) -> bool:
    """A Deployment or StatefulSet of its own, labelled for a queue, with replicas to run."""
    replicas = (obj.get("spec") or {}).get("replicas", 1)
    return (
        bool(queue_label(obj.get("metadata") or {}))
        and controller_ref(obj) is None
        and replicas != 0
    )


def _label_pods(kind: str, *templates: tuple[str, ...]) -> Callable[[Obj], Patch]:
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


def _no_release(_wl: Workload, _gpu_type: str) -> Obj:
    # Nothing in the spec changes (a template change would roll every pod); the dispatcher
    # takes the gates off its pods, each given the model's node selector, instead.
    return {}


def _serving_ready(wl: Workload) -> bool:
    replicas = int((wl.obj.get("spec") or {}).get("replicas", 1))
    return int(_status(wl).get("readyReplicas") or 0) >= replicas


def _elastic_queued(obj: Obj) -> bool:
    """An ElasticJob names its queue with the label or `spec.queue`."""
    return bool(queue_label(obj.get("metadata") or {}) or (obj.get("spec") or {}).get("queue"))


JOB = WorkloadKind(
    kind="Job",
    api_version="batch/v1",
    resource=JOBS,
    label_selectors=QUEUE_LABELS,
    queued=_job_queued,
    key=lambda namespace, name: f"{namespace}/{name}",
    parse=parse_workload,
    finished=is_finished,
    writes_conditions=True,
    hold=_suspend,
    release=_unsuspend,
    reclaim="suspend",
    ready=_job_ready,
    delegable=True,
    export=_portable_job_spec,
)
ELASTIC = WorkloadKind(
    kind="ElasticJob",
    api_version="alnair.io/v1alpha1",
    resource=ELASTICJOBS,
    label_selectors=(None,),  # `spec.queue` alone queues one too
    queued=_elastic_queued,
    key=elastic_key,
    parse=parse_elastic_workload,
    finished=elastic_finished,
    writes_conditions=False,
    hold=_suspend,
    release=_unsuspend,
    reclaim="suspend",
    ready=_elastic_ready,
)
POD = WorkloadKind(
    kind="Pod",
    api_version="v1",
    resource=PODS,
    label_selectors=QUEUE_LABELS,
    queued=_pod_queued,
    key=pod_key,
    parse=parse_pod_workload,
    finished=pod_finished,
    writes_conditions=False,
    hold=_gate,
    release=_ungate,
    reclaim="evict",
    ready=_pod_ready,
)
JOBSET = WorkloadKind(
    kind="JobSet",
    api_version="jobset.x-k8s.io/v1alpha2",
    resource=JOBSETS,
    label_selectors=QUEUE_LABELS,
    queued=_jobset_queued,
    key=jobset_key,
    parse=parse_jobset_workload,
    finished=jobset_finished,
    writes_conditions=False,
    hold=_suspend,
    release=_unsuspend_jobset,
    reclaim="suspend",
    ready=_jobset_ready,
    optional=True,
    delegable=True,
)


def _serving(
    kind: str,
    api_version: str,
    resource: Resource,
    parse: Callable[[Obj, float], Workload],
    ready: Callable[[Workload], bool],
    *templates: tuple[str, ...],
    optional: bool = False,
) -> WorkloadKind:
    """A serving kind: held by its pods' gates, admitted whole, counted while it runs,
    evicted whole, never written by the dispatcher."""
    return WorkloadKind(
        kind=kind,
        api_version=api_version,
        resource=resource,
        label_selectors=QUEUE_LABELS,
        queued=_serving_queued,
        key=lambda namespace, name: f"{kind.lower()}:{namespace}/{name}",
        parse=parse,
        finished=lambda _obj: None,  # serving: counted for as long as it runs
        writes_conditions=False,
        hold=_label_pods(kind, *(templates or (("spec", "template"),))),
        release=_no_release,
        reclaim="regate",
        ready=ready,
        optional=optional,
        writable=False,
    )


def _lws_ready(wl: Workload) -> bool:
    """LeaderWorkerSet counts groups: ready when every group (leader and workers) is."""
    replicas = int((wl.obj.get("spec") or {}).get("replicas", 1))
    return int(_status(wl).get("readyReplicas") or 0) >= replicas


DEPLOYMENT = _serving("Deployment", "apps/v1", DEPLOYMENTS, parse_deployment, _serving_ready)
STATEFULSET = _serving("StatefulSet", "apps/v1", STATEFULSETS, parse_statefulset, _serving_ready)
LEADERWORKERSET = _serving(
    "LeaderWorkerSet",
    LWS_API_VERSION,
    LEADERWORKERSETS,
    parse_leaderworkerset,
    _lws_ready,
    ("spec", "leaderWorkerTemplate", "leaderTemplate"),
    ("spec", "leaderWorkerTemplate", "workerTemplate"),
    optional=True,
)


def _ray_job_refused(obj: Obj) -> str | None:
    if (obj.get("spec") or {}).get("shutdownAfterJobFinishes") is True:
        return None
    return (
        "spec.shutdownAfterJobFinishes must be true for a queued RayJob: the queue holds it "
        "with spec.suspend, and KubeRay suspends only a RayJob that shuts its cluster down "
        "when it finishes"
    )


RAY_OPERATOR = "ray.io/kuberay-operator"
"""`spec.managedBy` of a RayCluster or RayJob that KubeRay's operator runs (the default)."""
RAYCLUSTER = WorkloadKind(
    kind="RayCluster",
    api_version=RAY_API_VERSION,
    resource=RAYCLUSTERS,
    label_selectors=QUEUE_LABELS,
    queued=lambda obj: _managed_queued(obj, RAY_OPERATOR),  # (a RayJob's is its own)
    key=lambda namespace, name: f"raycluster:{namespace}/{name}",
    parse=parse_ray_cluster,
    finished=lambda _obj: None,  # runs until deleted: counted for as long as it runs
    writes_conditions=False,
    hold=_suspend,
    release=_unsuspend_ray_cluster,
    reclaim="suspend",  # KubeRay deletes its pods
    ready=_ray_cluster_ready,
    optional=True,
    delegable=True,
)
RAYJOB = WorkloadKind(
    kind="RayJob",
    api_version=RAY_API_VERSION,
    resource=RAYJOBS,
    label_selectors=QUEUE_LABELS,
    queued=lambda obj: _managed_queued(obj, RAY_OPERATOR),
    key=lambda namespace, name: f"rayjob:{namespace}/{name}",
    parse=parse_ray_job,
    finished=ray_job_finished,
    writes_conditions=False,
    hold=_suspend,
    release=_unsuspend_ray_job,
    reclaim="suspend",  # KubeRay deletes its cluster and submitter
    ready=_ray_job_ready,
    refuse=_ray_job_refused,
    optional=True,
    delegable=True,
)
TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
"""`spec.managedBy` of a TrainJob that Kubeflow Trainer runs (the default)."""


def _train_job_runtime(obj: Obj, lookup: Lookup) -> Obj:
    """The TrainJob with the runtime it names (`RUNTIME`), if there is one."""
    ref = (obj.get("spec") or {}).get("runtimeRef") or {}
    name = str(ref.get("name") or "")
    if ref.get("kind") == "TrainingRuntime":
        runtime = lookup(TRAININGRUNTIMES, obj["metadata"]["namespace"], name)
    else:
        runtime = lookup(CLUSTERTRAININGRUNTIMES, None, name)
    return {**obj, RUNTIME: runtime} if runtime is not None else obj


def _unsuspend_train_job(wl: Workload, gpu_type: str) -> Obj:
    """Unsuspended, the model given to every replicated Job that asks for GPUs through
    `podSpecOverrides` (Trainer carries them into the JobSet it makes). A merge patch replaces
    the list whole: the user's overrides are kept, an earlier admission's are replaced."""
    spec = wl.obj.get("spec") or {}
    kept = [
        o for o in spec.get("podSpecOverrides") or []
        if res.LABEL_GPU_MODEL not in (o.get("nodeSelector") or {})
    ]  # fmt: skip
    targets = [
        {"name": pod_set.where}
        for pod_set in train_job_pod_sets(wl.obj)
        if pod_set.count and gpus_asked({"spec": {"template": pod_set.template}}) is not None
    ]
    ours = {"targetJobs": targets, "nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}
    return {"suspend": False, "podSpecOverrides": [*kept, ours]}


def _train_job_ready(wl: Workload) -> bool:
    """Every replicated Job Trainer reports has its pods ready (or is done)."""
    jobs = _status(wl).get("jobsStatus") or []
    return bool(jobs) and all(
        int(j.get("ready") or 0) + int(j.get("succeeded") or 0) >= 1 for j in jobs
    )


TRAINJOB = WorkloadKind(
    kind="TrainJob",
    api_version=TRAINER_API_VERSION,
    resource=TRAINJOBS,
    label_selectors=QUEUE_LABELS,
    queued=lambda obj: _managed_queued(obj, TRAINER_CONTROLLER),
    key=lambda namespace, name: f"trainjob:{namespace}/{name}",
    parse=parse_train_job,
    finished=train_job_finished,
    writes_conditions=False,
    hold=_suspend,
    release=_unsuspend_train_job,
    reclaim="suspend",  # Trainer suspends its JobSet, whose Jobs delete their pods
    ready=_train_job_ready,
    references=(CLUSTERTRAININGRUNTIMES, TRAININGRUNTIMES),
    resolve=_train_job_runtime,
    optional=True,
    delegable=True,
)
PODGROUP = WorkloadKind(
    kind="PodGroup",
    api_version=PODGROUP_API_VERSION,
    resource=PODGROUPS,
    label_selectors=QUEUE_LABELS,
    queued=_own_queued,  # (an ElasticJob's PodGroup is its controller's, admitted with it)
    key=lambda namespace, name: f"podgroup:{namespace}/{name}",
    parse=parse_pod_group,
    finished=lambda _obj: None,
    finished_by_pods=pod_group_finished,
    members_first=True,
    writes_conditions=False,
    hold=lambda _obj: [],  # its pods are held, each by its gate
    release=_no_release,
    reclaim="regate",
    ready=lambda _wl: True,  # (the pods-ready timeout is for kinds that record readiness)
    writable=False,
)
"""A PodGroup (`scheduling.x-k8s.io`, Alnair's gang API) of plain pods: admitted whole, as
a serving workload is, by ungating its pods; reclaimed by deleting them (no controller makes
plain pods again: whoever created them does, as with Kueue's plain pod groups)."""


def _kubeflow_v1(kind: str, resource: Resource, field: str) -> WorkloadKind:
    """A Kubeflow v1 training job (`kubeflow_v1.py`): held with `spec.runPolicy.suspend`,
    released with the model in every GPU role's template, reclaimed by suspending it again
    (the training-operator deletes its pods)."""
    return WorkloadKind(
        kind=kind,
        api_version=kubeflow_v1.API_VERSION,
        resource=resource,
        label_selectors=QUEUE_LABELS,
        queued=_own_queued,
        key=kubeflow_v1.key(kind),
        parse=kubeflow_v1.parser(kind, field, resource),
        finished=kubeflow_v1.finished,
        writes_conditions=False,  # (its conditions are the training-operator's)
        hold=kubeflow_v1.hold,
        release=kubeflow_v1.releaser(field),
        reclaim="suspend",
        ready=kubeflow_v1.ready,
        suspension={"runPolicy": {"suspend": True}},
        optional=True,
    )


PYTORCHJOB = _kubeflow_v1("PyTorchJob", PYTORCHJOBS, kubeflow_v1.PYTORCH_REPLICAS)
MPIJOB = _kubeflow_v1("MPIJob", MPIJOBS, kubeflow_v1.MPI_REPLICAS)
_EVERY = (JOB, ELASTIC, POD, JOBSET, DEPLOYMENT, STATEFULSET, LEADERWORKERSET, PODGROUP)
_PEERS = (RAYCLUSTER, RAYJOB, TRAINJOB, PYTORCHJOB, MPIJOB)
KINDS: dict[str, WorkloadKind] = {k.kind: k for k in (*_EVERY, *_PEERS)}
"""Every kind the dispatcher queues, by `kind`."""
DELEGABLE: tuple[WorkloadKind, ...] = tuple(k for k in KINDS.values() if k.delegable)
"""Kinds the multi-cluster hub places on worker clusters (`spec.managedBy`)."""
SERVING = frozenset(k.kind for k in KINDS.values() if k.reclaim == "regate")
"""Kinds held by gating their controller's pods, admitted whole."""
