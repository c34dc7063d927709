"""Serving workloads as queued workloads: Deployments, StatefulSets and LeaderWorkerSets,
admitted whole (every replica of every template) and counted for as long as they run. They
are held through their pods, which are created gated (`serving.py` reads them back).
"""

from __future__ import annotations

from dataclasses import replace

from alnair.common import resources as res
from alnair.common.annotations import object_model
from alnair.common.errors import InvalidValueError
from alnair.common.kube import (
    DEPLOYMENTS,
    LEADERWORKERSETS,
    STATEFULSETS,
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
    gpu_request,
    pod_sets_request,
    queue_label,
    restart_cost,
    whole_count,
)


def parse_serving_workload(
    obj: Obj, default_restart_cost_s: float, *, kind: str, resource: Resource
) -> Workload:
    """A Deployment or StatefulSet as one queued workload: admitted whole, `replicas` pods of
    its template's GPUs, counted for as long as it runs. It is held until admitted (its pods
    are gated); there is nothing to suspend."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    replicas = whole_count(spec.get("replicas", 1), "spec.replicas", minimum=0)
    job_like = {"metadata": meta, "spec": {"parallelism": max(1, replicas),
                                           "template": spec.get("template") or {}}}  # fmt: skip
    request = gpu_request(job_like)
    if replicas == 0:
        request = GpuRequest(gpus=0, pods=0, gpus_per_pod=request.gpus_per_pod)
    annotations = meta.get("annotations") or {}
    return Workload(
        key=f"{kind.lower()}:{meta['namespace']}/{meta['name']}",
        obj=obj,
        local_queue=queue_label(meta),
        request=request,
        features=object_model(obj).present(),
        gpu_model=gpu_model_constraint(job_like),
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        resource=resource,
        kind=kind,
        api_version="apps/v1",
        held=ANN_ADMITTED_TYPE not in annotations,
        pod_sets=(PodSet("spec.template", spec.get("template") or {}, replicas),),
    )


LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


def parse_leaderworkerset(obj: Obj, default_restart_cost_s: float) -> Workload:
    """A LeaderWorkerSet as one queued serving workload: `replicas` groups of `size` pods (a
    leader from `leaderTemplate`, or the worker template when it has none, and `size - 1`
    workers), admitted whole and counted for as long as it runs, like a Deployment. Every pod
    is gated, so every pod counts; the per-pod shape the policy places is the largest."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    replicas = whole_count(spec.get("replicas", 1), "spec.replicas", minimum=0)
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, dict) or not isinstance(lwt.get("workerTemplate"), dict):
        raise InvalidValueError(
            "spec.leaderWorkerTemplate.workerTemplate", None, "a LeaderWorkerSet needs one"
        )
    size = whole_count(lwt.get("size", 1), "spec.leaderWorkerTemplate.size", minimum=1)
    worker = lwt["workerTemplate"]
    leader = lwt.get("leaderTemplate") if isinstance(lwt.get("leaderTemplate"), dict) else None
    at = "spec.leaderWorkerTemplate"
    roles = [
        PodSet(f"{at}.{'leaderTemplate' if leader else 'workerTemplate'}", leader or worker, 1)
    ]
    if size > 1:
        roles.append(PodSet(f"{at}.workerTemplate", worker, size - 1))
    group, model = pod_sets_request(
        meta, roles, "LeaderWorkerSet",
        none_field=f"{at}.workerTemplate.spec.containers[].resources",
        none_reason=f"a queued LeaderWorkerSet must ask for {GPU} in its leader or worker template",
    )  # fmt: skip
    annotations = meta.get("annotations") or {}
    return Workload(
        key=f"leaderworkerset:{meta['namespace']}/{meta['name']}",
        obj=obj,
        local_queue=queue_label(meta),
        request=GpuRequest(
            gpus=replicas * group.gpus, pods=replicas * size, gpus_per_pod=group.gpus_per_pod
        ),
        features=object_model(obj).present(),
        gpu_model=annotations.get(res.LABEL_GPU_MODEL) or model,
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        resource=LEADERWORKERSETS,
        kind="LeaderWorkerSet",
        api_version=LWS_API_VERSION,
        held=ANN_ADMITTED_TYPE not in annotations,
        pod_sets=tuple(replace(r, count=r.count * replicas) for r in roles),
    )


def parse_deployment(obj: Obj, default_restart_cost_s: float) -> Workload:
    return parse_serving_workload(
        obj, default_restart_cost_s, kind="Deployment", resource=DEPLOYMENTS
    )


def parse_statefulset(obj: Obj, default_restart_cost_s: float) -> Workload:
    return parse_serving_workload(
        obj, default_restart_cost_s, kind="StatefulSet", resource=STATEFULSETS
    )
