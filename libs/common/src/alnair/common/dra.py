"""Alnair's GPUs in Dynamic Resource Allocation (`resource.k8s.io/v1`): the names both sides use.

The device plugin's DRA driver publishes one device per GPU in a ResourceSlice and prepares
claims on the node; the scheduler allocates the claims of its pods. Both read the same driver
name, device naming, attribute and capacity names and DeviceClass names from here, so neither
service imports the other.

A device carries two consumable capacities (KEP-5075): `memory` (bytes, as a quantity) and
`compute` (percent of the GPU's SMs). Each device allows multiple allocations; a request that
names no capacity consumes the request policy's default, which is the whole GPU, so a plain
"one GPU" claim is exclusive and a claim asking for `memory: 10Gi, compute: 30` is a share.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Final

from alnair.common.errors import InvalidValueError
from alnair.common.kube import Resource
from alnair.common.resources import parse_quantity

DRIVER: Final = "gpu.alnair.io"
"""The DRA driver name: in ResourceSlices, allocation results and CDI device names."""

CLASS_WHOLE: Final = "gpu.alnair.io"
"""DeviceClass of whole GPUs (a request with no capacity consumes all of the device)."""
CLASS_SHARED: Final = "shared-gpu.alnair.io"
"""DeviceClass of GPU shares, enforced by the intercept shim with the claim's limits."""
CLASSES: Final = (CLASS_WHOLE, CLASS_SHARED)

CAPACITY_MEMORY: Final = "memory"
CAPACITY_COMPUTE: Final = "compute"
COMPUTE_FULL: Final = 100
"""A whole GPU's compute capacity, in percent of its SMs."""

ATTR_UUID: Final = "uuid"
ATTR_MODEL: Final = "model"
ATTR_INDEX: Final = "index"
ATTR_COMPUTE_CAPABILITY: Final = "computeCapability"
ATTR_NUMA: Final = "numaNode"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
"""The standard attribute for the PCIe root complex, shared with NICs for alignment."""

TAINT_UNHEALTHY: Final = "gpu.alnair.io/unhealthy"
"""Key of the taint an unhealthy GPU's device carries (effect NoSchedule)."""

SHARING_CONFIG_KIND: Final = "GpuSharing"
SHARING_CONFIG_API_VERSION: Final = "gpu.alnair.io/v1alpha1"
"""The opaque configuration a DeviceClass hands the driver (`sharing`: none/intercept/mps)."""

MIB: Final = 1 << 20

RESOURCESLICES: Final = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
RESOURCECLAIMS: Final = Resource("resource.k8s.io", "v1", "resourceclaims")
RESOURCECLAIMTEMPLATES: Final = Resource("resource.k8s.io", "v1", "resourceclaimtemplates")
DEVICECLASSES: Final = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)


def device_name(gpu_index: int) -> str:
    """The device of GPU `gpu_index` in the node's pool."""
    return f"gpu-{gpu_index}"


def gpu_index_of(device: str) -> int:
    """The GPU index of a device name this driver made; InvalidValueError names any other."""
    prefix, _, number = device.partition("-")
    if prefix != "gpu" or not number.isdigit():
        raise InvalidValueError("device", device, f"not a device of driver {DRIVER}")
    return int(number)


def pool_name(node: str) -> str:
    """Each node is its own pool, named after the node (as node-local drivers do)."""
    return node


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def memory_quantity(mib: int) -> str:
    return f"{mib}Mi"


def quantity_mib(value: str | int, field: str = CAPACITY_MEMORY) -> int:
    """A memory quantity in whole MiB, rounded up (a limit never below what was granted)."""
    q = parse_quantity(value, field) / Decimal(MIB)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def quantity_int(value: str | int, field: str = CAPACITY_COMPUTE) -> int:
    """A count quantity ("30", "300m" is refused: compute is in whole percent)."""
    q = parse_quantity(value, field)
    if q != q.to_integral_value():
        raise InvalidValueError(field, value, "must be a whole number")
    return int(q)


def semver(capability: str) -> str | None:
    """A compute capability ("8.0", "9.0") as the semantic version DRA attributes want."""
    parts = capability.strip().split(".")
    if not capability.strip() or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)
