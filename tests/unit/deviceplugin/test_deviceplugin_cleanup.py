"""vGPUs are released when their pod ends: by the pod watch, or at the first complete pod list
for pods deleted while the plugin was away. Records made without a known pod stay."""

from __future__ import annotations

from pathlib import Path

from alnair.common.informer import WatchEvent
from alnair.deviceplugin.allocation import Layout
from alnair.deviceplugin.handlers import pod_cleanup_handler
from alnair.deviceplugin.registry import VgpuRecord, VgpuRegistry


def registry(tmp_path: Path) -> VgpuRegistry:
    vgpus = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    vgpus.record(VgpuRecord("v1", 0, "GPU-0", 512, None, "ml", "a", "main", pod_uid="uid-a"))
    vgpus.record(VgpuRecord("v2", 0, "GPU-0", 512, None, "ml", "b", "main", pod_uid="uid-b"))
    vgpus.record(VgpuRecord("v3", 1, "GPU-1", 256, None))
    return vgpus


def pod(uid: str, phase: str = "Running") -> dict[str, object]:
    return {"metadata": {"name": uid, "namespace": "ml", "uid": uid}, "status": {"phase": phase}}


def test_deleted_or_finished_pods_release_their_vgpus(tmp_path: Path) -> None:
    vgpus = registry(tmp_path)
    handle = pod_cleanup_handler(vgpus)
    handle(WatchEvent.MODIFIED, pod("uid-a"), None)
    assert {r.vgpu_id for r in vgpus.records()} == {"v1", "v2", "v3"}
    handle(WatchEvent.DELETED, pod("uid-a"), None)
    assert not (tmp_path / "vgpu" / "v1").exists()
    handle(WatchEvent.MODIFIED, pod("uid-b", "Succeeded"), None)
    assert {r.vgpu_id for r in vgpus.records()} == {"v3"}
    assert (tmp_path / "records" / "v3.json").exists()
    assert not (tmp_path / "records" / "v1.json").exists()


def test_reconcile_after_a_restart(tmp_path: Path) -> None:
    registry(tmp_path)
    restarted = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    assert restarted.load_records() == 3
    assert restarted.reconcile({"uid-b"}) == ["v1"]
    assert {r.vgpu_id for r in restarted.records()} == {"v2", "v3"}
    assert not (tmp_path / "vgpu" / "v1").exists()
