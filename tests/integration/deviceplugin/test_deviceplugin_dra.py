"""The DRA driver played by a stand-in kubelet over real unix-socket gRPC, with claims in a real
API server: plugin registration (GetInfo, NotifyRegistrationStatus), NodePrepareResources in v1
and v1beta1 reading the claim's allocation from the API server, idempotent prepare and
unprepare, CDI specs that carry the shim and the claim's limits, and the node's ResourceSlice
following GPU health."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry

from alnair.common import dra
from alnair.common.events import GpuDevice, GpuHealthChanged
from alnair.common.kube import PODS, Conflict, KubeClient, NotFound
from alnair.common.tasks import within
from alnair.deviceplugin import cdi
from alnair.deviceplugin.app import Running, start
from alnair.deviceplugin.protos import dra_v1_pb2 as v1
from alnair.deviceplugin.protos import dra_v1beta1_pb2 as v1beta1
from alnair.deviceplugin.protos import pluginregistration_pb2 as reg
from alnair.deviceplugin.settings import DevicePluginSettings

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

GPU_MIB = 81920
SHIM = "/opt/alnair/libalnair-intercept.so"


def gpus(node: str) -> list[GpuDevice]:
    return [
        GpuDevice(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model="H100",
            memory_mib=GPU_MIB,
            compute_capability="9.0",
            numa_node=0,
        )
        for i in range(2)
    ]


class Kubelet:
    """The kubelet's side: registration through the plugins_registry socket, then DRAPlugin."""

    def __init__(self, registration_socket: Path) -> None:
        self.reg_channel = grpc.aio.insecure_channel(f"unix://{registration_socket}")
        self.channel: grpc.aio.Channel | None = None

    async def register(self) -> reg.PluginInfo:
        info: reg.PluginInfo = await self.reg_channel.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=reg.InfoRequest.SerializeToString,
            response_deserializer=reg.PluginInfo.FromString,
        )(reg.InfoRequest(), timeout=5)
        await self.reg_channel.unary_unary(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            request_serializer=reg.RegistrationStatus.SerializeToString,
            response_deserializer=reg.RegistrationStatusResponse.FromString,
        )(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        self.channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        return info

    async def prepare(self, version: str, *claims: tuple[str, str, str]) -> Any:
        pb: Any = v1 if version == "v1" else v1beta1
        assert self.channel is not None
        req = pb.NodePrepareResourcesRequest()
        for ns, name, uid in claims:
            req.claims.add(namespace=ns, name=name, uid=uid)
        return await self.channel.unary_unary(
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
            request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=pb.NodePrepareResourcesResponse.FromString,
        )(req, timeout=10)

    async def unprepare(self, version: str, *claims: tuple[str, str, str]) -> Any:
        pb: Any = v1 if version == "v1" else v1beta1
        assert self.channel is not None
        req = pb.NodeUnprepareResourcesRequest()
        for ns, name, uid in claims:
            req.claims.add(namespace=ns, name=name, uid=uid)
        return await self.channel.unary_unary(
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
            request_serializer=pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeUnprepareResourcesResponse.FromString,
        )(req, timeout=10)

    async def close(self) -> None:
        await self.reg_channel.close()
        if self.channel is not None:
            await self.channel.close()


async def allocated_claim(
    kube: KubeClient,
    namespace: str,
    name: str,
    node: str,
    results: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A claim created and allocated as a scheduler does: status.allocation and reservedFor.

    The claim is reserved for a real pod: the resourceclaim controller drops reservations of
    pods that do not exist."""
    try:
        pod = await kube.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "infer", "namespace": namespace},
                "spec": {
                    "schedulerName": "nobody",  # stays Pending: no scheduler picks it
                    "containers": [{"name": "main", "image": "example.com/infer:1"}],
                },
            },
        )
    except Conflict:
        pod = await kube.get(PODS, "infer", namespace)
    claim = await kube.create(
        dra.RESOURCECLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.CLASS_SHARED}}]
                }
            },
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": dra.DRIVER, "pool": node, **r} for r in results
                ],
                "config": config or [],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "infer", "uid": pod["metadata"]["uid"]}],
    }
    return await kube.replace(dra.RESOURCECLAIMS, claim, sub="status")


@pytest.fixture
async def driver(control_plane: Any, kube: KubeClient, tmp_path: Path) -> Any:
    node = f"dra-{uuid.uuid4().hex[:6]}"
    settings = DevicePluginSettings(
        node_name=node,
        mode="dra",
        kubeconfig=str(control_plane.kubeconfig),
        kubelet_dir=tmp_path / "device-plugins",
        dra_plugins_dir=tmp_path / "plugins",
        dra_registry_dir=tmp_path / "plugins_registry",
        cdi_dir=tmp_path / "cdi",
        state_dir=str(tmp_path / "state"),
        shim_host_path=SHIM,
        use_pod_annotations=False,
        register_retry_max_s=0.2,
        log_json=False,
    )
    running = await start(settings, CollectorRegistry(), connect_bus=False, http=False)
    assert running.dra is not None
    kubelet = Kubelet(running.dra.registration_socket)
    try:
        yield running, kubelet
    finally:
        await kubelet.close()
        await running.stop()
        with contextlib.suppress(NotFound):
            await kube.delete(dra.RESOURCESLICES, dra.slice_name(node))


def spec_env(spec: dict[str, Any], index: int = 0) -> dict[str, str]:
    env = spec["devices"][index]["containerEdits"]["env"]
    return dict(e.split("=", 1) for e in env)


async def test_registration_names_the_driver_socket_and_both_versions(driver: Any) -> None:
    running, kubelet = driver
    info = await kubelet.register()
    assert info.type == "DRAPlugin"
    assert info.name == dra.DRIVER
    assert info.endpoint == str(running.dra.plugin_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    await within(running.dra.registrar.registered.wait(), 5)
    assert running.metrics.dra_registrations.labels("ok")._value.get() == 1


async def test_prepare_share_writes_cdi_with_limits_and_is_idempotent(
    driver: Any, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    running, kubelet = driver
    node = running.settings.node_name
    running.state.set_gpus(gpus(node))
    share = str(uuid.uuid4())
    claim = await allocated_claim(
        kube,
        namespace,
        "infer-gpu",
        node,
        [
            {
                "device": "gpu-1",
                "shareID": share,
                "consumedCapacity": {"memory": "10Gi", "compute": "30"},
            }
        ],
    )
    uid = claim["metadata"]["uid"]
    await kubelet.register()
    ref = (namespace, "infer-gpu", uid)

    first = (await kubelet.prepare("v1", ref)).claims[uid]
    assert first.error == ""
    [device] = first.devices
    assert (device.pool_name, device.device_name) == (node, "gpu-1")
    assert list(device.request_names) == ["gpu"]
    assert device.share_id == share
    assert list(device.cdi_device_ids) == [f"gpu.alnair.io/gpu={uid}-gpu-gpu-1"]

    spec_file = cdi.spec_path(tmp_path / "cdi", uid)
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == "gpu.alnair.io/gpu"
    assert spec["devices"][0]["name"] == f"{uid}-gpu-gpu-1"
    env = spec_env(spec)
    assert env["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "10240"
    assert env["ALNAIR_GPU_COMPUTE_PCT"] == "30"
    assert env["LD_PRELOAD"] == running.settings.shim_container_path
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-1"
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert {"hostPath": SHIM, "containerPath": running.settings.shim_container_path} in [
        {k: m[k] for k in ("hostPath", "containerPath")} for m in mounts
    ]
    [vgpu] = running.vgpus.records()
    assert (vgpu.gpu_index, vgpu.memory_mib, vgpu.compute_pct) == (1, 10240, 30)
    assert (vgpu.namespace, vgpu.pod) == (namespace, "infer")

    # the kubelet prepares again (a retry, its own restart): same answer, no API read
    reads = running.dra.driver.api_reads
    again = (await kubelet.prepare("v1", ref)).claims[uid]
    assert again == first
    assert running.dra.driver.api_reads == reads
    # the older protocol answers the same devices, without share ids
    beta = (await kubelet.prepare("v1beta1", ref)).claims[uid]
    assert [(d.device_name, list(d.cdi_device_ids)) for d in beta.devices] == [
        (d.device_name, list(d.cdi_device_ids)) for d in first.devices
    ]

    gone = (await kubelet.unprepare("v1", ref)).claims[uid]
    assert gone.error == ""
    assert not spec_file.exists()
    assert running.vgpus.records() == []
    assert (await kubelet.unprepare("v1", ref)).claims[uid].error == ""
    assert (await kubelet.unprepare("v1beta1", ref)).claims[uid].error == ""


async def test_whole_gpu_claim_gets_no_shim_and_mps_config_is_honoured(
    driver: Any, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    running, kubelet = driver
    node = running.settings.node_name
    running.state.set_gpus(gpus(node))
    await kubelet.register()
    whole = await allocated_claim(
        kube,
        namespace,
        "train-gpus",
        node,
        [
            {"device": "gpu-0", "consumedCapacity": {"memory": f"{GPU_MIB}Mi", "compute": "100"}},
            {"device": "gpu-1"},
        ],
    )
    uid = whole["metadata"]["uid"]
    rep = (await kubelet.prepare("v1", (namespace, "train-gpus", uid))).claims[uid]
    assert rep.error == ""
    assert [d.device_name for d in rep.devices] == ["gpu-0", "gpu-1"]
    spec = json.loads(cdi.spec_path(tmp_path / "cdi", uid).read_text())
    for i in range(2):
        env = spec_env(spec, i)
        assert "LD_PRELOAD" not in env and "ALNAIR_GPU_MEMORY_LIMIT_MIB" not in env
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-0,GPU-{node}-1"

    mps = await allocated_claim(
        kube,
        namespace,
        "mps-gpu",
        node,
        [{"device": "gpu-0", "consumedCapacity": {"memory": "20Gi", "compute": "50"}}],
        config=[
            {
                "source": "FromClass",
                "opaque": {
                    "driver": dra.DRIVER,
                    "parameters": {
                        "apiVersion": dra.SHARING_CONFIG_API_VERSION,
                        "kind": dra.SHARING_CONFIG_KIND,
                        "sharing": "mps",
                    },
                },
            }
        ],
    )
    muid = mps["metadata"]["uid"]
    assert (await kubelet.prepare("v1", (namespace, "mps-gpu", muid))).claims[muid].error == ""
    env = spec_env(json.loads(cdi.spec_path(tmp_path / "cdi", muid).read_text()))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert "LD_PRELOAD" not in env


async def test_bad_claims_fail_alone_with_the_reason(
    driver: Any, kube: KubeClient, namespace: str
) -> None:
    running, kubelet = driver
    node = running.settings.node_name
    running.state.set_gpus(gpus(node))
    await kubelet.register()
    good = await allocated_claim(
        kube, namespace, "good", node, [{"device": "gpu-0", "consumedCapacity": {"compute": "10"}}]
    )
    unallocated = await kube.create(
        dra.RESOURCECLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "pending", "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.CLASS_WHOLE}}]
                }
            },
        },
    )
    missing_gpu = await allocated_claim(kube, namespace, "nogpu", node, [{"device": "gpu-7"}])
    g, u, m = (c["metadata"]["uid"] for c in (good, unallocated, missing_gpu))
    rep = await kubelet.prepare(
        "v1",
        (namespace, "good", g),
        (namespace, "pending", u),
        (namespace, "nogpu", m),
        (namespace, "absent", "0000"),
    )
    assert rep.claims[g].error == ""
    assert (
        "is not allocated" in rep.claims[u].error and f"{namespace}/pending" in rep.claims[u].error
    )
    assert "gpu-7" in rep.claims[m].error and "no such GPU" in rep.claims[m].error
    assert "not found" in rep.claims["0000"].error


async def test_slice_follows_gpu_health(driver: Any, kube: KubeClient) -> None:
    running: Running = driver[0]
    assert running.slices is not None
    node = running.settings.node_name
    running.slices.published.clear()
    running.state.set_gpus(gpus(node))
    await within(running.slices.published.wait(), 10)
    stored = await kube.get(dra.RESOURCESLICES, dra.slice_name(node))
    assert stored["spec"]["pool"]["generation"] == 1
    assert [d.get("taints") for d in stored["spec"]["devices"]] == [None, None]

    running.slices.published.clear()
    running.state.apply_health(
        GpuHealthChanged(node=node, gpu_index=1, gpu_uuid=f"GPU-{node}-1", healthy=False, xid=48)
    )
    await within(running.slices.published.wait(), 10)
    stored = await kube.get(dra.RESOURCESLICES, dra.slice_name(node))
    assert stored["spec"]["pool"]["generation"] == 2
    taints = stored["spec"]["devices"][1]["taints"]
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        (dra.TAINT_UNHEALTHY, "xid-48", "NoSchedule")
    ]
    assert "taints" not in stored["spec"]["devices"][0]

    running.slices.published.clear()
    running.state.apply_health(
        GpuHealthChanged(node=node, gpu_index=1, gpu_uuid=f"GPU-{node}-1", healthy=True)
    )
    await within(running.slices.published.wait(), 10)
    stored = await kube.get(dra.RESOURCESLICES, dra.slice_name(node))
    assert stored["spec"]["pool"]["generation"] == 3
    assert all("taints" not in d for d in stored["spec"]["devices"])
