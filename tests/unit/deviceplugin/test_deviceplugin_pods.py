"""Finding the pod an Allocate call is for, from the scheduler's annotations."""

from __future__ import annotations

from typing import Any

from alnair.common import resources
from alnair.deviceplugin.pods import StaticPods, allocated_annotation, match


def pod(
    name: str,
    created: str,
    *,
    memory: int = 0,
    compute: int = 0,
    gpus: str | None = "1",
    node: str = "n1",
    phase: str = "Pending",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if memory:
        limits[resources.GPU_MEMORY] = str(memory)
    if compute:
        limits[resources.GPU_COMPUTE] = compute
    ann = dict(annotations or {})
    if gpus is not None:
        ann[resources.ANN_GPU_INDICES] = gpus
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": ann,
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }


def test_oldest_matching_pending_pod_wins() -> None:
    pods = [
        pod("late", "2026-01-01T00:00:09Z", memory=1024),
        pod("early", "2026-01-01T00:00:01Z", memory=1024),
        pod("other-size", "2026-01-01T00:00:00Z", memory=2048),
        pod("running", "2026-01-01T00:00:00Z", memory=1024, phase="Running"),
        pod("elsewhere", "2026-01-01T00:00:00Z", memory=1024, node="n2"),
        pod("undecided", "2026-01-01T00:00:00Z", memory=1024, gpus=None),
    ]
    found = match(pods, "n1", resources.GPU_MEMORY, 1024)
    assert found is not None
    assert (found.name, found.container, found.gpu_indices) == ("early", "main", (1,))
    assert found.requests == {resources.GPU_MEMORY: 1024}


def test_an_allocated_container_is_skipped() -> None:
    done = {allocated_annotation(resources.GPU_MEMORY): "main"}
    pods = [
        pod("first", "2026-01-01T00:00:01Z", memory=512, annotations=done),
        pod("second", "2026-01-01T00:00:02Z", memory=512),
    ]
    found = match(pods, "n1", resources.GPU_MEMORY, 512)
    assert found is not None
    assert found.name == "second"


def test_vgpu_id_is_the_same_for_both_fractional_resources() -> None:
    p = pod("both", "2026-01-01T00:00:01Z", memory=512, compute=30)
    by_memory = match([p], "n1", resources.GPU_MEMORY, 512)
    by_compute = match([p], "n1", resources.GPU_COMPUTE, 30)
    assert by_memory is not None
    assert by_compute is not None
    assert by_memory.vgpu_id == by_compute.vgpu_id
    assert by_memory.requests == {resources.GPU_MEMORY: 512, resources.GPU_COMPUTE: 30}


def test_unreadable_decision_is_skipped() -> None:
    assert match([pod("bad", "t", memory=1, gpus="0,x")], "n1", resources.GPU_MEMORY, 1) is None


async def test_static_pods_mark_allocation() -> None:
    source = StaticPods("n1", [pod("p", "2026-01-01T00:00:01Z", memory=64)])
    found = await source.find(resources.GPU_MEMORY, 64)
    assert found is not None
    await source.mark_allocated(found, resources.GPU_MEMORY)
    assert await source.find(resources.GPU_MEMORY, 64) is None
