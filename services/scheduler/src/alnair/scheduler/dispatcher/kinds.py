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

`docs/admission.md` has the kind-by-behaviour table. The `WorkloadKind` type and what several
adapters share are in `workload_kind.py`; the adapters for KubeRay and Kubeflow in
`peer_kinds.py`; this module holds the others and the registry (`KINDS`).
"""

from __future__ import annotations

from collections.abc import Callable

from alnair.common import resources as res
from alnair.common.kube import (
    DEPLOYMENTS,
    ELASTICJOBS,
    JOBS,
    JOBSETS,
    LEADERWORKERSETS,
    PODGROUPS,
    PODS,
    STATEFULSETS,
    Obj,
    Resource,
)
from alnair.scheduler.dispatcher.dra_claims import REFERENCES, with_claims
from alnair.scheduler.dispatcher.inference import (
    LWS_API_VERSION,
    parse_deployment,
    parse_leaderworkerset,
    parse_statefulset,
)
from alnair.scheduler.dispatcher.kueue_workload import WORKLOAD
from alnair.scheduler.dispatcher.parsing import (
    LABEL_WORKLOAD,
    QUEUE_LABELS,
    Workload,
    carried_model_annotations,
    controller_ref,
    is_finished,
    parse_pod_workload,
    parse_workload,
    pod_finished,
    pod_key,
    queue_label,
)
from alnair.scheduler.dispatcher.peer_kinds import MPIJOB, PYTORCHJOB, RAYCLUSTER, RAYJOB, TRAINJOB
from alnair.scheduler.dispatcher.training import (
    PODGROUP_API_VERSION,
    elastic_finished,
    elastic_key,
    jobset_finished,
    jobset_key,
    parse_elastic_workload,
    parse_jobset_workload,
    parse_pod_group,
    pod_group_finished,
    pod_group_of,
)
from alnair.scheduler.dispatcher.workload_kind import (
    JOB_CONTROLLER,
    JOBSET_CONTROLLER,
    WorkloadKind,
    gate_patch,
    label_pods,
    managed_queued,
    no_release,
    own_queued,
    suspend_patch,
    ungated_spec,
    workload_status,
)


def _job_queued(obj: Obj) -> bool:
    return managed_queued(obj, JOB_CONTROLLER)


def _jobset_queued(obj: Obj) -> bool:
    return managed_queued(obj, JOBSET_CONTROLLER)


def _pod_queued(obj: Obj) -> bool:
    """A Pod of its own names its queue with the label. A pod some controller owns (a Job's,
    a ReplicaSet's) is admitted with its owner, and a pod of a PodGroup with its group; never
    on its own."""
    return own_queued(obj) and pod_group_of(obj) is None


def member_pod(pod: Obj) -> bool:
    """A pod admitted with a whole workload: a serving workload's (its template gave it
    `alnair.io/workload`), or one of a PodGroup's, labelled for a queue and of its own."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_WORKLOAD)) or (own_queued(pod) and pod_group_of(pod) is not None)


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


def _unsuspend(wl: Workload, gpu_type: str) -> Obj:
    # The GPU model goes into the pod template while the workload is still suspended: the API
    # server refuses template changes on a Job that has started. So do the model annotations
    # the workload carries and its template lacks: the binder reads what a pod trains from the
    # pod (co-location interference), and pods do not inherit their Job's annotations.
    template: Obj = {"spec": {"nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}}
    carried = carried_model_annotations(wl.obj)
    if carried:
        template["metadata"] = {"annotations": carried}
    return {"suspend": False, "template": template}


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


def _job_ready(wl: Workload) -> bool:
    st = workload_status(wl)
    return int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= wl.request.pods


def _elastic_ready(wl: Workload) -> bool:
    low = int((wl.obj.get("spec") or {}).get("minReplicas", 1))
    return int(workload_status(wl).get("readyReplicas") or 0) >= low


def _pod_ready(wl: Workload) -> bool:
    st = workload_status(wl)
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
        for rj in workload_status(wl).get("replicatedJobsStatus") or []
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


def _serving_ready(wl: Workload) -> bool:
    replicas = int((wl.obj.get("spec") or {}).get("replicas", 1))
    return int(workload_status(wl).get("readyReplicas") or 0) >= replicas


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
    hold=suspend_patch,
    release=_unsuspend,
    reclaim="suspend",
    ready=_job_ready,
    references=REFERENCES,
    resolve=with_claims,
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
    hold=suspend_patch,
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
    hold=gate_patch,
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
    hold=suspend_patch,
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
        hold=label_pods(kind, *(templates or (("spec", "template"),))),
        release=no_release,
        reclaim="regate",
        ready=ready,
        optional=optional,
        writable=False,
    )


def _lws_ready(wl: Workload) -> bool:
    """LeaderWorkerSet counts groups: ready when every group (leader and workers) is."""
    replicas = int((wl.obj.get("spec") or {}).get("replicas", 1))
    return int(workload_status(wl).get("readyReplicas") or 0) >= replicas


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


PODGROUP = WorkloadKind(
    kind="PodGroup",
    api_version=PODGROUP_API_VERSION,
    resource=PODGROUPS,
    label_selectors=QUEUE_LABELS,
    queued=own_queued,  # (an ElasticJob's PodGroup is its controller's, admitted with it)
    key=lambda namespace, name: f"podgroup:{namespace}/{name}",
    parse=parse_pod_group,
    finished=lambda _obj: None,
    finished_by_pods=pod_group_finished,
    members_first=True,
    writes_conditions=False,
    hold=lambda _obj: [],  # its pods are held, each by its gate
    release=no_release,
    reclaim="regate",
    ready=lambda _wl: True,  # (the pods-ready timeout is for kinds that record readiness)
    writable=False,
)
"""A PodGroup (`scheduling.x-k8s.io`, Alnair's gang API) of plain pods: admitted whole, as
a serving workload is, by ungating its pods; reclaimed by deleting them (no controller makes
plain pods again: whoever created them does, as with Kueue's plain pod groups)."""


_EVERY = (JOB, ELASTIC, POD, JOBSET, DEPLOYMENT, STATEFULSET, LEADERWORKERSET, PODGROUP)
_PEERS = (RAYCLUSTER, RAYJOB, TRAINJOB, PYTORCHJOB, MPIJOB, WORKLOAD)
KINDS: dict[str, WorkloadKind] = {k.kind: k for k in (*_EVERY, *_PEERS)}
"""Every kind the dispatcher queues, by `kind`."""
DELEGABLE: tuple[WorkloadKind, ...] = tuple(k for k in KINDS.values() if k.delegable)
"""Kinds the multi-cluster hub places on worker clusters (`spec.managedBy`)."""
SERVING = frozenset(k.kind for k in KINDS.values() if k.reclaim == "regate")
"""Kinds held by gating their controller's pods, admitted whole."""
