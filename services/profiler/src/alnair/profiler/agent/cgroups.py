"""From a GPU process id to its pod, and a pod's CPU, memory and IO from cgroup v2.

NVML reports GPU processes by host pid. The kubelet puts every container in a cgroup whose
path names the pod uid, so `/proc/<pid>/cgroup` tells us the pod without asking the
container runtime. The path depends on the cgroup version, the kubelet's cgroup driver and
the runtime:

- cgroup v2, systemd driver: `0::/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope` (containerd),
  `.../crio-<id>.scope` (CRI-O), `.../docker-<id>.scope` (dockershim / cri-dockerd);
- cgroup v2, cgroupfs driver: `0::/kubepods/burstable/pod<uid>/<id>`;
- cgroup v1: one line per hierarchy (`4:memory:/kubepods/...`), same names per driver.

Guaranteed pods have no QoS level in the path; kind and some distributions nest everything
under `kubelet.slice/kubelet-kubepods.slice`. A process outside Kubernetes has none of these
and maps to no pod (`None`), which is a status, not an error.

Pod-level counters come from the pod's cgroup directory (the kubelet aggregates all
containers there). On cgroup v2: `cpu.stat` usage_usec, `memory.current`, `io.stat`
rbytes/wbytes. On cgroup v1 the same pod path sits under each controller's hierarchy:
`cpuacct.usage` (ns) under `cpuacct` (or a co-mounted `cpu,cpuacct`), `memory.usage_in_bytes`
under `memory`, `blkio.throttle.io_service_bytes` Read/Write under `blkio`. Rates need two
readings; `rates()` is the pure part.

A kubelet started with `--cgroup-root` puts `kubepods` below that folder: `PodCgroupMeter`'s
`prefix` says where, for pods found by their uid (a GPU process's own path already has it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_RE = re.compile(rf"pod({_UID})(?:\.slice)?$")
_CONTAINER_RE = re.compile(
    r"^(?:(?P<prefix>cri-containerd|crio|docker|cri-o)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIME_BY_PREFIX = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "cri-o": "cri-o",
    "docker": "docker",
}


@dataclass(frozen=True)
class PodCgroup:
    """Where a process sits: its pod, container and the pod's cgroup directory."""

    pod_uid: str
    container_id: str | None
    runtime: str | None
    cgroup_version: int
    # Path of the pod-level cgroup relative to the cgroup mount, e.g.
    # "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice".
    pod_cgroup_path: str


def _parse_path(path: str, version: int) -> PodCgroup | None:
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        match = _POD_RE.search(part)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        container_id: str | None = None
        runtime: str | None = None
        if i + 1 < len(parts):
            cmatch = _CONTAINER_RE.match(parts[i + 1])
            if cmatch is not None:
                container_id = cmatch.group("id")
                prefix = cmatch.group("prefix")
                runtime = _RUNTIME_BY_PREFIX[prefix] if prefix else None
        return PodCgroup(
            pod_uid=uid,
            container_id=container_id,
            runtime=runtime,
            cgroup_version=version,
            pod_cgroup_path="/".join(parts[: i + 1]),
        )
    return None


def parse_proc_cgroup(text: str) -> PodCgroup | None:
    """The pod a process belongs to, from the text of `/proc/<pid>/cgroup`.

    Prefers the unified (v2) line; on v1 uses the first hierarchy that names a pod (they all
    name the same pod, but a controller may be unmounted). None when no line names a pod.
    """
    v1_paths: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and controllers == "":
            found = _parse_path(path, 2)
            if found is not None:
                return found
        else:
            v1_paths.append(path)
    for path in v1_paths:
        found = _parse_path(path, 1)
        if found is not None:
            return found
    return None


def pod_of_pid(pid: int, proc_root: Path = Path("/proc")) -> PodCgroup | None:
    """`parse_proc_cgroup` for a live pid; None when the process is gone or not in a pod."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return parse_proc_cgroup(text)


_QOS = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


def pod_cgroup_candidates(pod_uid: str, qos_class: str) -> list[str]:
    """Where the kubelet puts a pod's cgroup, for each driver and layout, most common first.

    Used for pods that have no GPU process to lead us there (CPU-only pods on a GPU node).
    """
    qos = _QOS.get(qos_class, "besteffort")
    under = pod_uid.replace("-", "_")
    if qos:
        systemd = f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"
        kind = (
            f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-{qos}.slice/"
            f"kubelet-kubepods-{qos}-pod{under}.slice"
        )
        cgroupfs = f"kubepods/{qos}/pod{pod_uid}"
    else:
        systemd = f"kubepods.slice/kubepods-pod{under}.slice"
        kind = f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{under}.slice"
        cgroupfs = f"kubepods/pod{pod_uid}"
    return [systemd, cgroupfs, kind]


@dataclass(frozen=True)
class CgroupCounters:
    """Cumulative counters of one cgroup v2 directory at one instant."""

    ts: float
    cpu_usage_usec: int
    memory_bytes: int
    io_read_bytes: int
    io_write_bytes: int


@dataclass(frozen=True)
class CgroupRates:
    """What a pod did between two readings."""

    cpu_util_cores: float
    mem_used_mib: float
    io_read_bps: float
    io_write_bps: float


def parse_cpu_stat(text: str) -> int:
    """usage_usec from a cgroup v2 `cpu.stat` (0 when the line is missing)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value.strip())
    return 0


def parse_io_stat(text: str) -> tuple[int, int]:
    """Total (rbytes, wbytes) over all devices from a cgroup v2 `io.stat`."""
    read = write = 0
    for line in text.splitlines():
        for item in line.split()[1:]:
            key, _, value = item.partition("=")
            if key == "rbytes":
                read += int(value)
            elif key == "wbytes":
                write += int(value)
    return read, write


