"""The resource model: the names Alnair reads and writes on Kubernetes objects.

Pods ask for whole GPUs with `nvidia.com/gpu`, or for a fraction with `alnair.io/gpu-memory-gib`
(GiB) or `alnair.io/gpu-memory` (MiB) and `alnair.io/gpu-compute` (percent of one GPU's SMs);
`alnair.io/gpu-model` restricts the GPU type. The memory resource's name carries its unit
(`GPU_MEMORY_UNIT_MIB`): the device plugin advertises one kubelet device per unit, so a pod, the
kubelet and the scheduler read one number one way whatever node it lands on. Nodes carry the
GPU facts as labels (written by the profiler, as GPU feature discovery does). The scheduler
writes its decision as pod annotations before binding, and the device plugin honours them.
Keeping every name here means a typo is an import error, not a silent miss.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from alnair.common.errors import InvalidValueError

SCHEDULER_NAME: Final = "alnair"
JOB_CONTROLLER_LABELS: Final = frozenset(
    {"controller-uid", "job-name", "batch.kubernetes.io/controller-uid",
     "batch.kubernetes.io/job-name"}
)  # fmt: skip
"""The labels Kubernetes' Job controller puts on a Job's pod template, tying it to that Job:
a template copied into another Job keeps them at its peril (the API server refuses it)."""
DOMAIN: Final = "alnair.io"

# Extended resources requested by pods and advertised by nodes.
GPU: Final = "nvidia.com/gpu"
"""Whole GPUs, an integer count."""
GPU_MEMORY: Final = "alnair.io/gpu-memory"
"""Fractional GPU: memory in MiB on one GPU (one kubelet device per MiB: only for nodes whose
GPU memory in all stays under ~140,000 MiB, the kubelet's 4 MiB message limit)."""
GPU_MEMORY_GIB: Final = "alnair.io/gpu-memory-gib"
"""Fractional GPU: memory in GiB on one GPU; what the device plugin serves by default."""
GPU_MEMORY_UNIT_MIB: Final[dict[str, int]] = {GPU_MEMORY: 1, GPU_MEMORY_GIB: 1024}
"""MiB per unit of each GPU memory resource."""
GPU_COMPUTE: Final = "alnair.io/gpu-compute"
"""Fractional GPU: percent of one GPU's streaming multiprocessors (1-100)."""
GPU_MODEL_REQUEST: Final = "alnair.io/gpu-model"
"""Pod annotation or node-selector value restricting the GPU model, `|`-separated alternatives."""

# Node labels (written by the profiler agent).
LABEL_GPU_MODEL: Final = "alnair.io/gpu-model"
LABEL_GPU_MEMORY_MIB: Final = "alnair.io/gpu-memory-mib"
LABEL_GPU_COUNT: Final = "alnair.io/gpu-count"
LABEL_GPU_COMPUTE_CAPABILITY: Final = "alnair.io/gpu-compute-capability"
LABEL_KWOK_NODE: Final = "type"
ANN_KWOK_NODE: Final = "kwok.x-k8s.io/node"
"""KWOK manages nodes carrying this annotation with value `fake`."""

# Pod annotations: the scheduler's decision, read by the device plugin and the profiler.
ANN_GPU_INDICES: Final = "alnair.io/gpu-indices"
"""Comma-separated indices of the GPUs chosen on the node."""
ANN_GPU_UUIDS: Final = "alnair.io/gpu-uuids"
ANN_GPU_MILLI: Final = "alnair.io/gpu-milli"
"""Milli-GPU granted on each chosen GPU (1000 for whole GPUs)."""
ANN_SCHEDULED_BY: Final = "alnair.io/scheduled-by"
ANN_DURATION: Final = "alnair.io/duration"
"""How long a simulated (KWOK) pod runs before it succeeds, as a Go duration ("90s", "1m30s").

KWOK's stage reads it with `durationFrom` and parses it with Go's time.ParseDuration, so the value
needs its unit: write it with `duration_value(seconds)`."""
ANN_DURATION_S: Final = ANN_DURATION
"""Alias of ANN_DURATION (the value still carries its unit)."""

# Model information used by the profiler's records and the predictor (names from the seeds).
ANN_MODEL_NAME: Final = "alnair.io/model-name"
ANN_DATA_SIZE: Final = "alnair.io/data-size"
ANN_EPOCH: Final = "alnair.io/epoch"
ANN_BATCH_SIZE: Final = "alnair.io/batch-size"

# Gang scheduling (the shape upstream scheduler-plugins and Kubeflow use).
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
POD_GROUP_API_GROUP: Final = "scheduling.x-k8s.io"
POD_GROUP_VERSION: Final = "v1alpha1"
POD_GROUP_PLURAL: Final = "podgroups"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
"""The StatefulSet controller's ordinal label on every pod it creates. A gang member whose
ordinal is at least its PodGroup's minMember is surplus (an elastic job's workers above its
minimum): the scheduler's first preemption victim, highest ordinal first."""

ALNAIR_API_GROUP: Final = "alnair.io"
ALNAIR_API_VERSION: Final = "v1alpha1"

MILLI_PER_GPU: Final = 1000

GPU_MODEL_MEMORY_MIB: Final[dict[str, int]] = {
    # Usable memory as NVML reports it; G1-G3 are the Alibaba trace's undisclosed models.
    "K80": 11441,
    "P100": 16280,
    "T4": 15360,
    "V100M16": 16160,
    "V100M32": 32510,
    "A10": 22731,
    "A100": 40960,
    "A100M80": 81920,
    "H100": 81559,
    "G1": 16384,
    "G2": 16384,
    "G3": 32768,
}
GPU_MODEL_COMPUTE_CAPABILITY: Final[dict[str, str]] = {
    "K80": "3.7",
    "P100": "6.0",
    "T4": "7.5",
    "V100M16": "7.0",
    "V100M32": "7.0",
    "A10": "8.6",
    "A100": "8.0",
    "A100M80": "8.0",
    "H100": "9.0",
}

# NVML product names -> the model keys above; memory tells the two sizes of one chip apart.
_NVML_MODELS: Final = (
    ("H100", None, "H100"),
    ("A100", 50_000, "A100M80"),
    ("A100", None, "A100"),
    ("A10", None, "A10"),
    ("V100", 20_000, "V100M32"),
    ("V100", None, "V100M16"),
    ("P100", None, "P100"),
    ("T4", None, "T4"),
    ("K80", None, "K80"),
)
_NAME_TOKENS = re.compile(r"[A-Za-z0-9]+")


def gpu_model_key(product_name: str, memory_mib: int) -> str | None:
    """The model key (`V100M16`, `A100M80`, ...) of a GPU NVML names `product_name` ("Tesla
    V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"), or None for a model
    the tables above do not know. Matched on whole name tokens, so "A10" is not an "A100"."""
    tokens = {t.upper() for t in _NAME_TOKENS.findall(product_name)}
    for chip, min_mib, key in _NVML_MODELS:
        if chip in tokens and (min_mib is None or memory_mib >= min_mib):
            return key
    return None


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(value: str | int | float, field: str = "quantity") -> Decimal:
    """Parse a Kubernetes resource quantity ("500m", "2Gi", "1e3") into a Decimal."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    m = _QUANTITY.match(value.strip())
    if not m:
        raise InvalidValueError(field, value, "not a Kubernetes quantity")
    number = Decimal(m.group(1))
    if m.group(2):
        number *= Decimal(10) ** int(m.group(2)[1:])
    return number * _SUFFIX[m.group(3) or ""]


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """What one container asks for, as Kubernetes reads it: its limits, with its requests over
    them (a resource given only as a limit, as extended resources usually are, is requested at
    that limit). Every service reads a container's GPUs through this one rule."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def whole_gpus(pod_spec: Mapping[str, Any], field: str = "spec") -> int:
    """Whole GPUs (`nvidia.com/gpu`) a pod spec, or a pod template's spec, asks for: the sum
    over its containers, or its largest init container's when that is more (Kubernetes'
    effective request). InvalidValueError names a count that is not a whole number >= 0."""

    def count(container: Mapping[str, Any], where: str) -> int:
        value = container_requests(container).get(GPU)
        if value is None:
            return 0
        number = parse_quantity(value, where)
        if number < 0 or number != number.to_integral_value():
            raise InvalidValueError(where, value, "whole GPUs must be a whole number >= 0")
        return int(number)

    def counts(part: str) -> list[int]:
        return [
            count(c, f"{field}.{part}[{i}].resources.{GPU}")
            for i, c in enumerate(pod_spec.get(part) or [])
        ]

    return max(sum(counts("containers")), max(counts("initContainers"), default=0))


def gpu_memory_mib(amounts: Mapping[str, Decimal | int], field: str = "resources") -> Decimal:
    """MiB of GPU memory that `amounts` (resource name -> quantity) ask for, from whichever of
    the memory resources they name; InvalidValueError when they name more than one."""
    named = [name for name in GPU_MEMORY_UNIT_MIB if amounts.get(name)]
    if len(named) > 1:
        raise InvalidValueError(field, " and ".join(named), "ask for GPU memory in one unit")
    if not named:
        return Decimal(0)
    return Decimal(amounts[named[0]]) * GPU_MEMORY_UNIT_MIB[named[0]]


def gpu_memory_resource(amounts: Mapping[str, object]) -> str:
    """The GPU memory resource `amounts` names (GPU_MEMORY when none: for messages)."""
    return next((name for name in GPU_MEMORY_UNIT_MIB if amounts.get(name)), GPU_MEMORY)


def cpu_milli(value: str | int | float) -> int:
    """CPU quantity in millicores (rounded up, as the kubelet does)."""
    return int((parse_quantity(value, "cpu") * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: str | int | float) -> int:
    """Memory quantity in MiB (rounded up)."""
    q = parse_quantity(value, "memory") / (Decimal(2) ** 20)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def duration_value(seconds: float) -> str:
    """The ANN_DURATION value for `seconds` ("12.5s")."""
    if seconds < 0:
        raise InvalidValueError(ANN_DURATION, seconds, "must not be negative")
    return f"{seconds:g}s"


def parse_indices(value: str, field: str = ANN_GPU_INDICES) -> list[int]:
    """Parse a comma-separated GPU index list ("0,3") as the scheduler writes it."""
    out: list[int] = []
    for raw in value.split(","):
        part = raw.strip()
        if not part.isdigit():
            raise InvalidValueError(field, value, "expected comma-separated GPU indices")
        out.append(int(part))
    return out
