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
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.bus import Bus
from alnair.common.delivery import Envelope
from alnair.common.errors import ConfigError
from alnair.common.events import PodMetric
from alnair.common.kube import NODES, PODS, Conflict, KubeClient, Obj
from alnair.dev.builders import BASE, SYSTEM_NS, shipped_account
from alnair.dev.localstack import ControlPlane, NatsServer
from alnair.dev.localstack.controlplane import load_manifests
from alnair.dev.localstack.images import ImageFile, ImageSpec
from alnair.dev.localstack.procs import ManagedProcess, free_port
from alnair.dev.localstack.realnode import PAUSE_IMAGE, REAL_NODE_TAINT, RealNode, node_binaries
from alnair.dev.waiting import wait_for
from alnair.deviceplugin import cdi
from alnair.deviceplugin.devices import DEFAULT_RESOURCES
from alnair.deviceplugin.pods import allocated_annotation
from alnair.profiler.agent.cgroups import PodCgroupMeter, pod_of_pid
from alnair.scheduler.dra.allocator import Usage, allocate, node_devices, parse_requests
from dra_support import ensure_device_classes, render_with_dra
from kube_auth_support import write_kubeconfig

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native" / "intercept"
SHIM = NATIVE / "build" / "libalnair-intercept.so"
PROBE_IMAGE = "localhost/alnair/gpu-probe:1"
NODE = "alnair-real-0"
GPUS = 2
GPU_MIB = 16384  # V100M16
DRA_RBAC = BASE.parent / "components" / "dra" / "rbac.yaml"


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
            "FAKE_CUDA_KERNEL_US": "200",
            # the container's counters, which the node's fake NVML reads through /proc
            "FAKE_CUDA_STATS": "/fake-cuda.stats",  # the image has no /tmp
        },
    )


@pytest.fixture(scope="module")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    try:
        node_binaries()
    except ConfigError as exc:
        pytest.fail(str(exc))
    node = RealNode(control_plane, NODE).start()
    try:
        node.import_image(probe_image())
        yield node
    finally:
        node.stop()


