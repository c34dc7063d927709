"""What the plugin advertises to the kubelet: devices made from the node's GPU inventory.

Four resources, each its own plugin endpoint:
- `nvidia.com/gpu`: one device per physical GPU, named by its UUID (as NVIDIA's plugin does,
  so existing tooling reading the kubelet's checkpoint still recognises them).
- `alnair.io/gpu-memory-gib` and `alnair.io/gpu-memory`: synthetic devices, one per GiB (or MiB)
  of each GPU's memory, so a pod asking for N of the resource is granted N units. The unit is
  the resource name's (`resources.GPU_MEMORY_UNIT_MIB`), never a setting: a node cannot advertise
  a number the scheduler reads in another unit. GiB is the default; MiB devices exceed the
  kubelet's 4 MiB ListAndWatch message on nodes past ~140,000 MiB of GPU memory (2 x 80 GB).
- `alnair.io/gpu-compute`: synthetic devices, one per percent of each GPU's SMs.

Synthetic ids carry their GPU (`gib-<gpu>-<k>`, `mem-<gpu>-<k>`, `sm-<gpu>-<k>`), kept short
because the kubelet receives the whole list in one message. Every device carries its GPU's NUMA
node, so the kubelet's topology manager can align it with CPUs. Pure functions of the inventory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from alnair.common import resources
from alnair.common.errors import InvalidValueError
from alnair.common.events import GpuDevice

WHOLE: Final = resources.GPU
MEMORY: Final = resources.GPU_MEMORY
MEMORY_GIB: Final = resources.GPU_MEMORY_GIB
COMPUTE: Final = resources.GPU_COMPUTE
RESOURCES: Final = (WHOLE, MEMORY_GIB, MEMORY, COMPUTE)
DEFAULT_RESOURCES: Final = (WHOLE, MEMORY_GIB, COMPUTE)
"""What a node serves unless told otherwise: memory in GiB, which fits the kubelet's message."""
MEMORY_UNIT_MIB: Final = resources.GPU_MEMORY_UNIT_MIB
FRACTIONAL: Final = frozenset({MEMORY_GIB, MEMORY, COMPUTE})
COMPUTE_UNITS_PER_GPU: Final = 100
"""Percent of one GPU's SMs: one synthetic compute device each."""

_PREFIX: Final = {MEMORY_GIB: "gib", MEMORY: "mem", COMPUTE: "sm"}
SHORT_NAMES: Final = {
    WHOLE: "gpu",
    MEMORY_GIB: "gpu-memory-gib",
    MEMORY: "gpu-memory",
    COMPUTE: "gpu-compute",
}
"""Used for socket file names and metric labels."""


@dataclass(frozen=True)
class Device:
    """One device as the kubelet sees it."""

    id: str
    gpu_index: int
    healthy: bool
    numa_node: int | None


def units_per_gpu(resource: str, gpu: GpuDevice) -> int:
    """How many devices of `resource` one GPU provides (memory rounded down to whole units)."""
    if resource == WHOLE:
        return 1
    if resource in MEMORY_UNIT_MIB:
        return gpu.memory_mib // MEMORY_UNIT_MIB[resource]
    if resource == COMPUTE:
        return COMPUTE_UNITS_PER_GPU
    raise InvalidValueError("resource", resource, f"not one of {', '.join(RESOURCES)}")


def build_devices(
    resource: str,
    gpus: Sequence[GpuDevice],
    healthy: Iterable[bool] | None = None,
) -> list[Device]:
    """All devices of `resource` on a node with `gpus`; `healthy` overrides each GPU's flag."""
    flags = list(healthy) if healthy is not None else [g.healthy for g in gpus]
    out: list[Device] = []
    for gpu, ok in zip(gpus, flags, strict=True):
        if resource == WHOLE:
            out.append(Device(gpu.uuid, gpu.index, ok, gpu.numa_node))
            continue
        prefix = _PREFIX.get(resource)
        if prefix is None:
            raise InvalidValueError("resource", resource, f"not one of {', '.join(RESOURCES)}")
        count = units_per_gpu(resource, gpu)
        out.extend(
            Device(f"{prefix}-{gpu.index}-{k}", gpu.index, ok, gpu.numa_node) for k in range(count)
        )
    return out


def gpu_index_of(resource: str, device_id: str, uuid_to_index: dict[str, int]) -> int:
    """The GPU a device id belongs to; InvalidValueError names an id this plugin never made."""
    if resource == WHOLE:
        if device_id in uuid_to_index:
            return uuid_to_index[device_id]
        raise InvalidValueError("device id", device_id, "no GPU with this UUID on the node")
    prefix = _PREFIX.get(resource, "")
    parts = device_id.split("-")
    if len(parts) != 3 or parts[0] != prefix or not parts[1].isdigit() or not parts[2].isdigit():
        raise InvalidValueError("device id", device_id, f"not a {resource} device of this plugin")
    return int(parts[1])
