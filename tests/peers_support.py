"""Other projects' parts, as they ship: the CRDs and controller managers of JobSet,
LeaderWorkerSet, KubeRay, Kubeflow Trainer and Kubeflow's training-operator, built from
`sigs.k8s.io/jobset`, `sigs.k8s.io/lws`, `github.com/ray-project/kuberay/ray-operator`,
`github.com/kubeflow/trainer/v2` and `github.com/kubeflow/training-operator` (and Kueue's CRDs
and samples from `sigs.k8s.io/kueue`, with no controller) by
`hack/build-peers.sh` (cached under ~/.cache/alnair/peers,
never in the repository), run against the local control plane.

A manager runs as the project's own deployment runs it, with its own defaulting and validating
webhooks where it ships them (JobSet's controller relies on the defaulting one,
LeaderWorkerSet's on its pod webhook for the labels it reads back; KubeRay's default deploy
has none). The only changes are for what the local control plane lacks:
- There is no Service routing, so the project's webhook configurations, rendered from its
  module with the real kubectl, are registered by URL. They are limited to the test's
  namespace, and their selectors are kept.
- There is no cert-manager, so its internal certificate management is off, and it is given a
  certificate to serve with. Kubeflow Trainer's and the training-operator's cannot be turned
  off: each fills its Secret, the test writes that into the folder the kubelet would mount it
  at, and their webhooks (validating only) are not registered, since the certificate names
  only their Service.
- Metrics and leader election are off.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alnair.common.kube import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS, KubeClient
from alnair.common.tls import issue, write_folder
from alnair.dev.localstack import ControlPlane, ManagedProcess, free_port
from alnair.dev.localstack.controlplane import apply_crds, cache_dir


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    """Its folder's prefix in the cache (hack/build-peers.sh)."""
    version: str
    config_api: str | None = None
    """The apiVersion of its manager's Configuration file (None: it takes `flags`)."""
    flags: tuple[str, ...] = ()
    """Its manager's flags where it takes no Configuration file: `{health}` and `{webhook}`
    stand for the ports it is given."""
    secret_mount: tuple[str, str, str] | None = None
    """(namespace, Secret, folder): a Secret its manager fills with its own certificate and
    then reads from the folder, where the kubelet would mount it (Kubeflow Trainer). Here the
    test writes it there, as the kubelet would."""
    webhooks: bool = True
    """Whether its webhooks are registered. Kubeflow Trainer's manager always serves a
    certificate of its own, made for its Service's DNS name, which a registration by URL on
    127.0.0.1 cannot match: its (validating only) webhooks stay unregistered."""

    def folder(self) -> Path:
        folder = cache_dir() / "peers" / f"{self.name}-{self.version}"
        if not (folder / "manager").exists():
            raise FileNotFoundError(
                f"{folder}/manager is missing: run `make setup` (hack/build-peers.sh)"
            )
        return folder


JOBSET = Peer(
    "jobset", os.environ.get("ALNAIR_JOBSET_VERSION", "v0.10.1"), "config.jobset.x-k8s.io/v1alpha1"
)
LWS = Peer("lws", os.environ.get("ALNAIR_LWS_VERSION", "v0.7.0"), "config.lws.x-k8s.io/v1alpha1")
KUBERAY = Peer(
    "kuberay",
    os.environ.get("ALNAIR_KUBERAY_VERSION", "v1.5.0"),
    flags=(
        "--metrics-addr=0",
        "--health-probe-bind-address=127.0.0.1:{health}",
        "--enable-leader-election=false",
    ),
)
TRAINER = Peer(
    "trainer",
    os.environ.get("ALNAIR_TRAINER_VERSION", "v2.0.0"),
    flags=(
        "--metrics-bind-address=0",
        "--health-probe-bind-address=127.0.0.1:{health}",
        "--leader-elect=false",
        "--webhook-server-port={webhook}",
    ),
    secret_mount=(
        "kubeflow-system",
        "kubeflow-trainer-webhook-cert",
        "/tmp/k8s-webhook-server/serving-certs",  # fixed in its cert package
    ),
    webhooks=False,
)
TRAINING_OPERATOR = Peer(
    "training-operator",
    os.environ.get("ALNAIR_TRAINING_OPERATOR_VERSION", "v1.8.1"),
    flags=(
        "--metrics-bind-address=0",
        "--health-probe-bind-address=127.0.0.1:{health}",
        "--leader-elect=false",
        "--webhook-server-port={webhook}",
        # The two kinds the queue takes; the others' controllers would wait for CRDs that
        # are not installed.
        "--enable-scheme=pytorchjob",
        "--enable-scheme=mpijob",
    ),
    secret_mount=(
        "kubeflow",  # its namespace when MY_POD_NAMESPACE is unset
        "training-operator-webhook-cert",
        "/tmp/k8s-webhook-server/serving-certs",  # fixed in its cert package
    ),
    webhooks=False,
)


