"""What a prepared claim gives its containers: a ResourceClaim's allocation read into grants.

`claim_devices` reads `status.allocation` of a claim (as the API server holds it) and returns
the devices this driver must prepare on this node: the allocation results whose driver is ours
and whose pool is this node's, each with the capacity it consumed and the sharing mechanism
from the opaque configuration of its DeviceClass or claim (`GpuSharing`, the claim's own
overriding the class's). A device whose consumed memory or compute is less than the GPU has is
a share: the intercept shim (or MPS) enforces exactly what the allocator granted; a device
consumed whole gets the GPU with no shim.

`claim_grants` turns those into one `Grant` per device (the same `grant_whole` /
`grant_fraction` the device plugin's Allocate uses), with every device of one claim seeing the
same visible-device list, so the container runtime merging their CDI edits meets no conflict.
Pure functions; `ClaimError` names the claim and the value it cannot use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from alnair.common import dra
from alnair.common.errors import InvalidValueError
from alnair.common.events import GpuDevice
from alnair.deviceplugin.allocation import Grant, Layout, grant_fraction, visible_devices

Sharing = Literal["intercept", "mps"]
SHARING_VALUES: tuple[Sharing, ...] = ("intercept", "mps")


class ClaimError(InvalidValueError):
    """A claim this driver cannot prepare (not allocated, not ours, a bad value)."""


@dataclass(frozen=True)
class ClaimDevice:
    """One allocated device of a claim, on this node."""

    request: str
    pool: str
    device: str
    gpu_index: int
    share_id: str | None
    memory_mib: int | None
    """Consumed memory, None when the allocation names none (the whole GPU)."""
    compute_pct: int | None
    sharing: Sharing


def _sharing(config: Sequence[Mapping[str, Any]], request: str, driver: str) -> Sharing:
    chosen: Sharing = "intercept"
    # class entries come first, then the claim's: the later one for this request wins
    for entry in config:
        requests = entry.get("requests") or []
        parent = request.split("/", maxsplit=1)[0]  # a sub-request is "request/sub"
        if requests and request not in requests and parent not in requests:
            continue
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        params = opaque.get("parameters") or {}
        if params.get("kind") != dra.SHARING_CONFIG_KIND:
            continue
        value = params.get("sharing", "intercept")
        if value not in SHARING_VALUES:
            raise ClaimError("GpuSharing.sharing", value, f"not one of {', '.join(SHARING_VALUES)}")
        chosen = value
    return chosen


def claim_devices(
    claim: Mapping[str, Any], node: str, driver: str = dra.DRIVER
) -> list[ClaimDevice]:
    """The devices of `claim` this driver prepares on `node`."""
    meta = claim.get("metadata") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("claim", ref, "is not allocated")
    devices = allocation.get("devices") or {}
    config = devices.get("config") or []
    out: list[ClaimDevice] = []
    for result in devices.get("results") or []:
        if result.get("driver") != driver or result.get("pool") != dra.pool_name(node):
            continue
        request = str(result.get("request", ""))
        name = str(result.get("device", ""))
        try:
            index = dra.gpu_index_of(name)
            consumed = result.get("consumedCapacity") or {}
            memory = consumed.get(dra.CAPACITY_MEMORY)
            compute = consumed.get(dra.CAPACITY_COMPUTE)
            out.append(
                ClaimDevice(
                    request=request,
                    pool=str(result.get("pool")),
                    device=name,
                    gpu_index=index,
                    share_id=result.get("shareID"),
                    memory_mib=dra.quantity_mib(memory) if memory is not None else None,
                    compute_pct=dra.quantity_int(compute) if compute is not None else None,
                    sharing=_sharing(config, request, driver),
                )
            )
        except InvalidValueError as exc:
            raise ClaimError("claim", ref, str(exc)) from exc
    return out


def vgpu_id(claim_uid: str, device: ClaimDevice) -> str:
    """Stable per claim and device share, so a repeated prepare finds the same region."""
    key = f"{claim_uid}/{device.request}/{device.device}/{device.share_id or ''}"
    return f"{claim_uid[:8]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def limits(device: ClaimDevice, gpu: GpuDevice) -> tuple[int | None, int | None]:
    """The (memory MiB, compute %) the shim must enforce; None where the device is whole."""
    memory = device.memory_mib if device.memory_mib is not None else None
    if memory is not None and memory >= gpu.memory_mib:
        memory = None
    compute = device.compute_pct
    if compute is not None and compute >= dra.COMPUTE_FULL:
        compute = None
    return memory, compute


def claim_grants(
    claim_uid: str,
    devices: Sequence[ClaimDevice],
    gpus: Mapping[int, GpuDevice],
    layout: Layout,
) -> list[tuple[ClaimDevice, Grant, str | None]]:
    """Each device with its grant and, for a share, the vGPU id of its accounting region.

    A container sees every GPU of the claim. Shares are enforced per process by one shim, so
    a claim holding a share may hold nothing else (a share next to other GPUs could not be told
    apart inside the container): such a claim is refused, naming it.
    """
    uuids = []
    for d in devices:
        gpu = gpus.get(d.gpu_index)
        if gpu is None:
            raise ClaimError("device", d.device, "no such GPU on this node")
        uuids.append(gpu.uuid)
    shares = [d for d in devices if limits(d, gpus[d.gpu_index]) != (None, None)]
    if shares and len(devices) > 1:
        raise ClaimError(
            "claim",
            claim_uid,
            f"holds a GPU share and {len(devices) - 1} other device(s); a share must be "
            "the claim's only device",
        )
    out: list[tuple[ClaimDevice, Grant, str | None]] = []
    for d in devices:
        gpu = gpus[d.gpu_index]
        memory, compute = limits(d, gpu)
        if memory is None and compute is None:
            grant = Grant(
                envs=visible_devices(list(dict.fromkeys(uuids))),
                annotations={"alnair.io/gpu-uuids": ",".join(dict.fromkeys(uuids))},
            )
            out.append((d, grant, None))
            continue
        vid = vgpu_id(claim_uid, d)
        grant = grant_fraction(
            uuid=gpu.uuid,
            gpu_index=gpu.index,
            vgpu_id=vid,
            memory_mib=memory,
            compute_pct=compute,
            layout=layout,
            mode=d.sharing,
        )
        out.append((d, grant, vid))
    return out
