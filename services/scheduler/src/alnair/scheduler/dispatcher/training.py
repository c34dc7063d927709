"""Training workloads of other projects as queued workloads: Volcano-style PodGroups of plain
pods, JobSets, KubeRay's RayJobs and RayClusters, Kubeflow Trainer's TrainJobs, and Alnair's
own ElasticJobs. Each parser reads the object as its controller will make pods (every pod set,
its replicas and its GPUs), names the bad field when it cannot, and says when the workload
finished. (Kubeflow v1's PyTorchJob and MPIJob: `kubeflow_v1.py`.)
"""

from __future__ import annotations

from alnair.common import resources as res
from alnair.common.annotations import object_model
from alnair.common.errors import InvalidValueError
from alnair.common.kube import (
    ELASTICJOBS,
    JOBSETS,
    PODGROUPS,
    RAYCLUSTERS,
    RAYJOBS,
    TRAINJOBS,
    Obj,
    Resource,
)
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_TYPE,
    GPU,
    GpuRequest,
    PodSet,
    Workload,
    gpu_model_constraint,
    job_pods,
    pod_finished,
    pod_sets_workload,
    queue_label,
    restart_cost,
    whole_count,
)

PODGROUP_API_VERSION = f"{res.POD_GROUP_API_GROUP}/{res.POD_GROUP_VERSION}"


