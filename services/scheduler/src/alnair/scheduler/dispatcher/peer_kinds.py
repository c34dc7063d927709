"""Adapters for the workloads of KubeRay (RayCluster, RayJob), Kubeflow Trainer (TrainJob)
and the Kubeflow training-operator v1 (PyTorchJob, MPIJob): each held by its own suspend
field, released with the chosen GPU model in every GPU pod template, and reclaimed by
suspending it again. Each is queued only where its project's CRD is served.
"""

from __future__ import annotations

from alnair.common import resources as res
from alnair.common.kube import (
    CLUSTERTRAININGRUNTIMES,
    MPIJOBS,
    PYTORCHJOBS,
    RAYCLUSTERS,
    RAYJOBS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    Obj,
    Resource,
)
from alnair.scheduler.dispatcher import kubeflow_v1
from alnair.scheduler.dispatcher.parsing import (
    QUEUE_LABELS,
    Workload,
    gpus_asked,
)
from alnair.scheduler.dispatcher.training import (
    RAY_API_VERSION,
    RUNTIME,
    TRAINER_API_VERSION,
    parse_ray_cluster,
    parse_ray_job,
    parse_train_job,
    ray_job_finished,
    train_job_finished,
    train_job_pod_sets,
)
from alnair.scheduler.dispatcher.workload_kind import (
    Lookup,
    WorkloadKind,
    managed_queued,
    own_queued,
    suspend_patch,
    with_model,
    workload_status,
)


def _ray_cluster_spec(spec: Obj, gpu_type: str) -> Obj:
    """The head and every worker group of a RayCluster spec, the model in the node selector of
    each that asks for GPUs (a merge patch replaces the worker group list whole)."""
    head = spec.get("headGroupSpec") or {}
    return {
        "headGroupSpec": {"template": with_model(head.get("template") or {}, gpu_type)},
        "workerGroupSpecs": [
            {**g, "template": with_model(g.get("template") or {}, gpu_type)}
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
    return workload_status(wl).get("state") == "ready"


def _ray_job_ready(wl: Workload) -> bool:
    """Its cluster came up and the job was submitted (or is already done)."""
    return workload_status(wl).get("jobDeploymentStatus") in ("Running", "Complete", "Failed")


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
    queued=lambda obj: managed_queued(obj, RAY_OPERATOR),  # (a RayJob's is its own)
    key=lambda namespace, name: f"raycluster:{namespace}/{name}",
    parse=parse_ray_cluster,
    finished=lambda _obj: None,  # runs until deleted: counted for as long as it runs
    writes_conditions=False,
    hold=suspend_patch,
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
    queued=lambda obj: managed_queued(obj, RAY_OPERATOR),
    key=lambda namespace, name: f"rayjob:{namespace}/{name}",
    parse=parse_ray_job,
    finished=ray_job_finished,
    writes_conditions=False,
    hold=suspend_patch,
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
    jobs = workload_status(wl).get("jobsStatus") or []
    return bool(jobs) and all(
        int(j.get("ready") or 0) + int(j.get("succeeded") or 0) >= 1 for j in jobs
    )


TRAINJOB = WorkloadKind(
    kind="TrainJob",
    api_version=TRAINER_API_VERSION,
    resource=TRAINJOBS,
    label_selectors=QUEUE_LABELS,
    queued=lambda obj: managed_queued(obj, TRAINER_CONTROLLER),
    key=lambda namespace, name: f"trainjob:{namespace}/{name}",
    parse=parse_train_job,
    finished=train_job_finished,
    writes_conditions=False,
    hold=suspend_patch,
    release=_unsuspend_train_job,
    reclaim="suspend",  # Trainer suspends its JobSet, whose Jobs delete their pods
    ready=_train_job_ready,
    references=(CLUSTERTRAININGRUNTIMES, TRAININGRUNTIMES),
    resolve=_train_job_runtime,
    optional=True,
    delegable=True,
)


def _kubeflow_v1(kind: str, resource: Resource, field: str) -> WorkloadKind:
    """A Kubeflow v1 training job (`kubeflow_v1.py`): held with `spec.runPolicy.suspend`,
    released with the model in every GPU role's template, reclaimed by suspending it again
    (the training-operator deletes its pods)."""
    return WorkloadKind(
        kind=kind,
        api_version=kubeflow_v1.API_VERSION,
        resource=resource,
        label_selectors=QUEUE_LABELS,
        queued=own_queued,
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
