"""Whose job a pod is, and whether that job is done.

A pod's job is the owner found by walking controller ownerReferences up from it (Pod -> Job;
Pod -> StatefulSet -> ElasticJob; Pod -> ReplicaSet -> Deployment; any CRD), stopping at a
batch Job (a CronJob is a schedule of jobs, not one). `finished` reads an owner's conditions
or phase, whichever its kind has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from alnair.common import resources as res
from alnair.common.events import PodMetric, PodSummary
from alnair.common.kube import ApiError, KubeClient, NotFound, Resource, resource_for
from alnair.common.records import Outcome


@dataclass(frozen=True)
class OwnerRef:
    """The object that stands for a pod's job."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller"):
            return cast(Mapping[str, Any], ref)
    return refs[0] if len(refs) == 1 else None


async def resolve_owner(kube: KubeClient, pod: Mapping[str, Any], max_depth: int = 5) -> OwnerRef:
    """Walk controller ownerReferences up from a pod to the object that is the job."""
    meta = pod.get("metadata", {})
    ns = str(meta.get("namespace", ""))
    current = OwnerRef("v1", "Pod", ns, str(meta.get("name", "")), str(meta.get("uid", "")))
    obj: Mapping[str, Any] = pod
    for _ in range(max_depth):
        ref = controller_of(obj)
        if ref is None:
            break
        current = OwnerRef(
            str(ref.get("apiVersion", "")),
            str(ref.get("kind", "")),
            ns,
            str(ref.get("name", "")),
            str(ref.get("uid", "")),
        )
        if current.kind == "Job" and current.api_version.startswith("batch/"):
            break
        try:
            obj = await kube.get(resource_for(current.api_version, current.kind), current.name, ns)
        except NotFound:
            break
        except ApiError as exc:
            if exc.status != 403:
                raise
            # A kind outside the groups our RBAC may read (deploy/kustomize): its reference
            # already names the owner; only the walk further up stops here.
            break
    return current


def finished(obj: Mapping[str, Any]) -> tuple[Outcome, float | None] | None:
    """Whether an owner object is done, how, and when (None: still running)."""
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if str(cond.get("status")) != "True":
            continue
        kind = cond.get("type")
        when = timestamp(cond.get("lastTransitionTime"))
        if kind in {"Complete", "Succeeded", "Completed"}:
            return "succeeded", timestamp(status.get("completionTime")) or when
        if kind == "Failed":
            return "failed", when
    phase = status.get("phase")
    if phase in {"Succeeded", "Completed"}:
        return "succeeded", timestamp(status.get("completionTime"))
    if phase == "Failed":
        return "failed", None
    return None


def timestamp(text: object) -> float | None:
    """An API time (RFC 3339) in epoch seconds; None when absent."""
    if not text:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def template_gpus(obj: Mapping[str, Any]) -> int:
    """GPUs a workload asks for: per-pod template GPUs times parallelism (0 when unknown)."""
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    per_pod = res.whole_gpus(template, "spec.template.spec")
    width = spec.get("parallelism", spec.get("replicas", 1))
    return per_pod * int(width or 1)


def annotation(obj: Mapping[str, Any], key: str) -> str:
    """An annotation of the object, or of its pod template ("" when neither has it)."""
    ann = obj.get("metadata", {}).get("annotations") or {}
    if key in ann:
        return str(ann[key])
    tmpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata", {}).get(
        "annotations"
    ) or {}
    return str(tmpl.get(key, ""))


def number(text: str) -> float | None:
    """A finite non-negative number, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and math.isfinite(value) else None


def pod_of_summary(item: PodMetric | PodSummary) -> dict[str, Any] | None:
    """The pod as its summary remembers it (the object may be gone): enough to find its owner."""
    if not isinstance(item, PodSummary) or not item.owner_uid:
        return None
    return {
        "metadata": {
            "namespace": item.namespace,
            "name": item.pod,
            "uid": item.pod_uid,
            "ownerReferences": [
                {
                    "apiVersion": item.owner_api_version,
                    "kind": item.owner_kind,
                    "name": item.owner_name,
                    "uid": item.owner_uid,
                    "controller": True,
                }
            ],
        }
    }


def kind_of(resource: Resource) -> str:
    """The kind of an owner read from `resource` when its object does not say."""
    known = {
        "jobs": "Job",
        "elasticjobs": "ElasticJob",
        "trialjobs": "TrialJob",
        "statefulsets": "StatefulSet",
    }
    return known.get(resource.plural, resource.plural)
