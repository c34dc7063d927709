"""Settings of the device plugin (env prefix `ALNAIR_DEVICEPLUGIN_`).

Runs as a DaemonSet on every GPU node, with the kubelet's device-plugin directory and the
node's Alnair state directory mounted from the host. Connection settings also answer to the
plain `ALNAIR_` names so one ConfigMap serves every service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from alnair.common.settings import DEFAULT_HTTP_PORTS, ServiceSettings
from alnair.deviceplugin.allocation import Layout
from alnair.deviceplugin.devices import DEFAULT_RESOURCES


class DevicePluginSettings(ServiceSettings):
    """Everything the device plugin reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="ALNAIR_DEVICEPLUGIN_", extra="ignore")

    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["deviceplugin"],
        ge=0,
        le=65535,
        description="HTTP API port (0: any)",
    )
    node_name: str = Field(
        default="",
        validation_alias=AliasChoices("ALNAIR_DEVICEPLUGIN_NODE_NAME", "NODE_NAME"),
        description="this node's name (the downward API's spec.nodeName)",
    )
    kubelet_dir: Path = Field(
        default=Path("/var/lib/kubelet/device-plugins"),
        description="the kubelet's device-plugin directory (its socket and ours live here)",
    )
    kubelet_socket: str = Field(
        default="kubelet.sock", description="file name of the kubelet's registration socket"
    )
    resources: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RESOURCES),
        description="resources to serve, out of nvidia.com/gpu, alnair.io/gpu-memory-gib (one "
        "device per GiB), alnair.io/gpu-memory (one per MiB: only nodes under ~140,000 MiB of "
        "GPU memory fit the kubelet's message), alnair.io/gpu-compute",
    )
    memory_unit_mib: int | None = Field(
        default=None,
        description="removed: the memory unit is the resource's name (alnair.io/gpu-memory-gib "
        "or alnair.io/gpu-memory); setting it is an error so no node advertises units the "
        "scheduler reads otherwise",
    )
    sharing_mode: Literal["intercept", "mps"] = Field(
        default="intercept",
        description="how fractions are enforced: the LD_PRELOAD shim, or CUDA MPS limits",
    )
    shim_host_path: str = Field(
        default="/usr/local/alnair/lib/libalnair-intercept.so",
        description="the intercept shim on the host, mounted read-only into fractional pods",
    )
    shim_container_path: str = Field(
        default="/usr/local/alnair/lib/libalnair-intercept.so",
        description="where the shim appears inside the container (the LD_PRELOAD value)",
    )
    state_dir: str = Field(
        default="/var/lib/alnair",
        description="host directory for vGPU regions and the registry socket",
    )
    container_run_dir: str = Field(
        default="/var/run/alnair",
        description="where a fractional container sees its region and the registry socket",
    )
    mps_pipe_dir: str = Field(
        default="/tmp/nvidia-mps", description="CUDA MPS pipe directory (sharing_mode=mps)"
    )
    use_pod_annotations: bool = Field(
        default=True,
        description="look up the pod being admitted to honour the scheduler's GPU choice",
    )
    mode: Literal["deviceplugin", "dra", "both"] = Field(
        default="deviceplugin",
        description="which kubelet API serves the GPUs: the device plugin (clusters without "
        "DRA), the DRA driver gpu.alnair.io (ResourceSlices, claims prepared with CDI), or both",
    )
    dra_plugins_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins"),
        description="the kubelet's plugins directory; the DRA socket is "
        "<dir>/gpu.alnair.io/dra.sock",
    )
    dra_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="the directory the kubelet watches for plugin-registration sockets",
    )
    cdi_dir: Path = Field(
        default=Path("/var/run/cdi"),
        description="where the container runtime reads CDI spec files (one per prepared claim)",
    )
    pod_resources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="the kubelet's PodResources API: which pod holds a fraction that Allocate "
        "could not attribute (a pod another scheduler bound)",
    )
    register_retry_max_s: float = Field(
        default=5.0, gt=0, description="longest wait between attempts to reach the kubelet"
    )
    ready_when_registered: bool = Field(
        default=True,
        description="/readyz answers 200 only while every resource (and the DRA driver) is "
        "registered with the kubelet; false on a node without a kubelet (KWOK in the local "
        "stack), where nothing would ever register",
    )
    source: str = Field(
        default="alnair-deviceplugin", description="CloudEvents source of this service's events"
    )

    @property
    def dra_checkpoint_dir(self) -> Path:
        """Prepared claims, so a repeated prepare answers without the API server."""
        return Path(self.state_dir) / "dra" / "claims"

    def layout(self) -> Layout:
        return Layout(
            shim_host_path=self.shim_host_path,
            shim_container_path=self.shim_container_path,
            state_dir=self.state_dir,
            container_run_dir=self.container_run_dir,
            mps_pipe_dir=self.mps_pipe_dir,
        )
