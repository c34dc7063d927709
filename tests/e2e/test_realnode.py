"""The node side against a real kubelet and containerd (`RealNode`, built by
hack/build-node.sh), beside the KWOK nodes: the pods here run in real containers.

- a pod runs (CNI address, pinned pause sandbox, cgroups on this host's v1 hierarchies) and its
  log reads back through the API server, which the kubelet authenticates and authorizes;
- the device plugin, fed by the profiler's simulated agent, registers every resource with the
  kubelet, and the node's allocatable shows them;
- a fractional pod's container gets what Allocate answered: the shim preloaded from its
  read-only mount, its memory limit, its registry socket; the program inside (over the fake
  driver) is refused past its limit;
- a GPU marked unhealthy leaves the kubelet's allocatable and comes back on recovery;
- the kubelet restarting: the plugins register again and the running pod keeps its devices.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from alnair.common import resources as r
from alnair.common.bus import Bus
from alnair.common.errors import ConfigError
from alnair.common.events import GpuHealthChanged
from alnair.common.kube import NODES, PODS, KubeClient, Obj
from alnair.dev.localstack import ControlPlane, NatsServer
from alnair.dev.localstack.images import ImageFile, ImageSpec
from alnair.dev.localstack.procs import ManagedProcess
from alnair.dev.localstack.realnode import PAUSE_IMAGE, REAL_NODE_TAINT, RealNode, node_binaries
from alnair.dev.waiting import wait_for
from alnair.deviceplugin.devices import DEFAULT_RESOURCES
from alnair.profiler.sim import gpu_uuid

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native" / "intercept"
SHIM = NATIVE / "build" / "libalnair-intercept.so"
PROBE_IMAGE = "localhost/alnair/gpu-probe:1"
NODE = "alnair-real-0"
GPUS = 2
GPU_MIB = 16384  # V100M16


def _library_files(binary: Path) -> dict[str, ImageFile]:
    """The shared libraries `binary` needs from this machine (ldd), at the same paths."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    files: dict[str, ImageFile] = {}
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            files[path] = ImageFile(Path(path).resolve(), 0o755)
    return files


def probe_image() -> ImageSpec:
    """The fake driver, the probe program and the C library it links: no shim (the device
    plugin mounts that in)."""
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE), "probe"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    probe = NATIVE / "build" / "tests" / "gpu_probe"
    files = {
        "/usr/local/bin/gpu_probe": ImageFile(probe),
        "/usr/lib/alnair-fake/libcuda.so.1": ImageFile(NATIVE / "build" / "fake" / "libcuda.so.1"),
        **_library_files(probe),
        **_library_files(SHIM),
    }
    return ImageSpec(
        PROBE_IMAGE,
        files,
        entrypoint=["/usr/local/bin/gpu_probe"],
        env={
            "LD_LIBRARY_PATH": "/usr/lib/alnair-fake",
            "FAKE_CUDA_DEVICES": str(GPUS),
            "FAKE_CUDA_TOTAL_MIB": str(GPU_MIB),
        },
    )


@pytest.fixture(scope="module")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    try:
        node_binaries()
    except ConfigError as exc:
        pytest.fail(str(exc))
    labels = {r.LABEL_GPU_MODEL: "V100M16", r.LABEL_GPU_COUNT: str(GPUS)}
    node = RealNode(control_plane, NODE, labels=labels).start()
    try:
        node.import_image(probe_image())
        yield node
    finally:
        node.stop()


