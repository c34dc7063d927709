"""One real node beside the KWOK ones: containerd 2.x (CDI on, runc, CNI on a private bridge)
and the kubelet, registered with the local control plane under the node's own identity (the
Node authorizer and NodeRestriction hold it to its node).

`hack/build-node.sh` builds and caches the kubelet, containerd, the CNI plugins and a static
pause binary; runc comes from Debian. Everything the node makes lives under a short folder in
/tmp (unix socket paths stay under 108 bytes), a cgroup of its own in every v1 hierarchy, a
bridge of its own, and a record in `RECORDS`. `clean()` undoes all of it, for a node that
stopped and for one whose owner crashed: `reap_stale()` cleans every record whose processes
are gone.

The host mounts cgroup v1 (hybrid: a `name=systemd` hierarchy, the controllers each on their
own). The kubelet 1.36 refuses v1 unless `failCgroupV1: false`; that is set here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from alnair.common.errors import ConfigError
from alnair.common.kube import NODES, NotFound
from alnair.dev.localstack.certs import issue_leaf
from alnair.dev.localstack.controlplane import (
    K8S_VERSION,
    ControlPlane,
    cache_dir,
    wait_nodes_ready,
)
from alnair.dev.localstack.images import ImageFile, ImageSpec, write_layout
from alnair.dev.localstack.procs import ManagedProcess, free_port

log = logging.getLogger(__name__)

CONTAINERD_VERSION = "v2.4.2"
CNI_VERSION = "v1.10.0"
PAUSE_IMAGE = "localhost/alnair/pause:1"
REAL_NODE_TAINT = "alnair.io/real-node"
"""The node registers with this NoSchedule taint: only pods that tolerate it land there (the
e2e suite's other pods assume KWOK nodes)."""
RECORDS = Path("/run/alnair-realnode")
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
CGROUP_FS = Path("/sys/fs/cgroup")


def node_binaries() -> dict[str, Path]:
    """Every binary the node runs, or a ConfigError naming the missing one."""
    cache = cache_dir() / "bin"
    ctd = cache / f"containerd-{CONTAINERD_VERSION}"
    found = {
        "kubelet": cache / f"k8s-{K8S_VERSION}" / "kubelet",
        "containerd": ctd / "containerd",
        "containerd-shim-runc-v2": ctd / "containerd-shim-runc-v2",
        "ctr": ctd / "ctr",
        "cni": cache / f"cni-{CNI_VERSION}",
        "pause": cache / "pause" / "pause",
        "runc": Path(shutil.which("runc") or "/usr/sbin/runc"),
    }  # fmt: skip
    missing = [name for name, path in found.items() if not path.exists()]
    if missing:
        raise ConfigError(
            f"the real node needs {', '.join(missing)}: run `bash hack/build-node.sh` "
            "(or `make setup-node`)",
            missing=missing,
        )
    return found


@dataclass
class NodeRecord:
    """What one real node made on this machine, enough to undo it after a crash."""

    name: str
    folder: str
    bridge: str
    cgroup: str
    pids: list[int]
    binds: list[str] = field(default_factory=list)
    """Host paths the node bind-mounted its own folders onto."""
    owner: int | None = None
    """The process the node lives and dies with (a test run); None: it outlives its starter
    (`make up`, cleaned by `make down`)."""

    @property
    def path(self) -> Path:
        return RECORDS / f"{Path(self.folder).name}.json"

    def save(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(asdict(self)))

    def alive(self) -> bool:
        if self.owner is not None and not Path(f"/proc/{self.owner}").exists():
            return False
        return any(_owns(pid, self.folder) for pid in self.pids)


def _owns(pid: int, folder: str) -> bool:
    """Whether process `pid` is running and was started with `folder` on its command line."""
    try:
        return folder in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _cgroup_dirs(cgroup: str) -> list[Path]:
    """The node's cgroup in every mounted v1 hierarchy (and the v2 one, if unified)."""
    roots = [p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink()]
    if (CGROUP_FS / "cgroup.controllers").exists():
        roots = [CGROUP_FS]
    return [root / cgroup.strip("/") for root in roots]


def _kill_tree(folder: str, cgroup: str) -> None:
    """SIGKILL every process the node left: those in its cgroups (containers) and those that
    name its folder (the containerd shims, the kubelet, containerd)."""
    victims: set[int] = set()
    for top in _cgroup_dirs(cgroup):
        if top.exists():
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    victims.update(int(x) for x in procs.read_text().split())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _owns(int(entry.name), folder):
            victims.add(int(entry.name))
    victims.discard(os.getpid())
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in victims):
        time.sleep(0.05)


