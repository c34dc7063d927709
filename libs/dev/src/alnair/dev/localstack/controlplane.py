"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, KWOK.

This is what envtest and KWOK's own clusters run. The API server has RBAC on (our RBAC
manifests are really exercised) and trusts a throwaway CA; `kubeconfig` authenticates as a
`system:masters` admin. The controller manager runs every controller (Job, StatefulSet, garbage
collection, node lifecycle). KWOK plays the kubelet of every node annotated
`kwok.x-k8s.io/node: fake` with the stages in `kwok-stages.yaml` (Running at once; Succeeded after
the pod's `alnair.io/duration`). CRDs are applied from the same manifests that ship in
`deploy/kustomize/crds`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from alnair.common import resources as r
from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.kube import (
    APISERVICES,
    CRDS,
    KIND_RESOURCES,
    NODES,
    SERVICES,
    Conflict,
    KubeClient,
    NotFound,
    Obj,
    Resource,
)
from alnair.dev.localstack.audit import AuditEvent, read_events, write_policy
from alnair.dev.localstack.certs import (
    FRONT_PROXY_CLIENT,
    KUBELET_API_CLIENT,
    Pki,
    issue_leaf,
    make_pki,
)
from alnair.dev.localstack.procs import ManagedProcess, free_port

K8S_VERSION = os.environ.get("ALNAIR_K8S_VERSION", "v1.36.3")
ETCD_VERSION = os.environ.get("ALNAIR_ETCD_VERSION", "v3.6.16")
KWOK_VERSION = os.environ.get("ALNAIR_KWOK_VERSION", "v0.8.0")
STAGES = Path(__file__).with_name("kwok-stages.yaml")


def cache_dir() -> Path:
    return Path(os.environ.get("ALNAIR_CACHE_DIR", Path.home() / ".cache" / "alnair"))


def binary(name: str) -> Path:
    """A control-plane binary built by hack/build-control-plane.sh."""
    folder = {
        "etcd": f"etcd-{ETCD_VERSION}",
        "kwok": f"kwok-{KWOK_VERSION}",
    }.get(name, f"k8s-{K8S_VERSION}")
    path = cache_dir() / "bin" / folder / name
    if not path.exists():
        raise ConfigError(
            f"{path} is missing: run `make setup` (hack/build-control-plane.sh)", binary=name
        )
    return path


def repo_root(start: Path | None = None) -> Path | None:
    """The checkout holding deploy/kustomize (walking up from `start` or the cwd)."""
    here = (start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        if (d / "deploy" / "kustomize" / "crds").is_dir():
            return d
    return None


# --- GPU nodes ----------------------------------------------------------------------------

_SPEC = re.compile(r"^\s*(\d+)\s*x\s*([A-Za-z0-9]+)(?::(\d+))?\s*$")


@dataclass(frozen=True)
class GpuNodeSpec:
    """`count` nodes, each with `gpus` GPUs of `model`."""

    count: int
    model: str
    gpus: int = 8
    cpu: int | None = None
    memory_gib: int | None = None

    @property
    def memory_mib_per_gpu(self) -> int:
        return r.GPU_MODEL_MEMORY_MIB[self.model]


def parse_node_specs(text: str) -> list[GpuNodeSpec]:
    """Parse "50x V100M32, 2x T4:4" (nodes x model[:GPUs per node], default 8 GPUs)."""
    specs: list[GpuNodeSpec] = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _SPEC.match(part)
        if not m:
            raise InvalidValueError("node spec", part.strip(), "expected '<N>x <MODEL>[:<GPUs>]'")
        model = m.group(2)
        if model not in r.GPU_MODEL_MEMORY_MIB:
            known = ", ".join(sorted(r.GPU_MODEL_MEMORY_MIB))
            raise InvalidValueError("GPU model", model, f"known models: {known}")
        specs.append(GpuNodeSpec(int(m.group(1)), model, int(m.group(3) or 8)))
    return specs


def gpu_node_manifest(
    name: str, spec: GpuNodeSpec, extra_labels: dict[str, str] | None = None
) -> Obj:
    """A Node that KWOK will manage, already advertising its GPUs."""
    cpu = spec.cpu or max(8, 12 * spec.gpus)
    mem_gib = spec.memory_gib or max(64, 96 * spec.gpus)
    mem_per_gpu = spec.memory_mib_per_gpu
    capacity = {
        "cpu": str(cpu),
        "memory": f"{mem_gib}Gi",
        "pods": "256",
        # Every kubelet reports its node's local storage; pods that ask some (an MPI
        # launcher's init container does) fit only where it is stated.
        "ephemeral-storage": "500Gi",
        r.GPU: str(spec.gpus),
        r.GPU_MEMORY_GIB: str(mem_per_gpu // r.GPU_MEMORY_UNIT_MIB[r.GPU_MEMORY_GIB] * spec.gpus),
        r.GPU_MEMORY: str(mem_per_gpu * spec.gpus),
        r.GPU_COMPUTE: str(100 * spec.gpus),
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        r.LABEL_GPU_MODEL: spec.model,
        r.LABEL_GPU_MEMORY_MIB: str(mem_per_gpu),
        r.LABEL_GPU_COUNT: str(spec.gpus),
        **(
            {r.LABEL_GPU_COMPUTE_CAPABILITY: cc}
            if (cc := r.GPU_MODEL_COMPUTE_CAPABILITY.get(spec.model))
            else {}
        ),
        **(extra_labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {r.ANN_KWOK_NODE: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


class ControlPlane:
    """Start with `start()`, use `kubeconfig`/`client()`, stop with `stop()` (or a `with`)."""

    def __init__(self, workdir: Path | None = None, *, kwok: bool = True) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="alnair-k8s-"))
        self.with_kwok = kwok
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.procs: dict[str, ManagedProcess] = {}
        self.pki: Pki | None = None
        self.kubeconfig = self.workdir / "kubeconfig"
        self.audit_log = self.workdir / "logs" / "audit.log"
        """Bindings and Lease writes, as the API server recorded them (`audit.read_events`)."""
        self._node_seq = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> ControlPlane:
        t0 = time.monotonic()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.pki = pki = make_pki(self.workdir / "pki")
        # The API server's identity towards kubelets (logs, exec), allowed by _bootstrap.
        kc = self.workdir / "pki" / "kubelet-client"
        issue_leaf(pki, KUBELET_API_CLIENT, None, kc.with_suffix(".crt"), kc.with_suffix(".key"))
        etcd = ManagedProcess(
            "etcd",
            [
                str(binary("etcd")),
                "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{self.etcd_peer_port}",
                "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
                "--log-level", "warn",
            ],
            logs,
        )  # fmt: skip
        self.procs["etcd"] = etcd
        etcd.start()
        etcd.wait_ready(
            lambda: (
                httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=1).status_code == 200
            ),
            30,
        )
        api = ManagedProcess(
            "kube-apiserver",
            [
                str(binary("kube-apiserver")),
                "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                "--secure-port", str(self.api_port),
                "--tls-cert-file", str(pki.serving_cert),
                "--tls-private-key-file", str(pki.serving_key),
                "--client-ca-file", str(pki.ca_cert),
                # The aggregation layer (APIServices): the API server's front-proxy identity.
                "--requestheader-client-ca-file", str(pki.front_proxy_ca),
                "--requestheader-allowed-names", FRONT_PROXY_CLIENT,
                "--requestheader-username-headers", "X-Remote-User",
                "--requestheader-uid-headers", "X-Remote-Uid",
                "--requestheader-group-headers", "X-Remote-Group",
                "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
                "--proxy-client-cert-file", str(pki.front_proxy_cert),
                "--proxy-client-key-file", str(pki.front_proxy_key),
                "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file", str(pki.sa_pub),
                "--service-account-signing-key-file", str(pki.sa_key),
                "--service-cluster-ip-range", "10.0.0.0/24",
                # Node: a real node's kubelet (realnode.py) is held to its own node's objects.
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--disable-admission-plugins", "ServiceAccount",
                "--kubelet-client-certificate", str(kc.with_suffix(".crt")),
                "--kubelet-client-key", str(kc.with_suffix(".key")),
                "--kubelet-certificate-authority", str(pki.ca_cert),
                "--kubelet-preferred-address-types", "InternalIP",
                "--endpoint-reconciler-type", "none",
                "--allow-privileged=true",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--enable-priority-and-fairness=false",
                "--event-ttl", "1h",
                "--audit-policy-file", str(write_policy(self.workdir / "audit-policy.yaml")),
                "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json",
                "--audit-log-maxsize", "200",
                "--v", "1",
            ],
            logs,
        )  # fmt: skip
        self.procs["kube-apiserver"] = api
        api.start()
        self._write_kubeconfig()
        tls = ssl.create_default_context(cafile=str(pki.ca_cert))
        tls.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))

        def ready() -> bool:
            resp = httpx.get(f"{self.server}/readyz", verify=tls, timeout=2)
            return resp.status_code == 200

        api.wait_ready(ready, timeout_s)
        asyncio.run(self._bootstrap())
        kcm = ManagedProcess(
            "kube-controller-manager",
            [
                str(binary("kube-controller-manager")),
                "--kubeconfig", str(self.kubeconfig),
                "--leader-elect=false",
                "--controllers", "*",
                "--root-ca-file", str(pki.ca_cert),
                "--service-account-private-key-file", str(pki.sa_key),
                "--use-service-account-credentials=false",
                "--kube-api-qps", "1000", "--kube-api-burst", "2000",
                "--node-monitor-grace-period", "300s",
                "--secure-port", "0",
                "--concurrent-job-syncs", "20",
                "--concurrent-gc-syncs", "20",
                "--v", "1",
            ],
            logs,
        )  # fmt: skip
        self.procs["kube-controller-manager"] = kcm
        kcm.start()
        if self.with_kwok:
            kwok = ManagedProcess(
                "kwok",
                [
                    str(binary("kwok")),
                    "--kubeconfig", str(self.kubeconfig),
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector", f"{r.ANN_KWOK_NODE}=fake",
                    "--cidr", "10.128.0.0/10",
                    "--node-ip", "10.255.0.1",
                    "--config", str(STAGES),
                ],
                logs,
                restarts=5,  # KWOK v0.8.0 can panic on start-up (ManagedProcess says why)
            )  # fmt: skip
            self.procs["kwok"] = kwok
            kwok.start()
        time.sleep(0.2)
        for p in self.procs.values():
            if not p.alive() and p.restarted >= p.restarts:
                raise ConfigError(f"{p.name} exited: {p.tail()}", name=p.name)
        self.start_s = time.monotonic() - t0
        return self

    def audit_events(self) -> list[AuditEvent]:
        """What the API server's audit log holds now (`alnair.dev.localstack.audit`)."""
        return read_events(self.audit_log)

    def stop(self) -> None:
        for name in ("kwok", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def restart_component(self, name: str) -> None:
        proc = self.procs[name]
        proc.stop()
        proc.start()

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "alnair-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(self.pki.admin_cert),
                        "client-key": str(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": "alnair-local", "context": {"cluster": "alnair-local", "user": "admin"}}
            ],
            "current-context": "alnair-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc))

    def client(self, **kw: Any) -> KubeClient:
        return KubeClient.from_config(str(self.kubeconfig), **kw)

    async def _bootstrap(self) -> None:
        async with self.client() as kube:
            await apply_crds(kube)
            binding = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": KUBELET_API_CLIENT},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:kubelet-api-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": KUBELET_API_CLIENT}],
            }  # fmt: skip
            with contextlib.suppress(Conflict):
                await kube.create(KIND_RESOURCES["ClusterRoleBinding"], binding)

    # --- helpers for tests and the demo ----------------------------------------------------

    async def create_gpu_nodes(
        self,
        spec: str | list[GpuNodeSpec],
        *,
        kube: KubeClient | None = None,
        prefix: str = "gpu",
        wait_ready: bool = True,
        concurrency: int = 32,
        labels: dict[str, str] | None = None,
    ) -> list[str]:
        """Create KWOK GPU nodes ("50x V100M32, 2x T4:4") and wait until they are Ready."""
        specs = parse_node_specs(spec) if isinstance(spec, str) else spec
        own = kube is None
        client = kube or self.client()
        try:
            manifests: list[Obj] = []
            for s in specs:
                for _ in range(s.count):
                    self._node_seq += 1
                    name = f"{prefix}-{s.model.lower()}-{self._node_seq:04d}"
                    manifests.append(gpu_node_manifest(name, s, labels))
            sem = asyncio.Semaphore(concurrency)

            async def create(m: Obj) -> None:
                async with sem:
                    await client.create(NODES, m)

            await asyncio.gather(*(create(m) for m in manifests))
            names = [m["metadata"]["name"] for m in manifests]
            if wait_ready:
                await wait_nodes_ready(client, set(names))
            return names
        finally:
            if own:
                await client.close()


