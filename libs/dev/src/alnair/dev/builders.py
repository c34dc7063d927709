"""Fluent builders for pods and PodGroups in tests: `make_pod("a").gpus(2).obj()`; the
PriorityClasses the preemption tests share; and a client holding only what a shipped
ServiceAccount is granted (`shipped_account`)."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import NAMESPACES, PODS, PRIORITYCLASSES, Conflict, KubeClient
from alnair.common.kubeconfig import KubeConfig
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import load_manifests, repo_root

REPO = repo_root(Path(__file__)) or Path.cwd()
"""The checkout: the shipped manifests are read from it."""
BASE = REPO / "deploy" / "kustomize" / "base"
SYSTEM_NS = "alnair-system"


async def shipped_account(
    cp: ControlPlane,
    kube: KubeClient,
    account: str,
    *manifests: str,
    skip: frozenset[str] | set[str] = frozenset(),
) -> KubeConfig:
    """Apply the namespaces and the RBAC of `manifests` (paths under deploy/kustomize/base) as
    they ship, kinds in `skip` left out, and return a kubeconfig with a token of `account` in
    alnair-system: what the service would run with in a cluster."""
    for doc in load_manifests(BASE / "namespace" / "namespace.yaml"):
        with contextlib.suppress(Conflict):
            await kube.create(NAMESPACES, doc)
    for manifest in manifests:
        for doc in load_manifests(BASE / manifest):
            if doc["kind"] not in skip:
                await kube.apply(doc)
    token = await kube.service_account_token(SYSTEM_NS, account, expiration_s=3600)
    assert cp.pki is not None
    return KubeConfig(server=cp.server, ca_file=str(cp.pki.ca_cert), token=token)


async def priority_classes(kube: KubeClient, prefix: str) -> tuple[str, str]:
    """PriorityClasses `<prefix>-low` (10) and `<prefix>-high` (1000), created if missing;
    returns their names."""
    names = (f"{prefix}-low", f"{prefix}-high")
    for name, value in zip(names, (10, 1000), strict=True):
        with contextlib.suppress(Conflict):
            await kube.create(
                PRIORITYCLASSES,
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                 "metadata": {"name": name}, "value": value},
            )  # fmt: skip
    return names


class PodBuilder:
    def __init__(self, name: str, namespace: str) -> None:
        self._pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {}, "annotations": {}},
            "spec": {
                "schedulerName": r.SCHEDULER_NAME,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "example.com/train:1",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {}},
                    }
                ],
            },
        }

    @property
    def _res(self) -> dict[str, Any]:
        res: dict[str, Any] = self._pod["spec"]["containers"][0]["resources"]
        return res

    def gpus(self, n: int) -> PodBuilder:
        self._res["requests"][r.GPU] = str(n)
        self._res["limits"][r.GPU] = str(n)
        return self

    def fraction(
        self, compute_pct: int, memory_mib: int | None = None, *, memory_gib: int | None = None
    ) -> PodBuilder:
        for part in ("requests", "limits"):
            self._res[part][r.GPU_COMPUTE] = str(compute_pct)
            if memory_mib is not None:
                self._res[part][r.GPU_MEMORY] = str(memory_mib)
            if memory_gib is not None:
                self._res[part][r.GPU_MEMORY_GIB] = str(memory_gib)
        return self

    def cpu(self, q: str) -> PodBuilder:
        self._res["requests"]["cpu"] = q
        return self

    def pool(self, value: str) -> PodBuilder:
        self._pod["spec"].setdefault("nodeSelector", {})["alnair.io/test-pool"] = value
        return self

    def gang(self, group: str) -> PodBuilder:
        self._pod["metadata"]["labels"][r.POD_GROUP_LABEL] = group
        return self

    def priority_class(self, name: str) -> PodBuilder:
        self._pod["spec"]["priorityClassName"] = name
        return self

    def runs_for(self, seconds: float) -> PodBuilder:
        self._pod["metadata"]["annotations"][r.ANN_DURATION] = r.duration_value(seconds)
        return self

    def trains(self, model_name: str, batch_size: int | None = None) -> PodBuilder:
        """What the pod trains (the model annotations the predictor reads)."""
        annotations = self._pod["metadata"]["annotations"]
        annotations[r.ANN_MODEL_NAME] = model_name
        if batch_size is not None:
            annotations[r.ANN_BATCH_SIZE] = str(batch_size)
        return self

    def queue(self, local_queue: str) -> PodBuilder:
        """Queued through the dispatcher: the LocalQueue label."""
        self._pod["metadata"]["labels"]["alnair.io/queue-name"] = local_queue
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self._pod["spec"]["schedulerName"] = name
        return self

    def obj(self) -> dict[str, Any]:
        return self._pod


def make_pod(name: str, namespace: str) -> PodBuilder:
    return PodBuilder(name, namespace)


def pod_group(name: str, namespace: str, min_member: int, timeout_s: int = 60) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": timeout_s},
    }


async def pod_bound_token(
    kube: KubeClient, account: str, node: str, *, audiences: tuple[str, ...] = ()
) -> tuple[str, str]:
    """A token of `account` (in alnair-system) bound to a new pod of it on `node`, as the
    kubelet projects one into a DaemonSet's pod (the API server then names the node in the
    token's user info), and that pod's name."""
    name = f"{account}-{uuid.uuid4().hex[:5]}"
    body = make_pod(name, SYSTEM_NS).obj()
    body["spec"].update({"serviceAccountName": account, "nodeName": node,
                         "tolerations": [{"operator": "Exists"}]})  # fmt: skip
    pod = await kube.create(PODS, body, SYSTEM_NS)
    token = await kube.service_account_token(SYSTEM_NS, account, audiences=audiences, bound_pod=pod)
    return token, name


def token_client(cp: ControlPlane, token: str) -> KubeClient:
    """A client of the local control plane presenting `token`."""
    assert cp.pki is not None
    return KubeClient(KubeConfig(server=cp.server, ca_file=str(cp.pki.ca_cert), token=token))
