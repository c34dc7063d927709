"""GPUs a queued workload asks through Dynamic Resource Allocation, counted in its queue's quota.

A pod template may ask for Alnair's GPUs without `nvidia.com/gpu`: it names a
ResourceClaimTemplate (one claim per pod, made by kube-controller-manager) or an existing
ResourceClaim in `spec.resourceClaims`, whose device requests name Alnair's DeviceClasses
(`alnair.common.dra`). The queue must count those GPUs as it counts the extended resources, or
a team could run past its quota by writing its GPUs as claims.

`with_claims` gives the parser a copy of the workload in which each pod template's claims are
written as the container requests the queue already reads: `count` devices of the whole-GPU
class as `nvidia.com/gpu`, one share of the shared class as `alnair.io/gpu-memory` (MiB, its
`memory` capacity request). The object itself is never changed. A claim of another driver's
class asks nothing of the queue. What cannot be counted is refused, naming the field: a
template or claim that does not exist (yet: its arrival wakes the dispatcher), a share
without a memory request, more than one share per pod.

An existing ResourceClaim named by every pod is one set of devices they share: it is counted
once per pod template, as the pods of a Job share it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from alnair.common import dra
from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj, Resource

Lookup = Callable[[Resource, str | None, str], Obj | None]
REFERENCES = (dra.RESOURCECLAIMTEMPLATES, dra.RESOURCECLAIMS)
MIB = Decimal(2**20)


_SOURCES = (
    ("resourceClaimTemplateName", dra.RESOURCECLAIMTEMPLATES, "ResourceClaimTemplate"),
    ("resourceClaimName", dra.RESOURCECLAIMS, "ResourceClaim"),
)
"""How a pod names its claim: (field, the object it names, that object's kind)."""


def _device_requests(source: Obj) -> list[Obj]:
    devices = (source.get("spec") or {}).get("devices") or {}
    return list(devices.get("requests") or [])


def _asked(requests: list[Obj], where: str) -> tuple[int, int]:
    """(whole GPUs, MiB of one share) Alnair's classes are asked for in these requests."""
    whole, share = 0, 0
    for r, req in enumerate(requests):
        exact = req.get("exactly") or {}
        at = f"{where}.requests[{r}]"
        if not exact:
            if any(
                (a.get("deviceClassName") in dra.CLASSES) for a in req.get("firstAvailable") or []
            ):
                raise InvalidValueError(
                    f"{at}.firstAvailable", req.get("name"), "not counted: use exactly"
                )
            continue
        cls = exact.get("deviceClassName")
        if cls not in dra.CLASSES:
            continue  # another driver's devices: nothing of the queue's
        if exact.get("allocationMode", "ExactCount") != "ExactCount":
            raise InvalidValueError(
                f"{at}.exactly.allocationMode", exact.get("allocationMode"), "not counted: "
                "the queue needs a count (ExactCount)"
            )  # fmt: skip
        count = int(exact.get("count", 1))
        if cls == dra.CLASS_WHOLE:
            whole += count
            continue
        memory = ((exact.get("capacity") or {}).get("requests") or {}).get(dra.CAPACITY_MEMORY)
        if memory is None:
            raise InvalidValueError(
                f"{at}.exactly.capacity.requests.{dra.CAPACITY_MEMORY}", None,
                "a GPU share counts in its queue by its memory: name it",
            )  # fmt: skip
        if count != 1 or share:
            raise InvalidValueError(f"{at}.exactly.count", count, "one GPU share per pod")
        mib = res.parse_quantity(memory, f"{at}.exactly.capacity.requests.memory") / MIB
        share = max(1, int(mib.to_integral_value(rounding="ROUND_CEILING")))
    return whole, share


def _template_asks(template: Obj, where: str, namespace: str, lookup: Lookup) -> Obj:
    """The pod template with its claims' GPUs written as container requests."""
    spec = template.get("spec") or {}
    claims = spec.get("resourceClaims") or []
    if not claims:
        return template
    whole, share = 0, 0
    for c, claim in enumerate(claims):
        at = f"{where}.spec.resourceClaims[{c}]"
        source = next((r for r in _SOURCES if claim.get(r[0])), None)
        if source is None:
            continue
        field, resource, kind = source
        found = lookup(resource, namespace, claim[field])
        if found is None:
            raise InvalidValueError(f"{at}.{field}", claim[field], f"no {kind} of that name")
        # (a template holds its claim's spec one level down)
        claim_obj = found if kind == "ResourceClaim" else (found.get("spec") or {})
        requests = _device_requests(claim_obj)
        w, s = _asked(requests, f"{at} devices")
        if s and share:
            raise InvalidValueError(at, claim.get("name"), "one GPU share per pod")
        whole, share = whole + w, share or s
    if not whole and not share:
        return template
    out = copy.deepcopy(template)
    containers = out.setdefault("spec", {}).setdefault("containers", [])
    if not containers:
        raise InvalidValueError(f"{where}.spec.containers", [], "a pod needs a container")
    limits: dict[str, Any] = containers[0].setdefault("resources", {}).setdefault("limits", {})
    if whole:
        limits[res.GPU] = str(int(res.parse_quantity(limits.get(res.GPU, 0))) + whole)
    if share:
        limits[res.GPU_MEMORY] = str(share)
    return out


def with_claims(job: Obj, lookup: Lookup) -> Obj:
    """A Job as the queue reads it: its pod template's DRA claims of Alnair's GPUs counted as
    container requests (a copy; `job` is unchanged)."""
    spec = job.get("spec") or {}
    template = spec.get("template") or {}
    if not (template.get("spec") or {}).get("resourceClaims"):
        return job
    namespace = job["metadata"].get("namespace")
    counted = _template_asks(template, "spec.template", namespace, lookup)
    if counted is template:
        return job
    return {**job, "spec": {**spec, "template": counted}}
