"""The node's vGPU registry: where intercept shims register, and how they hear utilisation.

Every process that loads the shim connects to its vGPU's unix socket (mounted into its
container) and sends one line, `REGISTER vgpu=<id> pid=<pid> region=<path> memory=<limits>
compute=<pct>`. The registry learns the process's host pid from the socket's peer credentials
and its exit from the connection closing, so nobody reports liveness on a timer.

One socket per vGPU (`<state>/registry/<vgpu>/registry.sock`, its directory mounted as the
container's `/var/run/alnair/registry`): which vGPU a process speaks for is decided by which
socket it can reach, not by what it claims, so a container can neither register as another
container's vGPU nor read another's utilisation, and never sees another's socket. A line that
names another vGPU is refused. The directory is the plugin's (0755) and only the socket in it
is open to the container's user. The bookkeeping is bounded: at most `max_connections` per
vGPU (a fork bomb of shims is refused beyond it), a REGISTER line of at most 4 KiB within
5 s, a peer that sends anything after it is cut off, the history of registrations is a ring,
and a vGPU's socket, connections and directories go when its pod goes. Usage is read
from the container's accounting region (a file in the vGPU's host directory) when metrics are
scraped. In the other direction the registry forwards the container's measured utilisation
(`UTIL <device> <percent>`), which the shim's launch throttle needs to hold the compute share;
measurements arrive as the profiler's pod metrics, so forwarding is event-driven too.

Each allocated vGPU is recorded (`records/<vgpu>.json` in the plugin's state), so a restarted
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
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from alnair.common.errors import InvalidValueError
from alnair.common.tasks import spawn, within
from alnair.deviceplugin import region
from alnair.deviceplugin.allocation import REGION_FILE, Layout

log = logging.getLogger(__name__)

RECORDS_DIR = "records"
_REGISTER_TIMEOUT_S = 5.0
_LINE_LIMIT = 4096
SEEN_KEPT = 1024
_SUN_PATH_MAX = 107


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
    resource: str = ""
    """The resource Allocate granted it for, and the device IDs it named: how the kubelet's
    PodResources API tells its pod when Allocate could not."""
    device_ids: tuple[str, ...] = ()


Attribution = Callable[[VgpuRecord], Awaitable[VgpuRecord | None]]
"""Finds the pod of a vGPU granted without one (`podresources.PodResources.attribute`)."""


@dataclass
class ShimConnection:
    registration: Registration
    host_pid: int | None
    writer: asyncio.StreamWriter = field(repr=False)


class VgpuRegistry:
    """The registry's servers (one socket per vGPU) and its view of every vGPU on the node."""

    def __init__(
        self,
        layout: Layout,
        *,
        max_connections: int = 256,
        attribute: Attribution | None = None,
    ) -> None:
        self.layout = layout
        self.max_connections = max_connections
        self.attribute = attribute
        self._records: dict[str, VgpuRecord] = {}
        self._conns: dict[str, list[ShimConnection]] = {}
        self._pending: dict[str, int] = {}
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._started = False
        self._changed = asyncio.Event()
        self.refused = 0
        """Connections refused (bad line, wrong vGPU, over the limit, chatter)."""
        self.seen: deque[Registration] = deque(maxlen=SEEN_KEPT)
        """The latest registrations, also of processes already gone (a bounded ring)."""

    def _records_dir(self) -> Path:
        return Path(self.layout.state_dir) / RECORDS_DIR

    def socket_for(self, vgpu_id: str) -> Path:
        """The host path of `vgpu_id`'s registry socket."""
        return Path(self.layout.registry_socket(vgpu_id))

    # --- allocations ---------------------------------------------------------------------

    def record(self, rec: VgpuRecord) -> None:
        """Remember a granted vGPU and prepare its host directory (mounted into the container).

        The record itself is kept in the plugin's own directory, never in the one the
        container writes: there a container could forge its record or plant a symlink that
        the plugin, running as root, would write through."""
        host_dir = Path(self.layout.vgpu_host_dir(rec.vgpu_id))
        host_dir.mkdir(parents=True, exist_ok=True)
        # processes in the container may run as any user: they must create the region file
        host_dir.chmod(0o1777)
        records = self._records_dir()
        _plugin_dir(records)
        tmp = records / f"{rec.vgpu_id}.json.tmp"
        tmp.write_text(json.dumps(asdict(rec), sort_keys=True))
        tmp.replace(records / f"{rec.vgpu_id}.json")
        self._records[rec.vgpu_id] = rec
        if self._started and rec.vgpu_id not in self._servers:
            self._listen(rec.vgpu_id)

    def load_records(self) -> int:
        """Read the records a previous run of the plugin left; returns how many."""
        count = 0
        for path in sorted(self._records_dir().glob("*.json")):
            try:
                doc = json.loads(path.read_text())
                doc["device_ids"] = tuple(doc.get("device_ids") or ())
                rec = VgpuRecord(**doc)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable vGPU record", extra={"path": str(path), "error": str(exc)})
                continue
            self._records[rec.vgpu_id] = rec
            count += 1
        return count

    def forget(self, vgpu_id: str) -> bool:
        """Drop a vGPU whose pod is gone, with its host directory (region, record)."""
        rec = self._records.pop(vgpu_id, None)
        server = self._servers.pop(vgpu_id, None)
        if server is not None:
            server.close()
        for conn in self._conns.pop(vgpu_id, []):
            conn.writer.close()
        self._pending.pop(vgpu_id, None)
        shutil.rmtree(self.layout.vgpu_host_dir(vgpu_id), ignore_errors=True)
        shutil.rmtree(self.layout.registry_dir(vgpu_id), ignore_errors=True)
        (self._records_dir() / f"{vgpu_id}.json").unlink(missing_ok=True)
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

    async def _attribute(self, vgpu_id: str) -> None:
        """Its pod, for a vGPU granted without one, once its container runs."""
        rec = self._records.get(vgpu_id)
        if rec is None or rec.pod or self.attribute is None:
            return
        found = await self.attribute(rec)
        if found is None or vgpu_id not in self._records:
            return
        self.record(found)
        log.info(
            "vGPU attributed to its pod by the kubelet's record",
            extra={"vgpu": vgpu_id, "namespace": found.namespace, "pod": found.pod},
        )

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
        """Open the socket of every recorded vGPU; later records open theirs at once."""
        base = self.layout.registry_host_dir
        _plugin_dir(Path(base))
        self._started = True
        for vgpu_id in list(self._records):
            self._listen(vgpu_id)
        log.info("vGPU registry listening", extra={"dir": base, "vgpus": len(self._servers)})

    def _listen(self, vgpu_id: str) -> None:
        # Bound and listening before Allocate returns, so the container's first process finds
        # it; connections queue in the backlog until the server task accepts them.
        path = self.socket_for(vgpu_id)
        _plugin_dir(path.parent)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _bind(sock, path)
        except OSError:
            sock.close()
            raise
        # shims run as the container's user, whoever that is; only their own vGPU's socket
        path.chmod(0o666)
        sock.listen(64)
        sock.setblocking(False)
        spawn(self._serve_socket(vgpu_id, sock), name=f"deviceplugin.registry.{vgpu_id}")

    async def _serve_socket(self, vgpu_id: str, sock: socket.socket) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(vgpu_id, reader, writer)

        server = await asyncio.start_unix_server(handle, sock=sock, limit=_LINE_LIMIT)
        if vgpu_id not in self._records or not self._started:
            server.close()  # forgotten or stopped while starting
            return
        self._servers[vgpu_id] = server

    async def stop(self) -> None:
        self._started = False
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()
        for conn in self.connections():
            conn.writer.close()
        for server in servers:
            await server.wait_closed()

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

    async def _serve(
        self, vgpu_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        held = len(self._conns.get(vgpu_id, ())) + self._pending.get(vgpu_id, 0)
        if held >= self.max_connections:
            self._refuse(writer, vgpu_id, f"more than {self.max_connections} connections")
            return
        self._pending[vgpu_id] = self._pending.get(vgpu_id, 0) + 1
        try:
            line = await within(reader.readline(), _REGISTER_TIMEOUT_S)
            reg = parse_register(line.decode(errors="replace"))
        except (TimeoutError, InvalidValueError, ConnectionError, ValueError) as exc:
            # ValueError: a line over the limit (asyncio's LimitOverrunError)
            self._refuse(writer, vgpu_id, str(exc) or type(exc).__name__)
            return
        finally:
            if vgpu_id in self._pending:
                self._pending[vgpu_id] -= 1
        if reg.vgpu_id != vgpu_id:
            self._refuse(writer, vgpu_id, f"claims vGPU {reg.vgpu_id!r} on another's socket")
            return
        if vgpu_id not in self._records:
            self._refuse(writer, vgpu_id, "vGPU released")
            return
        conn = ShimConnection(reg, _peer_pid(writer), writer)
        self.seen.append(reg)
        self._conns.setdefault(reg.vgpu_id, []).append(conn)
        self._changed.set()
        log.info(
            "shim registered",
            extra={"vgpu": reg.vgpu_id, "pid": reg.pid, "host_pid": conn.host_pid},
        )
        await self._attribute(reg.vgpu_id)
        try:
            # Nothing more is expected from the shim: reading only tells us when it is gone.
            # A peer that talks anyway is cut off instead of being read forever.
            if await reader.read(1):
                log.warning("shim sent data after REGISTER: disconnected", extra={"vgpu": vgpu_id})
                self.refused += 1
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

    def _refuse(self, writer: asyncio.StreamWriter, vgpu_id: str, reason: str) -> None:
        self.refused += 1
        log.warning("shim registration refused", extra={"vgpu": vgpu_id, "error": reason})
        writer.close()


def _plugin_dir(path: Path) -> None:
    """A directory the plugin owns: containers that mount it can replace or add nothing."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)


def _bind(sock: socket.socket, path: Path) -> None:
    """Bind `sock` at `path`, also when the path is longer than a unix socket address holds
    (107 bytes): through the directory's /proc/self/fd link, which is always short."""
    if len(str(path).encode()) <= _SUN_PATH_MAX:
        sock.bind(str(path))
        return
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.bind(f"/proc/self/fd/{dirfd}/{path.name}")
    finally:
        os.close(dirfd)


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
