"""The kubelet's gRPC APIs: the .proto files and the message classes made from them.

`api.proto` (device plugin v1beta1), `dra_v1.proto` / `dra_v1beta1.proto` (the DRA plugin
service), `pluginregistration.proto` (how a DRA plugin introduces itself to the kubelet) and
`podresources_v1.proto` (which container holds which devices, as the kubelet recorded it) are
written from the published APIs; each `<name>_pb2.py` / `<name>_pb2.pyi` is generated
from its .proto by `python -m alnair.deviceplugin.protos` (the root Makefile runs that at setup) and
committed, so a checkout works without running the generator. The gRPC service plumbing is not
generated: `alnair.deviceplugin.plugin` builds the method handlers itself over these messages,
which keeps every line mypy checks typed.
"""

from __future__ import annotations

from pathlib import Path

PROTO = Path(__file__).with_name("api.proto")
"""The device plugin's .proto."""
PROTOS = tuple(
    Path(__file__).with_name(n)
    for n in (
        "api.proto",
        "dra_v1.proto",
        "dra_v1beta1.proto",
        "pluginregistration.proto",
        "podresources_v1.proto",
    )
)
"""Every .proto the stubs are generated from."""

SERVICE_DEVICE_PLUGIN = "v1beta1.DevicePlugin"
SERVICE_REGISTRATION = "v1beta1.Registration"
API_VERSION = "v1beta1"

SERVICE_DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
SERVICE_DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
SERVICE_PLUGIN_REGISTRATION = "pluginregistration.Registration"
SERVICE_POD_RESOURCES = "v1.PodResourcesLister"
DRA_SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What a DRA plugin lists as `supported_versions`: the kubelet picks the newest it knows."""
DRA_PLUGIN_TYPE = "DRAPlugin"
