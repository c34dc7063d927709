"""`alnair deviceplugin ...` and `python -m alnair.deviceplugin ...`.

- `run`: the device plugin (settings from the environment).
- `devices --gpus 'UUID:MiB[:numa],...' [--resource R]`: print what the plugin would advertise
  for such GPUs, with the size of the kubelet's ListAndWatch message against its 4 MiB limit
  (a dry run for operators choosing between `alnair.io/gpu-memory-gib` and the MiB resource).
- `region PATH`: decode a container's accounting region written by the intercept shim.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from alnair.common.errors import AlnairError, InvalidValueError
from alnair.common.events import GpuDevice
from alnair.deviceplugin import region
from alnair.deviceplugin.devices import RESOURCES, build_devices
from alnair.deviceplugin.plugin import KUBELET_MAX_MESSAGE_BYTES, list_message_bytes


def parse_gpus(text: str) -> list[GpuDevice]:
    gpus = []
    for i, part in enumerate(p for p in text.split(",") if p):
        fields = part.split(":")
        if len(fields) not in {2, 3} or not fields[1].isdigit():
            raise InvalidValueError("--gpus", part, "expected UUID:MiB or UUID:MiB:NUMA")
        numa = int(fields[2]) if len(fields) == 3 and fields[2].isdigit() else None
        gpus.append(
            GpuDevice(index=i, uuid=fields[0], model="", memory_mib=int(fields[1]), numa_node=numa)
        )
    return gpus


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="alnair deviceplugin")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run the device plugin")
    dv = sub.add_parser("devices", help="print the devices the plugin would advertise")
    dv.add_argument("--gpus", required=True, help="UUID:MiB[:NUMA],... in index order")
    dv.add_argument("--resource", choices=RESOURCES, default=None)
    rg = sub.add_parser("region", help="decode a vGPU accounting region")
    rg.add_argument("path", type=Path)
    args = parser.parse_args(list(argv))
    try:
        if args.cmd == "run":
            from alnair.deviceplugin.app import serve
            from alnair.deviceplugin.settings import DevicePluginSettings

            return asyncio.run(serve(DevicePluginSettings()))
        if args.cmd == "devices":
            gpus = parse_gpus(args.gpus)
            out = {}
            for resource in [args.resource] if args.resource else list(RESOURCES):
                devs = build_devices(resource, gpus)
                size = list_message_bytes(devs)
                out[resource] = {
                    "count": len(devs),
                    "first": [d.id for d in devs[:3]],
                    "message_bytes": size,
                    "fits_kubelet": size <= KUBELET_MAX_MESSAGE_BYTES,
                }
            print(json.dumps(out, indent=2))
            return 0
        snap = region.read(args.path)
        if snap is None:
            print(f"no region at {args.path}", file=sys.stderr)
            return 1
        print(json.dumps(asdict(snap), indent=2))
        return 0
    except AlnairError as exc:
        print(f"alnair deviceplugin: {exc}", file=sys.stderr)
        return 2
