"""A test run that dies with its real node running leaves nothing behind: the next run (any
`RealNode.start`, or `reap_stale()`) kills the orphaned kubelet, containerd, shims and
containers, and removes the mounts, cgroups, bridge and folder. Runs after test_realnode.py
(the kubelet's device-plugin folder is one per machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.realnode import (
    KUBELET_DEVICE_PLUGINS,
    PAUSE_IMAGE,
    REAL_NODE_TAINT,
    RealNode,
    _cgroup_dirs,
    mount_points,
    reap_stale,
)

pytestmark = pytest.mark.e2e


def test_a_dead_owners_node_is_reaped_with_everything_it_made(
    control_plane: ControlPlane,
) -> None:
    node = RealNode(control_plane, "alnair-real-crash").start()
    kubectl = [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig",
               str(control_plane.kubeconfig)]  # fmt: skip
    manifest = f"""{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "orphan",
      "namespace": "default"}}, "spec": {{"nodeName": "{node.name}", "tolerations":
      [{{"key": "{REAL_NODE_TAINT}", "operator": "Exists"}}], "containers": [{{"name": "c",
      "image": "{PAUSE_IMAGE}", "imagePullPolicy": "Never"}}]}}}}"""
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True)
    subprocess.run(
        [*kubectl, "wait", "--for=jsonpath={.status.phase}=Running", "pod/orphan",
         "--timeout=90s"], check=True, capture_output=True,
    )  # fmt: skip
    folder = str(node.folder)
    pids = list(node.record.pids)
    # the owner dies: a process that has exited stands for the killed test run
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    node.record.owner = int(gone.stdout)
    node.record.save()
    assert any(m.startswith(folder) for m in mount_points())  # the container's rootfs and netns

    assert node.name in reap_stale()

    assert not Path(folder).exists()
    assert not any(m.startswith(folder) for m in mount_points())
    assert str(KUBELET_DEVICE_PLUGINS) not in mount_points()
    for managed in node.procs.values():  # killed; reaped here as init reaps a dead run's
        assert managed.proc is not None and managed.proc.wait(timeout=10) == -9
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not any(d.exists() for d in _cgroup_dirs(node.cgroup))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    assert node.bridge not in links
    leftover = subprocess.run(["pgrep", "-f", folder], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""
    subprocess.run([*kubectl, "delete", "node", node.name], capture_output=True, check=True)