def pod_group_of(pod: Obj) -> str | None:
    """The PodGroup a pod joins (`scheduling.x-k8s.io/pod-group`), if any."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(res.POD_GROUP_LABEL) or None


def parse_pod_group(obj: Obj, default_restart_cost_s: float) -> Workload:
    """A PodGroup of plain pods as one queued workload, as Volcano enqueues one: `minMember`
    pods asking, all together, the GPUs its `minResources` states (the pods may not all
    exist yet, so the group says what it needs). Its pods are gated until it is admitted
    whole; the per-pod shape the policy places is the GPUs spread evenly, rounded up."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    members = whole_count(spec.get("minMember", 1), "spec.minMember", minimum=1)
    amounts = spec.get("minResources") or {}
    if not isinstance(amounts, dict) or GPU not in amounts:
        raise InvalidValueError(
            "spec.minResources", amounts, f"a queued PodGroup must state the {GPU} it needs in all"
        )
    gpus = whole_count(amounts[GPU], f"spec.minResources.{GPU}", minimum=1)
    annotations = meta.get("annotations") or {}
    return Workload(
        key=f"podgroup:{meta['namespace']}/{meta['name']}",
        obj=obj,
        local_queue=queue_label(meta),
        request=GpuRequest(gpus=gpus, pods=members, gpus_per_pod=-(-gpus // members)),
        features=object_model(obj).present(),
        gpu_model=annotations.get(res.LABEL_GPU_MODEL) or None,
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        resource=PODGROUPS,
        kind="PodGroup",
        api_version=PODGROUP_API_VERSION,
        held=ANN_ADMITTED_TYPE not in annotations,
        # (what the group says it needs in all, as one set; `request.pods` counts its pods)
        pod_sets=(PodSet("spec.minResources", _stated(amounts), 1),),
    )


def _stated(amounts: Obj) -> Obj:
    """A pod template asking `amounts` (a PodGroup's `minResources`, stated for the group)."""
    return {"spec": {"containers": [{"name": "group", "resources": {"requests": amounts}}]}}


def pod_group_finished(group: Obj, pods: list[Obj]) -> str | None:
    """A PodGroup is done when at least `minMember` of its pods exist and every one of them
    finished: `Failed` if any failed, else `Succeeded`."""
    members = (group.get("spec") or {}).get("minMember", 1)
    ends = [pod_finished(p) for p in pods]
    if not pods or len(pods) < (members if isinstance(members, int) else 1) or None in ends:
        return None
    return "Failed" if "Failed" in ends else "Succeeded"


RAY_API_VERSION = "ray.io/v1"


def ray_cluster_pod_sets(spec: Obj, where: str) -> list[PodSet]:
    """A RayCluster spec's pod sets as (field, pod template, pods): its head, and each worker
    group's `replicas` (else `minReplicas`) x `numOfHosts` pods; a suspended group has none."""
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict) or not isinstance(head.get("template"), dict):
        raise InvalidValueError(f"{where}.headGroupSpec.template", None, "a RayCluster needs one")
    sets = [PodSet(f"{where}.headGroupSpec.template", head["template"], 1)]
    groups = spec.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        raise InvalidValueError(f"{where}.workerGroupSpecs", groups, "must be a list")
    for i, group in enumerate(groups):
        at = f"{where}.workerGroupSpecs[{i}]"
        if not isinstance(group, dict) or not isinstance(group.get("template"), dict):
            raise InvalidValueError(f"{at}.template", None, "a worker group needs one")
        replicas = group.get("replicas", group.get("minReplicas", 0))
        count = whole_count(replicas, f"{at}.replicas") * whole_count(
            group.get("numOfHosts", 1), f"{at}.numOfHosts", minimum=1
        )
        if group.get("suspend") is True:
            count = 0
        sets.append(PodSet(f"{at}.template", group["template"], count))
    return sets


def _parse_ray(obj: Obj, cluster_spec: Obj, where: str, kind: str, resource: Resource,
               default_restart_cost_s: float) -> Workload:  # fmt: skip
    """A RayCluster (or a RayJob's) as one queued workload: every pod set at once; a head that
    asks no GPU counts for nothing; the per-pod shape placed is the largest; whole GPUs only."""
    meta = obj["metadata"]
    return pod_sets_workload(
        obj, ray_cluster_pod_sets(cluster_spec, where),
        key=f"{kind.lower()}:{meta['namespace']}/{meta['name']}", kind=kind,
        api_version=RAY_API_VERSION, resource=resource,
        held=bool((obj.get("spec") or {}).get("suspend")),
        default_restart_cost_s=default_restart_cost_s,
        none_field=f"{where}.workerGroupSpecs[].template.spec.containers[].resources",
        none_reason=f"a queued {kind} must ask for {GPU} in its head or a worker group",
    )  # fmt: skip


def parse_ray_cluster(obj: Obj, default_restart_cost_s: float) -> Workload:
    return _parse_ray(obj, obj.get("spec") or {}, "spec", "RayCluster", RAYCLUSTERS,
                      default_restart_cost_s)  # fmt: skip


def parse_ray_job(obj: Obj, default_restart_cost_s: float) -> Workload:
    """A RayJob asks for the cluster it creates (`rayClusterSpec`); its submitter pod asks no
    GPU. One that runs on an existing cluster (`clusterSelector`) is not queued on its own:
    the cluster is the workload."""
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec")
    if not isinstance(cluster, dict):
        raise InvalidValueError(
            "spec.rayClusterSpec", None,
            "a queued RayJob creates its own cluster (queue the RayCluster a clusterSelector "
            "names instead)",
        )  # fmt: skip
    return _parse_ray(obj, cluster, "spec.rayClusterSpec", "RayJob", RAYJOBS,
                      default_restart_cost_s)  # fmt: skip


def ray_job_finished(obj: Obj) -> str | None:
    status = str((obj.get("status") or {}).get("jobDeploymentStatus") or "")
    if status == "Complete":
        return "Complete"
    return "Failed" if status in ("Failed", "ValidationFailed") else None


TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINER_STEP = "trainer.kubeflow.org/trainjob-ancestor-step"
"""On a runtime's replicated Job: `trainer` for the one the TrainJob's `spec.trainer` shapes."""
RUNTIME = "alnair.io/runtime"
"""Key under which the dispatcher hands a TrainJob's adapter the runtime it names (resolved from
its informers; never on the object in the API)."""


def train_job_pod_sets(obj: Obj) -> list[PodSet]:
    """A TrainJob's pod sets as (replicated Job, pod template, pods), from the runtime it names
    (`RUNTIME`) shaped by its `spec.trainer`: the trainer Job runs `numNodes` pods (else the
    runtime's `mlPolicy.numNodes`), each asking `resourcesPerNode` where given; the others
    (dataset and model initializers) run as the runtime says."""
    spec = obj.get("spec") or {}
    ref = (spec.get("runtimeRef") or {}).get("name")
    runtime = obj.get(RUNTIME)
    if not isinstance(runtime, dict):
        kind = (spec.get("runtimeRef") or {}).get("kind") or "ClusterTrainingRuntime"
        raise InvalidValueError("spec.runtimeRef.name", ref, f"no {kind} of that name")
    rt_spec = runtime.get("spec") or {}
    trainer = spec.get("trainer") or {}
    sets: list[PodSet] = []
    jobs = ((rt_spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for i, rj in enumerate(jobs):
        name = str(rj.get("name") or f"#{i}")
        job_template = rj.get("template") or {}
        job_spec = job_template.get("spec") or {}
        template = job_spec.get("template") or {}
        labels = (job_template.get("metadata") or {}).get("labels") or {}
        pods = whole_count(rj.get("replicas", 1), f"replicatedJobs[{name}].replicas") * whole_count(
            job_spec.get("parallelism", 1), f"replicatedJobs[{name}].parallelism"
        )
        if labels.get(TRAINER_STEP) == "trainer" or name == "node":
            nodes = trainer.get("numNodes", (rt_spec.get("mlPolicy") or {}).get("numNodes", 1))
            pods = whole_count(nodes, "spec.trainer.numNodes", minimum=1)
            per_node = trainer.get("resourcesPerNode")
            if isinstance(per_node, dict):
                pod_spec = dict(template.get("spec") or {})
                containers = list(pod_spec.get("containers") or [{"name": "node"}])
                containers[0] = {**containers[0], "resources": per_node}
                template = {**template, "spec": {**pod_spec, "containers": containers}}
        sets.append(PodSet(name, template, pods))
    return sets


def parse_train_job(obj: Obj, default_restart_cost_s: float) -> Workload:
    """A Kubeflow TrainJob as one queued workload: every replicated Job of its runtime at once
    (`train_job_pod_sets`); Jobs without GPUs count for nothing; the per-pod shape placed is
    the largest; whole GPUs only."""
    meta = obj["metadata"]

    def field_of(pod_set: PodSet, field: str) -> str:
        where = "spec.trainer.resourcesPerNode" if "resources" in field else field
        return f"{where} ({pod_set.where})"

    return pod_sets_workload(
        obj, train_job_pod_sets(obj),
        key=f"trainjob:{meta['namespace']}/{meta['name']}", kind="TrainJob",
        api_version=TRAINER_API_VERSION, resource=TRAINJOBS,
        held=bool((obj.get("spec") or {}).get("suspend")),
        default_restart_cost_s=default_restart_cost_s, field_of=field_of,
        none_field="spec.trainer.resourcesPerNode",
        none_reason=f"a queued TrainJob must ask for {GPU} (here or in its runtime's trainer Job)",
    )  # fmt: skip


def train_job_finished(obj: Obj) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


def jobset_key(namespace: str, name: str) -> str:
    return f"jobset:{namespace}/{name}"


def parse_jobset_workload(obj: Obj, default_restart_cost_s: float) -> Workload:
    """A JobSet as one queued workload: every replicated Job's pods, all running at once
    (`replicas` x `parallelism` each). Replicated Jobs that ask for no GPU (a coordinator)
    count for nothing; the per-pod shape the policy places is the largest one asked."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    sets = spec.get("replicatedJobs")
    if not isinstance(sets, list) or not sets:
        raise InvalidValueError("spec.replicatedJobs", sets, "a JobSet needs replicated Jobs")
    pod_sets = []
    for i, rj in enumerate(sets):
        where = f"spec.replicatedJobs[{i}]"
        replicas = whole_count(rj.get("replicas", 1), f"{where}.replicas", minimum=0)
        job_spec = (rj.get("template") or {}).get("spec") or {}
        pods = job_pods(job_spec, f"{where}.template.spec")
        template = job_spec.get("template") or {}
        pod_sets.append(PodSet(f"{where}.template.spec.template", template, replicas * pods))
    return pod_sets_workload(
        obj, pod_sets,
        key=jobset_key(meta["namespace"], meta["name"]), kind="JobSet",
        api_version="jobset.x-k8s.io/v1alpha2", resource=JOBSETS, held=bool(spec.get("suspend")),
        default_restart_cost_s=default_restart_cost_s,
        none_field="spec.replicatedJobs[].template.spec.template.spec.containers[].resources",
        none_reason=f"a queued JobSet must ask for {GPU} in at least one replicated Job",
    )  # fmt: skip


def jobset_finished(obj: Obj) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


def elastic_key(namespace: str, name: str) -> str:
    """ElasticJobs and Jobs share the queue: their keys must not collide."""
    return f"elasticjob:{namespace}/{name}"


def parse_elastic_workload(obj: Obj, default_restart_cost_s: float) -> Workload:
    """An ElasticJob as a queued workload: admitted at its minimum size (the guaranteed part);
    the workers the controller adds above it count as borrowed quota (issue 14, point 4)."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    low = whole_count(spec.get("minReplicas", 1), "spec.minReplicas", minimum=1)
    per_worker = whole_count(spec.get("gpusPerWorker", 1), "spec.gpusPerWorker", minimum=1)
    current = whole_count(
        (obj.get("status") or {}).get("currentReplicas", 0), "status.currentReplicas"
    )
    job_like = {"metadata": meta, "spec": {"template": spec.get("template") or {}}}
    return Workload(
        key=elastic_key(meta["namespace"], meta["name"]),
        obj=obj,
        local_queue=queue_label(meta) or str(spec.get("queue") or ""),
        request=GpuRequest(gpus=low * per_worker, pods=low, gpus_per_pod=per_worker),
        features=object_model(obj).present(),
        gpu_model=gpu_model_constraint(job_like),
        restart_cost_s=default_restart_cost_s,
        resource=ELASTICJOBS,
        kind="ElasticJob",
        api_version="alnair.io/v1alpha1",
        surplus_gpus=max(0, current - low) * per_worker,
        held=bool(spec.get("suspend")),
        pod_sets=(PodSet("spec.template", spec.get("template") or {}, low),),
    )


def elastic_finished(obj: Obj) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase in ("Succeeded", "Failed") else None