def claim_status(results: list[Obj], pod: Obj) -> Obj:
    """What the scheduler writes on a claim it allocated for `pod` on the real node."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    return {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        },
        "reservedFor": [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ],
    }


async def node_identity(
    cp: ControlPlane, node: RealNode, account: str, workdir: Path, *manifests: str
) -> Path:
    """A kubeconfig for `account` as it ships (its RBAC and admission policies applied), with
    a token bound to a pod of that account running on the real node: the API server puts the
    node in the token's user info, as for the DaemonSet's pod."""
    async with cp.client() as kube:
        config = await shipped_account(cp, kube, account, *manifests)
        for doc in load_manifests(DRA_RBAC):
            await kube.apply(doc)
        body = pod(f"{account}-{NODE}", PAUSE_IMAGE)
        body["metadata"]["namespace"] = SYSTEM_NS
        body["spec"]["serviceAccountName"] = account
        body["spec"]["restartPolicy"] = "Always"
        with contextlib.suppress(Conflict):
            await kube.create(PODS, body, SYSTEM_NS)
        holder = await phase(kube, SYSTEM_NS, body["metadata"]["name"], "Running")
        token = await kube.service_account_token(SYSTEM_NS, account, bound_pod=holder)
    assert config.ca_file is not None
    path = workdir / f"{account}.kubeconfig"
    return write_kubeconfig(path, cp.server, Path(config.ca_file), {"token": token})


class NodeServices:
    """The node's Alnair processes, each under its shipped ServiceAccount: the profiler agent
    with its nvml backend, over the fake NVML that reads the fake driver's processes (the
    GPUs' inventory, health, per-pod samples), and the device plugin (both modes), on one NATS
    server."""

    def __init__(self, node: RealNode, cp: ControlPlane, workdir: Path) -> None:
        self.node = node
        self.nats = NatsServer(workdir).start()
        self.state = node.folder / "alnair"
        logs = node.logs
        agent_config = asyncio.run(
            node_identity(
                cp, node, "alnair-profiler-agent", workdir, "profiler/agent-rbac/rbac.yaml",
                "profiler/agent-node-policy.yaml",
            )
        )  # fmt: skip
        plugin_config = asyncio.run(
            node_identity(
                cp, node, "alnair-deviceplugin", workdir, "deviceplugin/rbac.yaml",
                "deviceplugin/node-policy.yaml",
            )
        )  # fmt: skip
        common = {**os.environ, "ALNAIR_NATS_URL": self.nats.url, "ALNAIR_LOG_LEVEL": "INFO"}
        self.plugin_port = free_port()
        self.xids = workdir / "xids"
        self.xids.write_text("")
        self.agent = ManagedProcess(
            "profiler-agent",
            [sys.executable, "-m", "alnair.profiler", "agent", "--backend", "nvml"],
            logs,
            {**common, "ALNAIR_KUBECONFIG": str(agent_config),
             "ALNAIR_PROFILER_HTTP_PORT": "0",
             "ALNAIR_PROFILER_NODE_NAME": node.name,
             "ALNAIR_PROFILER_KUBELET_CGROUP_ROOT": node.cgroup,
             # past the kubelet's node status period (10 s), so the dip is seen
             "ALNAIR_PROFILER_NVML_RECOVER_AFTER_S": "25",
             "ALNAIR_PROFILER_STATE_DIR": str(workdir / "agent-state"),
             # the fake NVML, reading the fake driver's processes through /proc
             "LD_LIBRARY_PATH": str(NATIVE / "build" / "fake"),
             "FAKE_NVML_DEVICES": str(GPUS),
             "FAKE_NVML_TOTAL_MIB": str(GPU_MIB),
             "FAKE_NVML_XID_FILE": str(self.xids)},
        )  # fmt: skip
        self.plugin = ManagedProcess(
            "deviceplugin",
            [sys.executable, "-m", "alnair.deviceplugin", "run"],
            logs,
            {**common,
             "ALNAIR_KUBECONFIG": str(plugin_config),
             "ALNAIR_DEVICEPLUGIN_HTTP_PORT": str(self.plugin_port),
             "ALNAIR_DEVICEPLUGIN_NODE_NAME": node.name,
             "ALNAIR_DEVICEPLUGIN_MODE": "both",
             "ALNAIR_DEVICEPLUGIN_KUBELET_DIR": str(node.device_plugin_dir),
             "ALNAIR_DEVICEPLUGIN_STATE_DIR": str(self.state),
             "ALNAIR_DEVICEPLUGIN_SHIM_HOST_PATH": str(SHIM),
             "ALNAIR_DEVICEPLUGIN_CDI_DIR": str(node.cdi_dir),
             "ALNAIR_DEVICEPLUGIN_DRA_PLUGINS_DIR": str(node.kubelet_dir / "plugins"),
             "ALNAIR_DEVICEPLUGIN_DRA_REGISTRY_DIR": str(node.kubelet_dir / "plugins_registry"),
             "ALNAIR_DEVICEPLUGIN_POD_RESOURCES_SOCKET":
                 str(node.kubelet_dir / "pod-resources" / "kubelet.sock"),
             "ALNAIR_DEVICEPLUGIN_REGISTER_RETRY_MAX_S": "1"},
        )  # fmt: skip
        self.agent.start()
        self.plugin.start()

    def stop(self) -> None:
        self.plugin.stop()
        self.agent.stop()
        self.nats.stop()

    async def plugin_readiness(self) -> tuple[int, str]:
        """The device plugin's `/readyz`: its status and, when not ready, why."""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.plugin_port}") as http:
            resp = await http.get("/readyz")
        return resp.status_code, resp.json().get("detail", "")


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
    await plugin_served(services, node_kube)