class NodeServices:
    """The node's Alnair processes: the simulated profiler agent (the GPUs' inventory and
    health) and the device plugin, on one NATS server."""

    def __init__(self, node: RealNode, cp: ControlPlane, workdir: Path) -> None:
        self.node = node
        self.nats = NatsServer(workdir).start()
        self.state = node.folder / "alnair"
        logs = node.logs
        common = {
            **os.environ,
            "ALNAIR_NATS_URL": self.nats.url,
            "ALNAIR_KUBECONFIG": str(cp.kubeconfig),
            "ALNAIR_LOG_LEVEL": "INFO",
        }
        self.agent = ManagedProcess(
            "profiler-agent",
            [sys.executable, "-m", "alnair.profiler", "agent", "--backend", "sim"],
            logs,
            {**common, "ALNAIR_PROFILER_HTTP_PORT": "0",
             "ALNAIR_PROFILER_SIM_NODE_SELECTOR": f"kubernetes.io/hostname={node.name}"},
        )  # fmt: skip
        self.plugin = ManagedProcess(
            "deviceplugin",
            [sys.executable, "-m", "alnair.deviceplugin", "run"],
            logs,
            {**common,
             "ALNAIR_DEVICEPLUGIN_HTTP_PORT": "0",
             "ALNAIR_DEVICEPLUGIN_NODE_NAME": node.name,
             "ALNAIR_DEVICEPLUGIN_KUBELET_DIR": str(node.device_plugin_dir),
             "ALNAIR_DEVICEPLUGIN_STATE_DIR": str(self.state),
             "ALNAIR_DEVICEPLUGIN_SHIM_HOST_PATH": str(SHIM),
             "ALNAIR_DEVICEPLUGIN_CDI_DIR": str(node.cdi_dir),
             "ALNAIR_DEVICEPLUGIN_DRA_PLUGINS_DIR": str(node.kubelet_dir / "plugins"),
             "ALNAIR_DEVICEPLUGIN_DRA_REGISTRY_DIR": str(node.kubelet_dir / "plugins_registry"),
             "ALNAIR_DEVICEPLUGIN_REGISTER_RETRY_MAX_S": "1"},
        )  # fmt: skip
        self.agent.start()
        self.plugin.start()

    def stop(self) -> None:
        self.plugin.stop()
        self.agent.stop()
        self.nats.stop()


@pytest.fixture(scope="module")
def services(
    real_node: RealNode, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeServices]:
    running = NodeServices(real_node, control_plane, tmp_path_factory.mktemp("realnode"))
    try:
        yield running
    finally:
        running.stop()


def pod(name: str, image: str, resources: dict[str, str] | None = None, **env: str) -> Obj:
    container: Obj = {"name": "main", "image": image, "imagePullPolicy": "Never",
                      "env": [{"name": k, "value": v} for k, v in env.items()]}  # fmt: skip
    if resources:
        container["resources"] = {"limits": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists"}],
            "containers": [container],
        },
    }


async def phase(kube: KubeClient, namespace: str, name: str, *phases: str) -> Obj:
    async def reached() -> Obj | None:
        got = await kube.get(PODS, name, namespace)
        return got if got.get("status", {}).get("phase") in phases else None

    result: Obj = await wait_for(reached, 90, 0.25, what=f"pod {name} {'/'.join(phases)}")
    return result


