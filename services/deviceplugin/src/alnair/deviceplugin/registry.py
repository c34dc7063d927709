"""The node's vGPU registry: where intercept shims register, and how they hear utilisation.

Every process that loads the shim connects to the registry's unix socket (mounted into its
container) and sends one line, `REGISTER vgpu=<id> pid=<pid> region=<path> memory=<limits>
compute=<pct>`. The registry learns the process's host pid from the socket's peer credentials
and its exit from the connection closing, so nobody reports liveness on a timer. Usage is read
from the container's accounting region (a file in the vGPU's host directory) when metrics are
scraped. In the other direction the registry forwards the container's measured utilisation
(`UTIL <device> <percent>`), which the shim's launch throttle needs to hold the compute share;
measurements arrive as the profiler's pod metrics, so forwarding is event-driven too.

Each allocated vGPU is recorded (`allocation.json` in its host directory), so a restarted
plugin still knows which pod a region belongs to; the record and directory go when the pod is
deleted or finishes (a pod watch tells), or, for pods deleted while the plugin was away, at
the first complete pod list after it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from alnair.common.errors import InvalidValueError
from alnair.deviceplugin import region
from alnair.deviceplugin.allocation import REGION_FILE, Layout

log = logging.getLogger(__name__)

RECORD_FILE = "allocation.json"
_REGISTER_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Registration:
    """What a shim says about itself when it connects."""

    vgpu_id: str
    pid: int
    region: str = "-"
    memory: str = "-"
    compute: str = "-"


def parse_register(line: str) -> Registration:
    """Parse a REGISTER line; InvalidValueError names what is missing or malformed."""
    words = line.strip().split()
    if not words or words[0] != "REGISTER":
        raise InvalidValueError("registry line", line.strip()[:80], "expected REGISTER ...")
    fields: dict[str, str] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep:
            raise InvalidValueError("registry field", word, "expected key=value")
        fields[key] = value
    vgpu = fields.get("vgpu", "-")
    if vgpu in {"", "-"}:
        raise InvalidValueError("vgpu", vgpu, "the shim was started without ALNAIR_VGPU_ID")
    pid_text = fields.get("pid", "")
    if not pid_text.isdigit():
        raise InvalidValueError("pid", pid_text, "expected a process id")
    return Registration(
        vgpu_id=vgpu,
        pid=int(pid_text),
        region=fields.get("region", "-"),
        memory=fields.get("memory", "-"),
        compute=fields.get("compute", "-"),
    )


@dataclass(frozen=True)
class VgpuRecord:
    """One container's fraction of one GPU, as Allocate granted it."""

    vgpu_id: str
    gpu_index: int
    gpu_uuid: str
    memory_mib: int | None = None
    compute_pct: int | None = None
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""


@dataclass
class ShimConnection:
    registration: Registration
    host_pid: int | None
    writer: asyncio.StreamWriter = field(repr=False)