def mount_points() -> list[str]:
    """Every mount point of this mount namespace (/proc/self/mountinfo)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4].replace("\\040", " ") for line in lines]


def _unmount_under(folder: str) -> None:
    """Every mount under `folder`, deepest first (overlay rootfs, shm, netns, secrets)."""
    under = folder.rstrip("/") + "/"
    for _ in range(5):
        points = [p for p in mount_points() if p == folder or p.startswith(under)]
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def clean(record: NodeRecord, *, remove_folder: bool = True) -> None:
    """Undo everything `record`'s node made: processes, mounts, cgroups, bridge, folder."""
    _kill_tree(record.folder, record.cgroup)
    for bind in record.binds:
        subprocess.run(["umount", "-l", bind], capture_output=True, check=False)
    _unmount_under(record.folder)
    for top in _cgroup_dirs(record.cgroup):
        if top.exists():
            subs = [p for p in top.rglob("*") if p.is_dir()]
            for sub in sorted(subs, key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    subprocess.run(["ip", "link", "delete", record.bridge], capture_output=True, check=False)
    if remove_folder:
        shutil.rmtree(record.folder, ignore_errors=True)
    record.path.unlink(missing_ok=True)


def reap_stale() -> list[str]:
    """Clean the nodes whose owner died (a test run killed mid-way: its kubelet, containerd
    and containers still run) or whose processes are all gone; their names."""
    reaped = []
    if RECORDS.exists():
        for path in RECORDS.glob("*.json"):
            try:
                record = NodeRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if not record.alive():
                clean(record)
                reaped.append(record.name)
    return reaped


class RealNode:
    """A kubelet and containerd registered as node `name` with `cp`.

    `start()` returns once the node is Ready; `stop()` stops both and cleans up (the pods'
    containers included). The kubelet's directories are `kubelet_dir` (device plugins under
    `device-plugins/`, DRA under `plugins/` and `plugins_registry/`); CDI specs are read from
    `cdi_dir`; container logs land under `pod_logs_dir`."""

    def __init__(
        self,
        cp: ControlPlane,
        name: str = "alnair-real-0",
        *,
        labels: dict[str, str] | None = None,
        subnet: int | None = None,
        detached: bool = False,
    ):
        self.cp = cp
        self.name = name
        self.labels = dict(labels or {})
        self.id = secrets.token_hex(3)
        self.folder = Path(f"/tmp/alnair-rn-{self.id}")
        self.bridge = f"alnrn{self.id}"
        self.cgroup = f"/alnair-rn-{self.id}"
        self.subnet = subnet if subnet is not None else 64 + int(self.id, 16) % 128
        self.procs: dict[str, ManagedProcess] = {}
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        owner = None if detached else os.getpid()
        self.record = NodeRecord(name, str(self.folder), self.bridge, self.cgroup, [], owner=owner)

    # --- where things are -------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.folder / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.folder / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """Where plugins find kubelet.sock. The kubelet's device manager does not follow
        --root-dir: it always serves /var/lib/kubelet/device-plugins, so the node bind-mounts
        this folder there (one real node per machine)."""
        return self.kubelet_dir / "device-plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.folder / "cdi"

    @property
    def pod_logs_dir(self) -> Path:
        return self.folder / "pod-logs"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> RealNode:
        bins = node_binaries()
        reap_stale()
        for sub in ("logs", "cdi", "cni/net.d", "containerd", "kubelet", "pod-logs", "pki"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.record.save()
        try:
            for top in _cgroup_dirs(self.cgroup):
                top.mkdir(exist_ok=True)
            self._bind(self.device_plugin_dir, KUBELET_DEVICE_PLUGINS)
            self._make_bridge()
            self._write_cni()
            self._start_containerd(bins)
            self._import(bins, self._pause_image(bins))
            self._start_kubelet(bins)
            asyncio.run(self._wait_ready(timeout_s))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the kubelet and containerd, undo what they made, and delete the Node (its
        pods go with it, by the pod garbage collector)."""
        for name in ("kubelet", "containerd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.stop()
        if os.environ.get("ALNAIR_KEEP_LOGS") and self.logs.exists():
            kept = Path(tempfile.gettempdir()) / f"alnair-realnode-logs-{self.id}"
            shutil.copytree(self.logs, kept, dirs_exist_ok=True)
            print(f"real node logs kept in {kept}")
        clean(self.record)
        with contextlib.suppress(Exception):
            asyncio.run(self._delete_node())

    async def _delete_node(self) -> None:
        async with self.cp.client() as kube:
            with contextlib.suppress(NotFound):
                await kube.delete(NODES, self.name)

    def import_image(self, spec: ImageSpec) -> None:
        """Build `spec` as an OCI layout and import it into the node's containerd (pods use
        it with `imagePullPolicy: Never`)."""
        self._import(node_binaries(), write_layout(spec, self.folder / "image.tar"))

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`ctr` against the node's containerd, in the CRI's `k8s.io` namespace."""
        return self._ctr(node_binaries(), *args)

    def task_pid(self, container_id: str) -> int:
        """The host pid of a running container's first process."""
        done = self.ctr("tasks", "ls")
        for line in done.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == container_id:
                return int(fields[1])
        raise ConfigError(f"no running task {container_id} in containerd: {done.stdout}")

    def restart_kubelet(self) -> None:
        proc = self.procs["kubelet"]
        proc.stop()
        proc.start()
        self._track()

    # --- parts -------------------------------------------------------------------------------

    def _track(self) -> None:
        self.record.pids = [p.proc.pid for p in self.procs.values() if p.proc is not None]
        self.record.save()

    @property
    def node_ip(self) -> str:
        """The bridge's own address: the kubelet refuses a loopback node IP, and the API
        server reaches the kubelet (logs, exec) on it."""
        return f"10.89.{self.subnet}.1"

    def _bind(self, source: Path, target: Path) -> None:
        if str(target) in mount_points():
            raise ConfigError(
                f"{target} is already a mount point: another real node runs on this machine "
                f"(`mount | grep {target}`; `make down` stops the local stack's)",
                path=str(target),
            )
        source.mkdir(parents=True, exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        self.record.binds.append(str(target))
        self.record.save()
        argv = ["mount", "--bind", str(source), str(target)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"bind-mounting {source} on {target}: {done.stderr.strip()}")

    def _make_bridge(self) -> None:
        for argv in (
            ["ip", "link", "add", "name", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.node_ip}/24", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ConfigError(
                    f"the real node's bridge: `{' '.join(argv)}` failed: {done.stderr.strip()}",
                    bridge=self.bridge,
                )

    def _write_cni(self) -> None:
        conf = {
            "cniVersion": "1.0.0",
            "name": "alnair-realnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": f"10.89.{self.subnet}.0/24"}]],
                        "dataDir": str(self.folder / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.folder / "cni/net.d/10-alnair.conflist").write_text(json.dumps(conf))

    def _start_containerd(self, bins: dict[str, Path]) -> None:
        f = self.folder
        rt = "plugins.'io.containerd.cri.v1.runtime'"
        config = f"""version = 3
root = "{f}/containerd/root"
state = "{f}/containerd/state"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{f}/containerd/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{rt}]
  cdi_spec_dirs = ["{self.cdi_dir}"]
  netns_mounts_under_state_dir = true
  enable_selinux = false
  # This machine refuses a lower oom_score_adj even to root: clamp to containerd's own.
  restrict_oom_score_adj = true
[{rt}.containerd]
  default_runtime_name = "runc"
[{rt}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{rt}.containerd.runtimes.runc.options]
  BinaryName = "{os.environ.get("ALNAIR_REALNODE_RUNC", bins["runc"])}"
  SystemdCgroup = false
  Root = "{f}/runc"
[{rt}.cni]
  bin_dirs = ["{bins["cni"]}"]
  conf_dir = "{f}/cni/net.d"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""
        path = f / "containerd" / "config.toml"
        path.write_text(config)
        env = {**os.environ, "PATH": f"{bins['containerd'].parent}:{os.environ.get('PATH', '')}"}
        proc = ManagedProcess(
            "containerd", [str(bins["containerd"]), "--config", str(path)], self.logs, env
        )
        self.procs["containerd"] = proc
        proc.start()
        self._track()
        proc.wait_ready(lambda: self._ctr(bins, "version").returncode == 0, 30)

    def _ctr(self, bins: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(bins["ctr"]), "--address", str(self.socket), "--namespace", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    def _import(self, bins: dict[str, Path], layout: Path) -> None:
        done = self._ctr(bins, "images", "import", "--local", str(layout))
        if done.returncode != 0:
            raise ConfigError(
                f"containerd refused the image {layout}: {done.stderr.strip()}", image=str(layout)
            )

    def _pause_image(self, bins: dict[str, Path]) -> Path:
        spec = ImageSpec(PAUSE_IMAGE, {"/pause": ImageFile(bins["pause"])}, entrypoint=["/pause"])
        return write_layout(spec, self.folder / "pause.tar")

    def _start_kubelet(self, bins: dict[str, Path]) -> None:
        pki = self.cp.pki
        assert pki is not None
        d = self.folder / "pki"
        user, group = f"system:node:{self.name}", "system:nodes"
        issue_leaf(pki, user, group, d / "client.crt", d / "client.key")
        issue_leaf(pki, user, group, d / "serving.crt", d / "serving.key", server_ip=self.node_ip)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.cp.server, "certificate-authority": str(pki.ca_cert)}}],
            "users": [{"name": "node", "user": {
                "client-certificate": str(d / "client.crt"), "client-key": str(d / "client.key")}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
            "current-context": "node",
        }  # fmt: skip
        (self.folder / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(d / "serving.crt"),
            "tlsPrivateKeyFile": str(d / "serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "registerWithTaints": [
                {"key": REAL_NODE_TAINT, "value": "true", "effect": "NoSchedule"}
            ],
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "maxPods": 32,
            "podLogsDir": str(self.pod_logs_dir),
            "serializeImagePulls": False,
            "resolvConf": "",
        }
        path = self.folder / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = ManagedProcess(
            "kubelet",
            [
                str(bins["kubelet"]),
                "--config", str(path),
                "--kubeconfig", str(self.folder / "kubelet.kubeconfig"),
                "--root-dir", str(self.kubelet_dir),
                "--cert-dir", str(d),
                "--hostname-override", self.name,
                "--node-ip", self.node_ip,
                *(["--node-labels", ",".join(f"{k}={v}" for k, v in self.labels.items())]
                  if self.labels else []),
                "--v", "2",
            ],
            self.logs,
        )  # fmt: skip
        self.procs["kubelet"] = proc
        proc.start()
        self._track()

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.healthz_port}/healthz"
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    async def _wait_ready(self, timeout_s: float) -> None:
        async with self.cp.client() as kube:
            try:
                await wait_nodes_ready(kube, {self.name}, timeout_s)
            except TimeoutError:
                kubelet = self.procs["kubelet"]
                state = "running" if kubelet.alive() else "exited"
                raise ConfigError(
                    f"node {self.name} not Ready after {timeout_s:.0f} s (kubelet {state}): "
                    f"{kubelet.tail(40)}",
                    node=self.name,
                ) from None