def parse_blkio_bytes(text: str) -> tuple[int, int]:
    """Total (read, write) bytes from a cgroup v1 `blkio.throttle.io_service_bytes`."""
    read = write = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2].isdigit():
            if fields[1] == "Read":
                read += int(fields[2])
            elif fields[1] == "Write":
                write += int(fields[2])
    return read, write


_CPUACCT_MOUNTS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")


def v1_hierarchies(root: Path) -> dict[str, Path] | None:
    """The v1 hierarchies the counters come from ({"cpuacct", "memory", "blkio"} -> mount),
    or None on a unified (v2) root (one with `cgroup.controllers`, or without the v1
    hierarchies' folders)."""
    v1 = (root / "memory").is_dir() or any((root / n).is_dir() for n in _CPUACCT_MOUNTS)
    if (root / "cgroup.controllers").exists() or not v1:
        return None
    found = {"memory": root / "memory", "blkio": root / "blkio"}
    found["cpuacct"] = next(
        (root / name for name in _CPUACCT_MOUNTS if (root / name).is_dir()), root / "cpuacct"
    )
    return found


def read_counters_v1(hierarchies: dict[str, Path], rel: str, ts: float) -> CgroupCounters | None:
    """A pod's counters from the cgroup v1 hierarchies; None when the cgroup is gone."""
    try:
        cpu_ns = int((hierarchies["cpuacct"] / rel / "cpuacct.usage").read_text().strip() or 0)
        memory = int(
            (hierarchies["memory"] / rel / "memory.usage_in_bytes").read_text().strip() or 0
        )
    except FileNotFoundError:
        return None
    io_path = hierarchies["blkio"] / rel / "blkio.throttle.io_service_bytes"
    try:
        read, write = parse_blkio_bytes(io_path.read_text())
    except FileNotFoundError:  # blkio not mounted or not delegated: no IO we can see
        read = write = 0
    return CgroupCounters(ts, cpu_ns // 1000, memory, read, write)


def read_counters(cgroup_dir: Path, ts: float) -> CgroupCounters | None:
    """Read a pod's cgroup v2 counters; None when the cgroup is gone (pod ended)."""
    try:
        cpu = parse_cpu_stat((cgroup_dir / "cpu.stat").read_text())
        memory = int((cgroup_dir / "memory.current").read_text().strip() or 0)
        io_path = cgroup_dir / "io.stat"
        # io.stat is absent when the io controller is not delegated; that is no IO we can see.
        read, write = parse_io_stat(io_path.read_text()) if io_path.exists() else (0, 0)
    except FileNotFoundError:
        return None
    return CgroupCounters(ts, cpu, memory, read, write)


def rates(prev: CgroupCounters, cur: CgroupCounters) -> CgroupRates:
    """Rates between two readings of the same cgroup.

    Counters that went backwards (the cgroup was recreated under the same path) count as
    zero activity rather than a negative rate; memory is a level, not a counter.
    """
    dt = cur.ts - prev.ts
    mem_mib = cur.memory_bytes / (1024 * 1024)
    if dt <= 0:
        return CgroupRates(0.0, mem_mib, 0.0, 0.0)
    return CgroupRates(
        cpu_util_cores=max(0, cur.cpu_usage_usec - prev.cpu_usage_usec) / 1e6 / dt,
        mem_used_mib=mem_mib,
        io_read_bps=max(0, cur.io_read_bytes - prev.io_read_bytes) / dt,
        io_write_bps=max(0, cur.io_write_bytes - prev.io_write_bytes) / dt,
    )


class PodCgroupMeter:
    """Keeps the previous reading per pod so each call yields rates since the last one."""

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup"), prefix: str = "") -> None:
        self._root = cgroup_root
        self._prefix = prefix.strip("/")
        self._v1 = v1_hierarchies(cgroup_root)
        self._prev: dict[str, CgroupCounters] = {}
        self._located: dict[str, str] = {}

    @property
    def version(self) -> int:
        return 2 if self._v1 is None else 1

    def _read(self, rel: str, ts: float) -> CgroupCounters | None:
        if self._v1 is not None:
            return read_counters_v1(self._v1, rel, ts)
        return read_counters(self._root / rel, ts)

    def measure(self, pod_uid: str, pod_cgroup_path: str, ts: float) -> CgroupRates | None:
        """Rates since the previous call for this pod; None on the first call or if gone."""
        cur = self._read(pod_cgroup_path, ts)
        if cur is None:
            self._prev.pop(pod_uid, None)
            self._located.pop(pod_uid, None)
            return None
        prev = self._prev.get(pod_uid)
        self._prev[pod_uid] = cur
        return None if prev is None else rates(prev, cur)

    def locate(self, pod_uid: str, qos_class: str) -> str | None:
        """The pod's cgroup directory (relative to the root), if one of the layouts exists."""
        known = self._located.get(pod_uid)
        if known is not None:
            return known
        for candidate in pod_cgroup_candidates(pod_uid, qos_class):
            rel = f"{self._prefix}/{candidate}" if self._prefix else candidate
            where = (
                self._root / rel / "cpu.stat"
                if self._v1 is None
                else self._v1["cpuacct"] / rel / "cpuacct.usage"
            )
            if where.exists():
                self._located[pod_uid] = rel
                return rel
        return None

    def forget_except(self, live_pod_uids: set[str]) -> None:
        """Drop state of pods no longer seen, so memory does not grow with pod churn."""
        for uid in list(self._prev):
            if uid not in live_pod_uids:
                del self._prev[uid]
        for uid in list(self._located):
            if uid not in live_pod_uids:
                del self._located[uid]
