"""Other projects' parts, as they ship: the CRDs and controller managers of JobSet and
LeaderWorkerSet, built from `sigs.k8s.io/jobset` and `sigs.k8s.io/lws` by
`hack/build-peers.sh` (cached under ~/.cache/alnair/peers, never in the repository), run
against the local control plane.

A manager runs as the project's own deployment runs it, with its own defaulting and validating
webhooks (JobSet's controller relies on the defaulting one, LeaderWorkerSet's on its pod
webhook for the labels it reads back). The only changes are for what the local control plane
lacks:
- There is no Service routing, so the project's webhook configurations, rendered from its
  module with the real kubectl, are registered by URL. They are limited to the test's
  namespace, and their selectors are kept.
- There is no cert-manager, so its internal certificate management is off, and it is given a
  certificate to serve with.
- Metrics and leader election are off.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alnair.common.kube import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, KubeClient
from alnair.common.localstack import ControlPlane, ManagedProcess, free_port
from alnair.common.localstack.controlplane import apply_crds, cache_dir
from alnair.common.tls import issue, write_folder


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    """Its folder's prefix in the cache (hack/build-peers.sh)."""
    version: str
    config_api: str
    """The apiVersion of its manager's Configuration file."""

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
    argv = [str(folder / "manager"), f"--config={config_file}", f"--kubeconfig={cp.kubeconfig}"]
    manager = ManagedProcess(f"{peer.name}-manager", argv, workdir)
    manager.start()

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)

    registered: list[tuple[Any, str]] = []
    try:
        manager.wait_ready(ready, timeout_s=60)
        for doc in peer_webhooks(peer, f"https://127.0.0.1:{webhook}", made.ca_pem, namespace):
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