async def register_api_service(
    kube: KubeClient,
    group: str,
    version: str,
    port: int,
    ca_pem: bytes,
    *,
    service: str,
    namespace: str = "default",
) -> None:
    """Register an aggregated API served on this machine's loopback `port` (the local stack's
    "register it by URL"): an ExternalName Service for `localhost`, which the aggregator
    dials without endpoints or a service network, and the APIService trusting `ca_pem`. The
    serving certificate must name `<service>.<namespace>.svc`, the name the aggregator checks.
    Replaces what an earlier call registered."""
    svc: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "namespace": namespace},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }
    api: Obj = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"},
        "spec": {
            "group": group,
            "version": version,
            "service": {"name": service, "namespace": namespace, "port": port},
            "caBundle": base64.b64encode(ca_pem).decode(),
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
        },
    }
    placed: list[tuple[Resource, Obj, str | None]] = [
        (SERVICES, svc, namespace),
        (APISERVICES, api, None),
    ]
    for resource, obj, ns in placed:
        with contextlib.suppress(NotFound):
            await kube.delete(resource, obj["metadata"]["name"], ns)
        await kube.create(resource, obj, ns)


def _ready_and_untainted(node: Obj) -> bool:
    conds = node.get("status", {}).get("conditions", [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    taints = node.get("spec", {}).get("taints", []) or []
    blocking = [t for t in taints if t.get("key", "").startswith("node.kubernetes.io/")]
    return ready and not blocking


async def wait_nodes_ready(kube: KubeClient, names: set[str], timeout_s: float = 180) -> None:
    """Wait (by watching, not polling) until every node in `names` is Ready without taints."""
    pending = set(names)
    deadline = time.monotonic() + timeout_s
    listing = await kube.list(NODES)
    for n in listing["items"]:
        if _ready_and_untainted(n):
            pending.discard(n["metadata"]["name"])
    rv = listing["metadata"]["resourceVersion"]
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(pending)} nodes not Ready: {sorted(pending)[:5]}")
        async with asyncio.timeout(remaining):
            async for _type, node in kube.watch(NODES, resource_version=rv, timeout_s=60):
                rv = node["metadata"]["resourceVersion"]
                if _ready_and_untainted(node):
                    pending.discard(node["metadata"]["name"])
                if not pending:
                    break


def load_manifests(path: Path) -> list[Obj]:
    docs: list[Obj] = []
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    for f in files:
        docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return docs


async def apply_crds(kube: KubeClient, crd_dir: Path | None = None, timeout_s: float = 30) -> None:
    """Apply every CRD shipped in deploy/kustomize/crds and wait until each is Established."""
    if crd_dir is None:
        root = repo_root() or repo_root(Path(__file__))
        if root is None:
            return
        crd_dir = root / "deploy" / "kustomize" / "crds"
    docs = [d for d in load_manifests(crd_dir) if d.get("kind") == "CustomResourceDefinition"]
    for doc in docs:
        await kube.apply(doc, field_manager="alnair-localstack")
    deadline = time.monotonic() + timeout_s
    for doc in docs:
        name = doc["metadata"]["name"]
        while True:
            try:
                crd = await kube.get(CRDS, name)
            except NotFound:
                crd = {}
            conds = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established")
            await asyncio.sleep(0.1)