KUEUE_VERSION = os.environ.get("ALNAIR_KUEUE_VERSION", "v0.19.2")


def kueue_folder() -> Path:
    """Kueue's CRDs (crds/) and sample manifests (examples/), as its module ships them; no
    controller: Alnair's dispatcher runs in its place."""
    folder = cache_dir() / "peers" / f"kueue-{KUEUE_VERSION}"
    if not list((folder / "crds").glob("*.yaml")):
        raise FileNotFoundError(f"{folder}/crds is missing: run `make setup` (hack/build-peers.sh)")
    return folder


async def install_crds(kube: KubeClient, peer: Peer) -> None:
    await apply_crds(kube, peer.folder() / "crds")


def peer_webhooks(peer: Peer, url: str, ca_pem: bytes, namespace: str) -> list[dict[str, Any]]:
    """The peer's webhook configurations as it ships them (kustomize, with its patches),
    pointed at `url` and limited to `namespace`, under names of their own."""
    kubectl = Path(sys.executable).parent / "kubectl"
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(peer.folder() / "webhook")],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    configs = []
    for doc in yaml.safe_load_all(rendered):
        if not doc or not doc["kind"].endswith("WebhookConfiguration"):
            continue
        doc["metadata"] = {"name": f"{peer.name}-{doc['kind'][:-20].lower()}-{namespace}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"{url}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        configs.append(doc)
    return configs


@contextlib.asynccontextmanager
async def peer_controller(
    peer: Peer, cp: ControlPlane, kube: KubeClient, workdir: Path, namespace: str
) -> AsyncIterator[ManagedProcess]:
    """The peer's controller manager on the control plane (admin kubeconfig), with its
    webhooks registered for `namespace`, until exit."""
    folder = peer.folder()
    certs = workdir / f"{peer.name}-webhook-certs"
    made = issue(["127.0.0.1"])
    write_folder(certs, made.secret_data())
    health, webhook = free_port(), free_port()
    if peer.config_api is None:
        argv = [
            str(folder / "manager"),
            *(f.format(health=health, webhook=webhook) for f in peer.flags),
            f"--kubeconfig={cp.kubeconfig}",
        ]
    else:
        config = {
            "apiVersion": peer.config_api,
            "kind": "Configuration",
            "internalCertManagement": {"enable": False},
            "leaderElection": {"leaderElect": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }
        config_file = workdir / f"{peer.name}-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        argv = [
            str(folder / "manager"),
            f"--config={config_file}",
            f"--kubeconfig={cp.kubeconfig}",
        ]
    manager = ManagedProcess(f"{peer.name}-manager", argv, workdir)
    manager.start()

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)

    registered: list[tuple[Any, str]] = []
    try:
        if peer.secret_mount is not None:
            await _mount_secret(kube, *peer.secret_mount)
        manager.wait_ready(ready, timeout_s=60)
        hooks = peer.webhooks and (folder / "webhook").is_dir()
        url = f"https://127.0.0.1:{webhook}"
        for doc in peer_webhooks(peer, url, made.ca_pem, namespace) if hooks else []:
            resource = (
                MUTATING_WEBHOOKS if doc["kind"].startswith("Mutating") else (VALIDATING_WEBHOOKS)
            )
            await kube.create(resource, doc)
            registered.append((resource, doc["metadata"]["name"]))
        yield manager
    finally:
        for resource, name in registered:
            with contextlib.suppress(Exception):
                await kube.delete(resource, name)
        manager.stop()


async def _mount_secret(kube: KubeClient, namespace: str, name: str, folder: str) -> None:
    """Write the Secret's keys into `folder` once it holds a certificate, as the kubelet does
    for a Secret volume."""
    deadline = time.monotonic() + 60
    while True:
        data = (await kube.get(SECRETS, name, namespace)).get("data") or {}
        if "tls.crt" in data and "tls.key" in data:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"Secret {namespace}/{name} was never given a certificate")
        await asyncio.sleep(0.2)
    _write_volume(Path(folder), {key: base64.b64decode(value) for key, value in data.items()})


def _write_volume(target: Path, files: dict[str, bytes]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for key, value in files.items():
        (target / key).write_bytes(value)