async def plugin_served(services: NodeServices, node_kube: KubeClient) -> None:
    """The plugin's resources on the node and its sockets in the kubelet's folder."""

    async def served() -> dict[str, str] | None:
        got = await allocatable(node_kube)
        return got if all(got.get(res, "0") != "0" for res in DEFAULT_RESOURCES) else None

    got = await wait_for(served, 60, 0.5, what="the plugin's resources on the node")

    def sockets() -> list[str]:
        return sorted(p.name for p in services.node.device_plugin_dir.glob("*.sock"))

    await wait_for(lambda: len(sockets()) == 1 + len(DEFAULT_RESOURCES), 60, 0.5, what="sockets")

    async def ready() -> bool:  # every resource and the DRA driver registered
        return (await services.plugin_readiness())[0] == 200

    await wait_for(ready, 30, 0.2, what="the plugin ready (registered with the kubelet)")
    assert got[r.GPU] == str(GPUS)
    assert got[r.GPU_COMPUTE] == str(100 * GPUS)
    assert got[r.GPU_MEMORY_GIB] == str(GPUS * GPU_MIB // 1024)
    assert "kubelet.sock" in sockets()


async def test_a_fractional_container_gets_the_shim_and_is_refused_past_its_limit(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    await plugin_served(services, node_kube)
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
    """An XID 79 (fallen off the bus) from the driver: the agent's NVML event thread marks the
    GPU unhealthy, the plugin withdraws it, the kubelet's allocatable drops; the GPU answers
    again after the quiet period and comes back."""
    await plugin_served(services, node_kube)

    async def count(expected: str) -> bool:
        return (await allocatable(node_kube)).get(r.GPU) == expected

    with services.xids.open("a") as xids:
        xids.write("1 79\n")
    await wait_for(lambda: count(str(GPUS - 1)), 60, 0.5, what="one GPU fewer")
    await wait_for(lambda: count(str(GPUS)), 60, 0.5, what="the GPU back")


async def test_a_kubelet_restart_registers_the_plugins_again_and_keeps_the_running_pod(
    services: NodeServices, node_kube: KubeClient, namespace: str
) -> None:
    await plugin_served(services, node_kube)
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

    async def ready() -> bool:
        return (await services.plugin_readiness())[0] == 200

    await wait_for(ready, 30, 0.2, what="the plugin ready again")

    async def slice_back() -> bool:
        # the starting kubelet deleted its node's ResourceSlices; the driver writes its own again
        got = await node_kube.list(dra.RESOURCESLICES)
        return any(s["spec"].get("nodeName") == NODE for s in got["items"])

    await wait_for(slice_back, 60, 0.5, what="the ResourceSlice published again")
    await asyncio.sleep(2)  # a kubelet that lost the pod's devices would restart it now
    after = await kube_pod(node_kube, namespace, name)
    status = after["status"]["containerStatuses"][0]
    assert after["status"]["phase"] == "Running" and status["restartCount"] == 0
    assert status["state"]["running"]["startedAt"] == started


async def kube_pod(kube: KubeClient, namespace: str, name: str) -> Obj:
    got: Obj = await kube.get(PODS, name, namespace)
    return got


async def test_dra_prepares_an_alnair_allocated_claim_through_the_kubelet_and_cdi(
    services: NodeServices,
    control_plane: ControlPlane,
    node_kube: KubeClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The kubelet calls NodePrepareResources for the claim the scheduler's allocator placed,
    containerd applies the CDI spec the plugin wrote (the shim's mount, the limits), and the
    kubelet calls NodeUnprepareResources when the pod ends: the spec is gone."""
    await ensure_device_classes(node_kube, render_with_dra(tmp_path))
    classes = {c: await node_kube.get(dra.DEVICECLASSES, c) for c in dra.CLASSES}

    async def published() -> list[Obj]:
        got = await node_kube.list(dra.RESOURCESLICES)
        return [s for s in got["items"] if s["spec"].get("nodeName") == NODE]

    slices = await wait_for(published, 60, 0.5, what="the real node's ResourceSlice")
    claim = await node_kube.create(
        dra.RESOURCECLAIMS,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "share"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": dra.CLASS_SHARED,
             "capacity": {"requests": {"memory": "2Gi", "compute": "50"}}}}]}}},
        namespace,
    )  # fmt: skip
    body = pod("dra", PROBE_IMAGE, PROBE_MAX_MIB="8192", PROBE_KERNEL_S="4")
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "share"}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    created = await node_kube.create(PODS, body, namespace)
    got = allocate(
        claim, parse_requests(claim), node_devices(slices, NODE), classes, Usage(),
        new_share_id=uuid.uuid4,
    )  # fmt: skip
    assert got.results, got.reason
    claim["status"] = claim_status(list(got.results), created)
    await node_kube.replace(dra.RESOURCECLAIMS, claim, sub="status")

    spec_file = cdi.spec_path(services.node.cdi_dir, claim["metadata"]["uid"])
    await phase(node_kube, namespace, "dra", "Running")
    assert spec_file.exists()  # prepared: the CDI spec containerd applied
    spec = json.loads(spec_file.read_text())
    edits = spec["devices"][0]["containerEdits"]
    assert any(m["hostPath"] == str(SHIM) for m in edits.get("mounts", []))
    done = await phase(node_kube, namespace, "dra", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "dra"))
    assert report["ld_preload"].endswith("libalnair-intercept.so")
    assert report["memory_limit_mib"] == "2048" and report["compute_pct"] == "50"
    assert report["allocated_mib"] == 2048 and report["refused"] != 0
    await node_kube.delete(PODS, "dra", namespace)
    await wait_for(lambda: not spec_file.exists(), 60, 0.25, what="the claim unprepared")


async def test_the_profilers_cgroup_walk_finds_a_containers_pod_on_the_real_node(
    real_node: RealNode, node_kube: KubeClient, namespace: str
) -> None:
    """The container's process, as NVML would report it, maps to its pod, its container and
    the pod's cgroup, on this host's cgroup v1 (hybrid) under the kubelet's cgroupRoot; the
    pod's CPU is measured from there."""
    # kernels that take no device time: the probe launches them in a busy loop on the CPU
    body = pod(
        "busy", PROBE_IMAGE, PROBE_MAX_MIB="64", PROBE_KERNEL_S="30", FAKE_CUDA_KERNEL_US="0"
    )
    created = await node_kube.create(PODS, body, namespace)
    running = await phase(node_kube, namespace, "busy", "Running")
    container_id = running["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    found = pod_of_pid(real_node.task_pid(container_id))
    assert found is not None
    assert found.pod_uid == created["metadata"]["uid"]
    assert found.container_id == container_id
    # this host is hybrid: runc joins the unnamed v2 hierarchy too, so /proc/<pid>/cgroup has
    # a "0::" line with the pod's path, which parse_proc_cgroup prefers; the counters come
    # from the v1 controllers, as the meter found
    assert found.pod_cgroup_path.startswith(real_node.cgroup.strip("/") + "/kubepods/")
    meter = PodCgroupMeter(Path("/sys/fs/cgroup"), prefix=real_node.cgroup)
    assert meter.version == 1
    assert meter.locate(found.pod_uid, running["status"]["qosClass"]) == found.pod_cgroup_path
    assert meter.measure(found.pod_uid, found.pod_cgroup_path, time.monotonic()) is None
    await asyncio.sleep(1.5)
    rates = meter.measure(found.pod_uid, found.pod_cgroup_path, time.monotonic())
    assert rates is not None
    assert rates.cpu_util_cores > 0.3  # the probe launches kernels back to back
    assert rates.mem_used_mib > 0
    await node_kube.delete(PODS, "busy", namespace)


def checkpointed_devices(node: RealNode, pod_uid: str, resource: str) -> list[str]:
    """The device IDs the kubelet recorded for a pod (its device manager's checkpoint)."""
    doc = json.loads((node.device_plugin_dir / "kubelet_internal_checkpoint").read_text())
    ids: list[str] = []
    for entry in doc["Data"]["PodDeviceEntries"] or []:
        if entry["PodUID"] == pod_uid and entry["ResourceName"] == resource:
            for group in entry["DeviceIDs"].values():
                ids.extend(group)
    return ids


async def test_the_kubelet_takes_the_plugins_preferred_allocation(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    """Half a GPU's compute is 50 of 200 devices: the kubelet asks GetPreferredAllocation and
    takes all 50 from one GPU (the plugin packs), and Allocate grants 50 %."""
    await plugin_served(services, node_kube)
    body = pod("half", PROBE_IMAGE, {r.GPU_COMPUTE: "50"}, PROBE_MAX_MIB="64")
    created = await node_kube.create(PODS, body, namespace)
    done = await phase(node_kube, namespace, "half", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    ids = checkpointed_devices(services.node, created["metadata"]["uid"], r.GPU_COMPUTE)
    assert len(ids) == 50
    assert len({i.split("-")[1] for i in ids}) == 1, ids  # sm-<gpu>-<k>: one GPU
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "half"))
    assert report["compute_pct"] == "50" and report["ld_preload"]


async def test_the_plugin_restarting_registers_again_and_running_pods_keep_their_devices(
    services: NodeServices, node_kube: KubeClient, namespace: str
) -> None:
    await plugin_served(services, node_kube)
    body = pod("keep", PAUSE_IMAGE, {r.GPU: "1"})
    body["spec"]["containers"][0]["command"] = ["/pause"]
    created = await node_kube.create(PODS, body, namespace)
    await phase(node_kube, namespace, "keep", "Running")
    before = checkpointed_devices(services.node, created["metadata"]["uid"], r.GPU)
    assert len(before) == 1

    def registrations() -> int:
        log = services.plugin.log_path.read_text(errors="replace")
        return log.count('"msg": "registered with the kubelet"')

    before_count = registrations()
    services.plugin.stop()
    services.plugin.start()

    async def back() -> bool:
        # the new process registers each resource and the DRA driver again
        return registrations() >= before_count + len(DEFAULT_RESOURCES) + 1 and (
            await allocatable(node_kube)
        ).get(r.GPU) == str(GPUS)

    await wait_for(back, 60, 0.5, what="the plugin registered again")
    after = await node_kube.get(PODS, "keep", namespace)
    status = after["status"]["containerStatuses"][0]
    assert after["status"]["phase"] == "Running" and status["restartCount"] == 0
    assert checkpointed_devices(services.node, created["metadata"]["uid"], r.GPU) == before
    await node_kube.delete(PODS, "keep", namespace)


async def test_the_agent_reports_a_containers_gpu_use_and_the_shim_holds_its_compute_share(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    """Half a GPU's compute: the agent finds the container's process through the fake NVML and
    the real cgroups and publishes the pod's samples; the device plugin's registry feeds the
    measured utilization to the shim inside the container, whose throttle holds the kernels
    to the grant: the device time the probe measures is within 10 % of 50 %."""
    await plugin_served(services, node_kube)
    bus = await Bus.connect(services.nats.url, name="test-realnode-metrics")
    samples: list[PodMetric] = []

    async def seen(metric: PodMetric, _envelope: Envelope[PodMetric]) -> None:
        samples.append(metric)

    subscription = await bus.subscribe(
        PodMetric,
        seen,
        durable="test-realnode-metrics",
        subject=f"{PodMetric.SUBJECT_PREFIX}.{NODE}",
    )
    try:
        body = pod("share", PROBE_IMAGE, {r.GPU_COMPUTE: "50"}, PROBE_MAX_MIB="256",
                   PROBE_WARMUP_S="10", PROBE_KERNEL_S="10")  # fmt: skip
        created = await node_kube.create(PODS, body, namespace)
        uid = created["metadata"]["uid"]
        done = await phase(node_kube, namespace, "share", "Succeeded", "Failed")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "share"))
        assert report["compute_pct"] == "50"
        mine = [m for m in samples if m.pod_uid == uid]
        assert mine, f"no PodMetric for the pod among {len(samples)}"
        assert {m.pod for m in mine} == {"share"} and {m.namespace for m in mine} == {namespace}
        assert max(m.gpu_mem_used_mib for m in mine) == pytest.approx(256), [
            m.model_dump() for m in mine[-2:]
        ]
        assert max(m.sm_util_pct for m in mine) > 20
        assert report["busy_share"] == pytest.approx(0.5, rel=0.10), report
    finally:
        await subscription.stop()
        await bus.close()


def annotated(body: Obj, gpus: str) -> Obj:
    """`body` as the Alnair scheduler leaves a pod it placed: its GPU choice annotated."""
    body["metadata"]["annotations"] = {r.ANN_GPU_INDICES: gpus}
    return body


async def test_the_schedulers_gpu_choice_holds_across_memory_and_compute(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    """The kubelet's units come from whichever GPU; the scheduler chose GPU 1: both resources'
    Allocate answers name GPU 1 and agree (the kubelet merges them into one container), and
    the plugin marks the pod, under its node-bound token and the shipped node policy."""
    await plugin_served(services, node_kube)
    limits = {r.GPU_MEMORY_GIB: "1", r.GPU_COMPUTE: "30"}
    body = annotated(pod("chosen", PROBE_IMAGE, limits, PROBE_MAX_MIB="2048"), "1")
    await node_kube.create(PODS, body, namespace)
    done = await phase(node_kube, namespace, "chosen", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "chosen"))
    assert report["visible"] == "GPU-fake-1" and report["devices"] == 1
    assert report["memory_limit_mib"] == "1024" and report["compute_pct"] == "30"
    assert report["allocated_mib"] == 1024 and report["refused"] != 0
    marks = done["metadata"]["annotations"]
    assert marks[allocated_annotation(r.GPU_MEMORY_GIB)] == "main"
    assert marks[allocated_annotation(r.GPU_COMPUTE)] == "main"


async def test_whole_gpus_follow_the_schedulers_choice(
    services: NodeServices, control_plane: ControlPlane, node_kube: KubeClient, namespace: str
) -> None:
    await plugin_served(services, node_kube)
    body = annotated(pod("whole", PROBE_IMAGE, {r.GPU: "1"}, PROBE_MAX_MIB="64"), "1")
    created = await node_kube.create(PODS, body, namespace)
    done = await phase(node_kube, namespace, "whole", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert checkpointed_devices(services.node, created["metadata"]["uid"], r.GPU) == ["GPU-fake-1"]
    report = json.loads(kubectl(control_plane, "-n", namespace, "logs", "whole"))
    assert report["visible"] == "GPU-fake-1" and report["ld_preload"] == ""
