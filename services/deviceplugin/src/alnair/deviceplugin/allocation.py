"""Which devices a container gets, and what the container is told: pure placement logic.

`preferred` answers the kubelet's GetPreferredAllocation. Fractional units (memory MiB,
compute percent) of one container must all come from one GPU, since a process cannot use
memory on one GPU with SMs of another: the GPU the scheduler chose wins, else the GPU the
must-include units are on, else the tightest fit (fewest free units that still suffice), so
large holes stay open for large requests. Whole-GPU requests go to the best-connected set
(`alnair.common.topology`, the same rule the scheduler uses).

`grant_whole` / `grant_fraction` build the container's environment and mounts. In intercept
mode a fraction gets the shim (LD_PRELOAD, mounted read-only), its limits, its accounting
region and its own registry socket; in MPS mode it gets the MPS limits and pipe directory. Every
value is a function of the grant alone, so the kubelet merging the Allocate responses of the
memory and compute resources of one container sees identical values, never a conflict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Final, Literal

from alnair.common.events import GpuLink
from alnair.common.topology import best_connected

SharingMode = Literal["intercept", "mps"]


def pick_fraction(
    available_by_gpu: Mapping[int, Sequence[str]],
    must_include: Sequence[str],
    must_gpus: Sequence[int],
    size: int,
    scheduler_gpu: int | None = None,
) -> list[str]:
    """`size` unit ids, from one GPU whenever one GPU has enough.

    `must_gpus[i]` is the GPU of `must_include[i]`. The result always holds every
    must-include id (the kubelet requires it) and never more than `size` ids.
    """
    chosen = list(dict.fromkeys(must_include))[:size]
    if len(chosen) >= size:
        return chosen
    need = size - len(chosen)
    taken = set(chosen)

    def free(gpu: int) -> list[str]:
        return [d for d in available_by_gpu.get(gpu, ()) if d not in taken]

    order: list[int] = []
    if scheduler_gpu is not None and len(free(scheduler_gpu)) >= need:
        order.append(scheduler_gpu)
    order.extend(g for g in dict.fromkeys(must_gpus) if g not in order)
    fitting = sorted(
        (g for g in available_by_gpu if g not in order and len(free(g)) >= need),
        key=lambda g: (len(free(g)), g),
    )
    order.extend(fitting)
    # nothing fits on one GPU: spill over the fullest GPUs first, so the split is small
    order.extend(
        sorted((g for g in available_by_gpu if g not in order), key=lambda g: (-len(free(g)), g))
    )
    for gpu in order:
        for dev in free(gpu):
            if need == 0:
                return chosen
            chosen.append(dev)
            taken.add(dev)
            need -= 1
    return chosen


def pick_whole(
    available: Sequence[int],
    must_include: Sequence[int],
    size: int,
    topology: Sequence[Sequence[GpuLink]],
    numa: Mapping[int, int | None] | None = None,
    scheduler_gpus: Sequence[int] = (),
) -> list[int]:
    """`size` GPU indices including `must_include`, as well connected as possible.

    The scheduler's choice is taken as is when it is available and fits the request.
    """
    must = list(dict.fromkeys(must_include))
    pool = [g for g in dict.fromkeys(available) if g not in must]
    if len(must) >= size:
        return must[:size]
    wanted = [g for g in dict.fromkeys(scheduler_gpus) if g in pool or g in must]
    if len(wanted) == size and all(g in wanted for g in must):
        return wanted
    return best_connected(pool, size - len(must), topology, must=must, numa=numa)


def group_by_gpu(ids: Sequence[str], gpu_of: Mapping[str, int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    for dev in ids:
        out[gpu_of[dev]].append(dev)
    return dict(out)


# --------------------------------------------------------------------------- container grants


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Grant:
    """What one container is given for one resource (the body of an Allocate response)."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Where the shim, the per-container state and the registry live, on host and in container."""

    shim_host_path: str = "/usr/local/alnair/lib/libalnair-intercept.so"
    shim_container_path: str = "/usr/local/alnair/lib/libalnair-intercept.so"
    state_dir: str = "/var/lib/alnair"
    container_run_dir: str = "/var/run/alnair"
    mps_pipe_dir: str = "/tmp/nvidia-mps"

    def vgpu_host_dir(self, vgpu_id: str) -> str:
        return str(PurePosixPath(self.state_dir) / "vgpu" / vgpu_id)

    @property
    def registry_host_dir(self) -> str:
        return str(PurePosixPath(self.state_dir) / "registry")

    def registry_dir(self, vgpu_id: str) -> str:
        """The directory of `vgpu_id`'s own registry socket (mounted into its container only)."""
        return str(PurePosixPath(self.registry_host_dir) / vgpu_id)

    def registry_socket(self, vgpu_id: str) -> str:
        return str(PurePosixPath(self.registry_dir(vgpu_id)) / REGISTRY_SOCKET_FILE)


REGION_FILE: Final = "region"
REGISTRY_SOCKET_FILE: Final = "registry.sock"


def visible_devices(uuids: Sequence[str]) -> dict[str, str]:
    # The runtime exposes only these GPUs, renumbered from 0 inside the container.
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(uuids))),
    }


def grant_whole(uuids: Sequence[str]) -> Grant:
    return Grant(
        envs=visible_devices(uuids),
        annotations={"alnair.io/gpu-uuids": ",".join(uuids)},
    )


def grant_fraction(
    *,
    uuid: str,
    gpu_index: int,
    vgpu_id: str,
    memory_mib: int | None,
    compute_pct: int | None,
    layout: Layout,
    mode: SharingMode = "intercept",
) -> Grant:
    """A fraction of GPU `uuid`: `memory_mib` and/or `compute_pct` (None: not limited)."""
    envs = visible_devices([uuid])
    envs["ALNAIR_GPU_INDEX"] = str(gpu_index)
    envs["ALNAIR_VGPU_ID"] = vgpu_id
    if mode == "mps":
        if compute_pct is not None:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(compute_pct)
        if memory_mib is not None:
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mib}M"
        envs["CUDA_MPS_PIPE_DIRECTORY"] = layout.mps_pipe_dir
        mounts = [MountSpec(layout.mps_pipe_dir, layout.mps_pipe_dir, False)]
        return Grant(envs=envs, mounts=mounts, annotations={"alnair.io/vgpu-id": vgpu_id})
    run = PurePosixPath(layout.container_run_dir)
    if memory_mib is not None:
        envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"] = str(memory_mib)
    if compute_pct is not None:
        envs["ALNAIR_GPU_COMPUTE_PCT"] = str(compute_pct)
    envs["LD_PRELOAD"] = layout.shim_container_path
    envs["ALNAIR_VGPU_REGION"] = str(run / "vgpu" / REGION_FILE)
    envs["ALNAIR_REGISTRY_SOCKET"] = str(run / "registry" / REGISTRY_SOCKET_FILE)
    mounts = [
        MountSpec(layout.shim_container_path, layout.shim_host_path, True),
        MountSpec(str(run / "vgpu"), layout.vgpu_host_dir(vgpu_id), False),
        MountSpec(str(run / "registry"), layout.registry_dir(vgpu_id), True),
    ]
    return Grant(envs=envs, mounts=mounts, annotations={"alnair.io/vgpu-id": vgpu_id})
