"""Kubeflow's v1 training jobs (`kubeflow.org/v1`, run by the training-operator): PyTorchJob
and MPIJob, as the queue reads them.

Both keep their pod sets in a map of replica specs by role (`pytorchReplicaSpecs`: Master and
Worker; `mpiReplicaSpecs`: Launcher and Worker), each `replicas` pods of one template, and are
held with `spec.runPolicy.suspend` (the training-operator deletes a suspended job's pods and
creates them again, from the templates as they are then, when it is resumed). The adapters in
`kinds.py` are built from these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj, Resource
from alnair.scheduler.dispatcher.parsing import (
    GPU,
    PodSet,
    Workload,
    gpus_asked,
    pod_sets_workload,
    whole_count,
)

API_VERSION = "kubeflow.org/v1"
PYTORCH_REPLICAS = "pytorchReplicaSpecs"
MPI_REPLICAS = "mpiReplicaSpecs"

Patch = list[dict[str, Any]]


def replica_pod_sets(obj: Obj, field: str) -> list[PodSet]:
    """The job's pod sets, one per role (sorted, so the order is stable): `replicas` (default
    1) pods of its template. InvalidValueError names the field."""
    specs = (obj.get("spec") or {}).get(field)
    if not isinstance(specs, dict) or not specs:
        raise InvalidValueError(f"spec.{field}", specs, "needs at least one replica spec")
    sets = []
    for role in sorted(specs):
        at = f"spec.{field}.{role}"
        spec = specs[role]
        if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
            raise InvalidValueError(f"{at}.template", None, "a replica spec needs a pod template")
        count = whole_count(spec.get("replicas", 1), f"{at}.replicas")
        sets.append(PodSet(f"{at}.template", spec["template"], count))
    return sets


def parser(kind: str, field: str, resource: Resource) -> Callable[[Obj, float], Workload]:
    """`parse` for one kind: every role's pods at once; a role asking no GPU (an MPI launcher)
    counts for nothing; the per-pod shape placed is the largest; whole GPUs only."""

    def parse(obj: Obj, default_restart_cost_s: float) -> Workload:
        meta = obj["metadata"]
        return pod_sets_workload(
            obj, replica_pod_sets(obj, field),
            key=key(kind)(meta["namespace"], meta["name"]), kind=kind,
            api_version=API_VERSION, resource=resource, held=suspended(obj),
            default_restart_cost_s=default_restart_cost_s,
            none_field=f"spec.{field}.*.template.spec.containers[].resources",
            none_reason=f"a queued {kind} must ask for {GPU} in at least one replica spec",
        )  # fmt: skip

    return parse


def key(kind: str) -> Callable[[str, str], str]:
    prefix = kind.lower()
    return lambda namespace, name: f"{prefix}:{namespace}/{name}"


def suspended(obj: Obj) -> bool:
    return bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def hold(obj: Obj) -> Patch:
    """Suspend it at creation through its run policy."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [{"op": "add", "path": "/spec", "value": {"runPolicy": {"suspend": True}}}]
    policy = spec.get("runPolicy")
    if not isinstance(policy, dict):
        return [{"op": "add", "path": "/spec/runPolicy", "value": {"suspend": True}}]
    if policy.get("suspend") is True:
        return []
    return [{"op": "add", "path": "/spec/runPolicy/suspend", "value": True}]


def releaser(field: str) -> Callable[[Workload, str], Obj]:
    """`release`: resumed, the model in the node selector of every role that asks for GPUs (a
    merge patch merges the role map key by key, so only those roles' templates are named)."""

    def release(wl: Workload, gpu_type: str) -> Obj:
        roles: dict[str, Obj] = {}
        for role, spec in ((wl.obj.get("spec") or {}).get(field) or {}).items():
            template = (spec or {}).get("template") or {}
            if gpus_asked({"spec": {"template": template}}) is None:
                continue
            roles[role] = {"template": {"spec": {"nodeSelector": {res.LABEL_GPU_MODEL: gpu_type}}}}
        return {"runPolicy": {"suspend": False}, field: roles}

    return release


def _condition(obj: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def finished(obj: Obj) -> str | None:
    """`Succeeded` or `Failed` once the training-operator says so."""
    for kind in ("Succeeded", "Failed"):
        if _condition(obj, kind):
            return kind
    return None


def ready(wl: Workload) -> bool:
    """The training-operator says it runs (or it is done already)."""
    return any(_condition(wl.obj, kind) for kind in ("Running", "Succeeded", "Failed"))