def kubectl(cp: ControlPlane, *args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def allocatable(kube: KubeClient) -> dict[str, str]:
    node = await kube.get(NODES, NODE)
    return dict(node["status"].get("allocatable") or {})


@pytest.fixture
async def node_kube(control_plane: ControlPlane) -> AsyncIterator[KubeClient]:
    async with control_plane.client() as kube:
        yield kube


async def test_a_pod_runs_in_a_real_container_and_its_log_reads_back(
    real_node: RealNode, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    await node_kube.create(PODS, pod("probe", PROBE_IMAGE, PROBE_MAX_MIB="256"), namespace)
    done = await phase(node_kube, namespace, "probe", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["podIP"].startswith(real_node.node_ip.rsplit(".", 1)[0] + ".")
    # the API server asks the kubelet (its client certificate, the kubelet's webhook authz)
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "probe"))
    assert report["init"] == 0 and report["devices"] == GPUS
    assert report["total_mib"] == GPU_MIB and report["allocated_mib"] == 256
    assert report["ld_preload"] == ""  # nothing asked of the device plugin, nothing given
    # the sandbox is the locally built pause image, pinned in containerd
    status = done["status"]["containerStatuses"][0]
    assert status["image"] == PROBE_IMAGE and status["state"]["terminated"]["exitCode"] == 0


async def test_the_device_plugin_registers_with_the_real_kubelet(
    services: NodeServices, node_kube: KubeClient
) -> None:
    async def served() -> dict[str, str] | None:
        got = await allocatable(node_kube)
        return got if all(got.get(res, "0") != "0" for res in DEFAULT_RESOURCES) else None

    got = await wait_for(served, 60, 0.5, what="the plugin's resources on the node")
    assert got[r.GPU] == str(GPUS)
    assert got[r.GPU_COMPUTE] == str(100 * GPUS)
    per_gpu_gib = r.GPU_MODEL_MEMORY_MIB["V100M16"] // 1024  # the profiler's model table
    assert got[r.GPU_MEMORY_GIB] == str(GPUS * per_gpu_gib)
    sockets = sorted(p.name for p in services.node.device_plugin_dir.glob("*.sock"))
    assert "kubelet.sock" in sockets and len(sockets) == 1 + len(DEFAULT_RESOURCES)


async def test_a_fractional_container_gets_the_shim_and_is_refused_past_its_limit(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    await test_the_device_plugin_registers_with_the_real_kubelet(services, node_kube)
    name = f"frac-{uuid.uuid4().hex[:6]}"
    limits = {r.GPU_MEMORY_GIB: "2"}
    await node_kube.create(PODS, pod(name, PROBE_IMAGE, limits, PROBE_MAX_MIB="8192"), namespace)
    done = await phase(node_kube, namespace, name, "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", name))
    assert report["ld_preload"].endswith("libalnair-intercept.so")
    assert report["memory_limit_mib"] == "2048"
    assert report["allocated_mib"] == 2048 and report["refused"] != 0
    assert report["total_mib"] == 2048  # the shim shows the grant, not the GPU
    assert report["registry_socket"]


async def test_an_unhealthy_gpu_leaves_the_kubelets_allocatable_and_comes_back(
    services: NodeServices, node_kube: KubeClient
) -> None:
    await test_the_device_plugin_registers_with_the_real_kubelet(services, node_kube)
    bus = await Bus.connect(services.nats.url, name="test-realnode-health")
    try:
        uuid1 = gpu_uuid(NODE, 1)  # as the simulated agent names it

        async def publish(healthy: bool) -> None:
            event = GpuHealthChanged(
                node=NODE, gpu_index=1, gpu_uuid=uuid1, healthy=healthy, xid=None if healthy else 79
            )
            await bus.publish(event, source="alnair-profiler-test")

        async def count(expected: str) -> bool:
            return (await allocatable(node_kube)).get(r.GPU) == expected

        await publish(False)
        await wait_for(lambda: count(str(GPUS - 1)), 60, 0.5, what="one GPU fewer")
        await publish(True)
        await wait_for(lambda: count(str(GPUS)), 60, 0.5, what="the GPU back")
    finally:
        await bus.close()


async def test_a_kubelet_restart_registers_the_plugins_again_and_keeps_the_running_pod(
    services: NodeServices, node_kube: KubeClient, namespace: str
) -> None:
    await test_the_device_plugin_registers_with_the_real_kubelet(services, node_kube)
    name = f"hold-{uuid.uuid4().hex[:6]}"
    body = pod(name, PROBE_IMAGE, {r.GPU: "1"}, PROBE_MAX_MIB="64")
    body["spec"]["containers"][0]["command"] = ["/pause"]  # the probe's job is done at once
    body["spec"]["containers"][0]["image"] = PAUSE_IMAGE
    await node_kube.create(PODS, body, namespace)
    running = await phase(node_kube, namespace, name, "Running")
    started = running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    services.node.restart_kubelet()

    async def registered_again() -> bool:
        got = await allocatable(node_kube)
        return got.get(r.GPU) == str(GPUS) and services.node.healthy()

    await wait_for(registered_again, 90, 0.5, what="the plugins registered again")
    await asyncio.sleep(2)  # a kubelet that lost the pod's devices would restart it now
    after = await kube_pod(node_kube, namespace, name)
    status = after["status"]["containerStatuses"][0]
    assert after["status"]["phase"] == "Running" and status["restartCount"] == 0
    assert status["state"]["running"]["startedAt"] == started


async def kube_pod(kube: KubeClient, namespace: str, name: str) -> Obj:
    got: Obj = await kube.get(PODS, name, namespace)
    return got
