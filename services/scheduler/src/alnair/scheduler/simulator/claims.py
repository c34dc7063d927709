"""Trace pods written the ways a user asks for GPUs, and read back by the scheduler's own parsers.

A trace pod asks for milli-GPU. A user writes the same request as Kubernetes objects, in one of
two forms, and the scheduler reads each with the code the live binder runs:
- `resources`: `nvidia.com/gpu: N`, or `alnair.io/gpu-memory` + `alnair.io/gpu-compute` for a
  fraction, read by `live.pods.parse_pod`;
- `claims`: a ResourceClaim of `gpu.alnair.io` (count N) or of `shared-gpu.alnair.io` with
  `memory` and `compute` capacity requests for a fraction, read by `dra.claims.request_from_claims`.

A fraction of `gpu_milli` milli-GPU becomes `ceil(gpu_milli / 10)` percent of compute and
`floor(gpu_milli x smallest / 1000)` MiB of memory, where `smallest` is the smallest GPU memory
among the models the pod accepts (the GPU the scheduler sizes memory against). Both forms round
the same way, and read back as the trace's request whenever `gpu_milli` is a multiple of 10 (every
fraction in the Alibaba trace is). Replaying a trace through either form therefore places the
same pods on the same GPUs, which `alnair simulate --requests claims` lets anyone check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.scheduler.cluster.pods import parse_pod
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.dra.claims import request_from_claims

FORMS: Final = ("trace", "resources", "claims")
"""How a replayed pod's GPU request is written: the trace's milli-GPU as is, or one of the two
Kubernetes forms."""
CLAIM_REQUEST: Final = "gpu"
"""The request's name inside each generated claim."""


def smallest_memory_mib(pod: PodRequest, memory_table: Mapping[str, int]) -> int:
    """The GPU memory a fraction of `pod` is sized against (as `parse_pod` does)."""
    unknown = sorted(m for m in pod.gpu_models if m not in memory_table)
    if unknown:
        raise InvalidValueError("gpu_spec", unknown[0], f"pod {pod.name}: unknown GPU model")
    candidates = [memory_table[m] for m in pod.gpu_models] or list(memory_table.values())
    return min(candidates)


def share_of(pod: PodRequest, memory_table: Mapping[str, int]) -> tuple[int, int]:
    """(memory MiB, compute percent) a fractional pod asks for."""
    smallest = smallest_memory_mib(pod, memory_table)
    return pod.gpu_milli * smallest // r.MILLI_PER_GPU, math.ceil(pod.gpu_milli / 10)


def pod_object(pod: PodRequest, memory_table: Mapping[str, int]) -> Obj:
    """`pod` as a Pod asking with `nvidia.com/gpu` or `alnair.io/gpu-memory`/`gpu-compute`."""
    limits: dict[str, str] = {}
    if pod.is_fractional:
        memory, compute = share_of(pod, memory_table)
        limits = {r.GPU_MEMORY: str(memory), r.GPU_COMPUTE: str(compute)}
    elif pod.num_gpu:
        limits = {r.GPU: str(pod.num_gpu)}
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    annotations = {r.GPU_MODEL_REQUEST: "|".join(sorted(pod.gpu_models))} if pod.gpu_models else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "annotations": annotations},
        "spec": {
            "schedulerName": r.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "resources": {"requests": {**requests, **limits}, "limits": limits},
                }
            ],
        },
    }


def claim_object(pod: PodRequest, memory_table: Mapping[str, int]) -> Obj | None:
    """The ResourceClaim that asks for `pod`'s GPUs, None for a pod without GPUs."""
    if not pod.num_gpu:
        return None
    exact: dict[str, object]
    if pod.is_fractional:
        memory, compute = share_of(pod, memory_table)
        exact = {
            "deviceClassName": dra.CLASS_SHARED,
            "capacity": {
                "requests": {dra.CAPACITY_MEMORY: f"{memory}Mi", dra.CAPACITY_COMPUTE: str(compute)}
            },
        }
    else:
        exact = {"deviceClassName": dra.CLASS_WHOLE, "count": pod.num_gpu}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{pod.name}-{CLAIM_REQUEST}", "namespace": pod.namespace},
        "spec": {"devices": {"requests": [{"name": CLAIM_REQUEST, "exactly": exact}]}},
    }


def through_resources(
    pods: Sequence[PodRequest], memory_table: Mapping[str, int] | None = None
) -> list[PodRequest]:
    """Each pod as `parse_pod` reads it from its resources-form Pod."""
    table = dict(memory_table or r.GPU_MODEL_MEMORY_MIB)
    return [parse_pod(pod_object(p, table), table) for p in pods]


def through_claims(
    pods: Sequence[PodRequest], memory_table: Mapping[str, int] | None = None
) -> list[PodRequest]:
    """Each pod as the scheduler reads it from its claim; the GPU model restriction stays on the
    pod (a node selector or annotation, as for the resources form)."""
    table = dict(memory_table or r.GPU_MODEL_MEMORY_MIB)
    out = []
    for p in pods:
        claim = claim_object(p, table)
        read = request_from_claims(
            p.name,
            [claim] if claim is not None else [],
            smallest_memory_mib(p, table),
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            namespace=p.namespace,
        )
        out.append(replace(read, gpu_models=p.gpu_models if read.num_gpu else frozenset()))
    return out


def written_as(
    form: str, pods: Sequence[PodRequest], memory_table: Mapping[str, int] | None = None
) -> list[PodRequest]:
    """`pods` with their GPU requests written in `form` (one of FORMS) and read back."""
    if form == "trace":
        return list(pods)
    if form == "resources":
        return through_resources(pods, memory_table)
    if form == "claims":
        return through_claims(pods, memory_table)
    raise InvalidValueError("requests", form, f"one of {', '.join(FORMS)}")
