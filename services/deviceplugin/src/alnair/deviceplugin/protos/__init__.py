"""The kubelet device plugin API (v1beta1): the .proto and the message classes made from it.

`api.proto` is written from the published API; `api_pb2.py` / `api_pb2.pyi` are generated
from it by `python -m alnair.deviceplugin.protos` (the root Makefile runs that at setup) and
committed, so a checkout works without running the generator. The gRPC service plumbing is not
generated: `alnair.deviceplugin.plugin` builds the method handlers itself over these messages,
which keeps every line mypy checks typed.
"""

from __future__ import annotations

from pathlib import Path

PROTO = Path(__file__).with_name("api.proto")
"""The .proto the stubs are generated from."""

SERVICE_DEVICE_PLUGIN = "v1beta1.DevicePlugin"
SERVICE_REGISTRATION = "v1beta1.Registration"
API_VERSION = "v1beta1"