class VgpuRegistry:
    """The registry's server and its view of every vGPU on the node."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.socket_path = Path(layout.registry_host_socket)
        self._records: dict[str, VgpuRecord] = {}
        self._conns: dict[str, list[ShimConnection]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._changed = asyncio.Event()
        self.seen: list[Registration] = []
        """Every registration since start, also of processes already gone."""

    # --- allocations ---------------------------------------------------------------------

    def record(self, rec: VgpuRecord) -> None:
        """Remember a granted vGPU and prepare its host directory (mounted into the container)."""
        host_dir = Path(self.layout.vgpu_host_dir(rec.vgpu_id))
        host_dir.mkdir(parents=True, exist_ok=True)
        # processes in the container may run as any user: they must create the region file
        host_dir.chmod(0o1777)
        tmp = host_dir / (RECORD_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(rec), sort_keys=True))
        tmp.replace(host_dir / RECORD_FILE)
        self._records[rec.vgpu_id] = rec

    def load_records(self) -> int:
        """Read the records a previous run of the plugin left; returns how many."""
        base = Path(self.layout.state_dir) / "vgpu"
        count = 0
        for path in sorted(base.glob(f"*/{RECORD_FILE}")):
            try:
                rec = VgpuRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable vGPU record", extra={"path": str(path), "error": str(exc)})
                continue
            self._records[rec.vgpu_id] = rec
            count += 1
        return count

    def forget(self, vgpu_id: str) -> bool:
        """Drop a vGPU whose pod is gone, with its host directory (region, record)."""
        rec = self._records.pop(vgpu_id, None)
        shutil.rmtree(self.layout.vgpu_host_dir(vgpu_id), ignore_errors=True)
        if rec is not None:
            log.info("vGPU released", extra={"vgpu": vgpu_id, "pod": rec.pod})
        return rec is not None

    def forget_pod(self, pod_uid: str) -> list[str]:
        """Drop every vGPU of the pod with `pod_uid`; returns their ids."""
        gone = [r.vgpu_id for r in self._records.values() if pod_uid and r.pod_uid == pod_uid]
        for vgpu_id in gone:
            self.forget(vgpu_id)
        return gone

    def reconcile(self, live_pod_uids: set[str]) -> list[str]:
        """Drop the vGPUs of pods that no longer exist (deleted while the plugin was away).

        vGPUs granted without a known pod cannot be matched and stay."""
        gone = [
            r.vgpu_id
            for r in self._records.values()
            if r.pod_uid and r.pod_uid not in live_pod_uids
        ]
        for vgpu_id in gone:
            self.forget(vgpu_id)
        return gone

    def records(self) -> list[VgpuRecord]:
        return list(self._records.values())

    def for_pod(self, namespace: str, pod: str) -> list[VgpuRecord]:
        return [r for r in self._records.values() if r.namespace == namespace and r.pod == pod]

    def usage(self, vgpu_id: str) -> region.RegionSnapshot | None:
        path = Path(self.layout.vgpu_host_dir(vgpu_id)) / REGION_FILE
        try:
            return region.read(path)
        except InvalidValueError as exc:
            log.warning("bad region", extra={"vgpu": vgpu_id, "error": str(exc)})
            return None

    def connections(self, vgpu_id: str | None = None) -> list[ShimConnection]:
        if vgpu_id is not None:
            return list(self._conns.get(vgpu_id, ()))
        return [c for conns in self._conns.values() for c in conns]

    # --- server --------------------------------------------------------------------------

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        # shims run as the container's user, whoever that is
        self.socket_path.chmod(0o666)
        log.info("vGPU registry listening", extra={"socket": str(self.socket_path)})

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in self.connections():
                conn.writer.close()
            await self._server.wait_closed()
            self._server = None

    async def wait_registered(self, vgpu_id: str, count: int = 1) -> list[ShimConnection]:
        """Wait until `count` processes of `vgpu_id` are connected (tests, tooling)."""
        while len(self._conns.get(vgpu_id, ())) < count:
            self._changed.clear()
            await self._changed.wait()
        return self.connections(vgpu_id)

    async def send_utilization(self, vgpu_id: str, pct: float, device: int = 0) -> int:
        """Tell every process of `vgpu_id` its container's measured utilisation."""
        line = f"UTIL {device} {pct:.2f}\n".encode()
        sent = 0
        for conn in self.connections(vgpu_id):
            try:
                conn.writer.write(line)
                await conn.writer.drain()
                sent += 1
            except (ConnectionError, OSError):
                continue  # the process is exiting; its connection's end removes it
        return sent

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), _REGISTER_TIMEOUT_S)
            reg = parse_register(line.decode(errors="replace"))
        except (TimeoutError, InvalidValueError, ConnectionError) as exc:
            log.warning("shim registration refused", extra={"error": str(exc)})
            writer.close()
            return
        conn = ShimConnection(reg, _peer_pid(writer), writer)
        self.seen.append(reg)
        self._conns.setdefault(reg.vgpu_id, []).append(conn)
        self._changed.set()
        log.info(
            "shim registered",
            extra={"vgpu": reg.vgpu_id, "pid": reg.pid, "host_pid": conn.host_pid},
        )
        try:
            # nothing more is expected from the shim: reading only tells us when it is gone
            while await reader.read(4096):
                pass
        except ConnectionError:
            pass
        finally:
            conns = self._conns.get(reg.vgpu_id, [])
            if conn in conns:
                conns.remove(conn)
            if not conns:
                self._conns.pop(reg.vgpu_id, None)
            self._changed.set()
            writer.close()
            log.info("shim gone", extra={"vgpu": reg.vgpu_id, "pid": reg.pid})


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _uid, _gid = struct.unpack("3i", raw)
    return int(pid) if pid > 0 and pid != os.getpid() else None
