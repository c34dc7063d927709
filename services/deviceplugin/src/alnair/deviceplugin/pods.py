"""Which pod an Allocate call is for, so the plugin can honour the scheduler's GPU choice.

The kubelet's Allocate names devices, not pods. The Alnair scheduler writes its decision on the
pod (`alnair.io/gpu-indices`, `alnair.io/gpu-milli`) before binding, and the kubelet admits a
node's pods one at a time, so the pod being admitted is the oldest pending pod on this node
that carries a decision, asks for exactly this many units of this resource in some container,
and has not had that container's resource allocated yet. The plugin marks what it allocated
on the pod (`alnair.io/allocated-<resource>` = container names), so the next call moves on.

`match` is the pure part; `KubePods` lists and patches through the API server.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from alnair.common import resources
from alnair.common.errors import InvalidValueError
from alnair.common.kube import PODS, KubeClient
from alnair.deviceplugin.devices import SHORT_NAMES

log = logging.getLogger(__name__)

ALLOCATED_PREFIX: Final = "alnair.io/allocated-"


def allocated_annotation(resource: str) -> str:
    return ALLOCATED_PREFIX + SHORT_NAMES.get(resource, resource.rsplit("/", 1)[-1])


@dataclass(frozen=True)
class PodMatch:
    """The pod and container an Allocate call serves, with the scheduler's decision."""

    namespace: str
    name: str
    uid: str
    container: str
    gpu_indices: tuple[int, ...]
    requests: Mapping[str, int]
    """This container's requests of the three GPU resources."""

    @property
    def vgpu_id(self) -> str:
        """Stable per container, so both fractional resources' responses agree on it."""
        digest = hashlib.sha256(f"{self.uid}/{self.container}".encode()).hexdigest()[:12]
        return f"{self.uid[:8]}-{digest}" if self.uid else digest


def _quantity(container: Mapping[str, Any], resource: str) -> int:
    res = container.get("resources") or {}
    for section in ("limits", "requests"):
        value = (res.get(section) or {}).get(resource)
        if value is not None:
            return int(resources.parse_quantity(value, resource))
    return 0


def match(
    pods: Sequence[Mapping[str, Any]], node: str, resource: str, size: int
) -> PodMatch | None:
    """The pod being admitted for `size` units of `resource` on `node`, if one qualifies."""
    candidates: list[tuple[str, PodMatch]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        annotations = meta.get("annotations") or {}
        if spec.get("nodeName") != node or status.get("phase", "Pending") != "Pending":
            continue
        raw = annotations.get(resources.ANN_GPU_INDICES)
        if not raw:
            continue
        try:
            indices = tuple(resources.parse_indices(raw))
        except InvalidValueError:
            log.warning("pod has an unreadable GPU decision", extra={"pod": meta.get("name")})
            continue
        done = set(filter(None, (annotations.get(allocated_annotation(resource)) or "").split(",")))
        for container in spec.get("containers") or []:
            cname = container.get("name", "")
            if cname in done or _quantity(container, resource) != size:
                continue
            requests = {r: _quantity(container, r) for r in SHORT_NAMES}
            m = PodMatch(
                namespace=meta.get("namespace", ""),
                name=meta.get("name", ""),
                uid=meta.get("uid", ""),
                container=cname,
                gpu_indices=indices,
                requests={r: q for r, q in requests.items() if q},
            )
            candidates.append((meta.get("creationTimestamp", ""), m))
            break
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1].namespace, c[1].name))
    return candidates[0][1]


class PodSource(Protocol):
    """Where the plugin learns about the pods on its node."""

    async def find(self, resource: str, size: int) -> PodMatch | None: ...

    async def mark_allocated(self, found: PodMatch, resource: str) -> None: ...


class NoPods:
    """No API server access: fractions go where the kubelet's units are."""

    async def find(self, resource: str, size: int) -> PodMatch | None:
        return None

    async def mark_allocated(self, found: PodMatch, resource: str) -> None:
        return None


class KubePods:
    """Pods on `node` from the API server."""

    def __init__(self, kube: KubeClient, node: str) -> None:
        self.kube = kube
        self.node = node

    async def find(self, resource: str, size: int) -> PodMatch | None:
        listed = await self.kube.list(PODS, field_selector=f"spec.nodeName={self.node}")
        return match(listed.get("items", []), self.node, resource, size)

    async def mark_allocated(self, found: PodMatch, resource: str) -> None:
        pod = await self.kube.get(PODS, found.name, found.namespace)
        key = allocated_annotation(resource)
        current = ((pod.get("metadata") or {}).get("annotations") or {}).get(key, "")
        names = [n for n in current.split(",") if n]
        if found.container not in names:
            names.append(found.container)
        patch = {"metadata": {"annotations": {key: ",".join(names)}}}
        await self.kube.patch(PODS, found.name, patch, namespace=found.namespace)


class StaticPods:
    """A fixed list of pod objects (tests, and nodes run without an API server)."""

    def __init__(self, node: str, pods: Sequence[dict[str, Any]] = ()) -> None:
        self.node = node
        self.pods = [dict(p) for p in pods]

    async def find(self, resource: str, size: int) -> PodMatch | None:
        return match(self.pods, self.node, resource, size)

    async def mark_allocated(self, found: PodMatch, resource: str) -> None:
        key = allocated_annotation(resource)
        for pod in self.pods:
            meta = pod.setdefault("metadata", {})
            if meta.get("uid") == found.uid:
                ann = meta.setdefault("annotations", {})
                names = [n for n in ann.get(key, "").split(",") if n]
                names.append(found.container)
                ann[key] = ",".join(names)
