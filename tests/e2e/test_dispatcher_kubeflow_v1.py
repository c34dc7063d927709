"""Kubeflow's v1 PyTorchJob and MPIJob through a queue, with the training-operator's own CRDs
and controller manager (`github.com/kubeflow/training-operator` v1.8.1, built by
hack/build-peers.sh).

Each is held at creation (`spec.runPolicy.suspend`), counted as every role's pods at once, and
admitted with the GPU model in every GPU role's template; the training-operator then makes the
pods (an MPI launcher, which asks no GPU, without the model), Alnair's scheduler binds them and
KWOK runs them. Each kind completes (a PyTorchJob when its master succeeds, an MPIJob when its
launcher does), and its completion admits the next ones; borrowing jobs of both kinds are
suspended again for the lender through their run policy, and the training-operator deletes
their pods.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    JOBS,
    MPIJOBS,
    NAMESPACES,
    PODS,
    PYTORCHJOBS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    Conflict,
    KubeClient,
    Resource,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, ANN_BORROWING, LABEL_QUEUE
from dispatcher_support import (
    POOL,
    admitted_type,
    events,
    queue_used,
    queued_pool,
)
from dispatcher_support import gpu_job as lender_job
from peers_support import TRAINING_OPERATOR, install_crds, peer_controller

pytestmark = pytest.mark.e2e
JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"


def template(ns: str, gpus: int, seconds: float) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "pytorch", "image": "trainer"}
    if gpus:
        container["resources"] = {"limits": {r.GPU: str(gpus)}}
    return {
        "metadata": {"annotations": {r.ANN_DURATION: f"{seconds}s"}},
        "spec": {
            "schedulerName": r.SCHEDULER_NAME,
            "nodeSelector": {POOL: ns},
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
        },
    }


def pytorch_job(name: str, ns: str, queue: str, seconds: float) -> dict[str, Any]:
    """A master and a worker of one GPU each, as a user writes it (no suspend)."""
    roles = {
        role: {"replicas": 1, "restartPolicy": "OnFailure", "template": template(ns, 1, seconds)}
        for role in ("Master", "Worker")
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {"pytorchReplicaSpecs": roles},
    }


def mpi_job(name: str, ns: str, queue: str, seconds: float) -> dict[str, Any]:
    """A launcher without GPUs running `seconds` (the job ends when it does) and two one-GPU
    workers, whose pods the operator deletes then (`cleanPodPolicy: Running`, as MPI users
    set it: workers are daemons that never end on their own)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template(ns, 0, seconds)},
                "Worker": {"replicas": 2, "template": template(ns, 1, 600)},
            },
        },
    }


async def _admitted(kube: KubeClient, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(res, name, ns)
    suspended = (obj["spec"].get("runPolicy") or {}).get("suspend")
    annotations = obj["metadata"].get("annotations") or {}
    return obj if not suspended and ANN_ADMITTED_TYPE in annotations else None


async def _pods(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{JOB_NAME}={name}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def _bound(kube: KubeClient, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    pods = [p for p in await _pods(kube, ns, name) if p["spec"].get("nodeName")]
    return pods if len(pods) == n else []


async def _succeeded(kube: KubeClient, res: Resource, ns: str, name: str) -> bool:
    status = (await kube.get(res, name, ns)).get("status") or {}
    return any(
        c["type"] == "Succeeded" and c["status"] == "True" for c in status.get("conditions") or []
    )


async def _operator_prerequisites(kube: KubeClient) -> None:
    """What the training-operator's deploy gives its manager: its namespace, the Secret its
    certificate rotation fills, and the webhook configuration it injects its CA into (empty
    here: see `peers_support.Peer.webhooks`)."""
    for resource, obj, ns in (
        (NAMESPACES, {"metadata": {"name": "kubeflow"}}, None),
        (SECRETS, {"metadata": {"name": "training-operator-webhook-cert"}}, "kubeflow"),
        (
            VALIDATING_WEBHOOKS,
            {"metadata": {"name": "validator.training-operator.kubeflow.org"}, "webhooks": []},
            None,
        ),
    ):
        with contextlib.suppress(Conflict):  # there already (an earlier run on this plane)
            await kube.create(resource, obj, ns)


async def test_pytorch_and_mpi_jobs_queue_admit_complete_and_are_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await install_crds(kube, TRAINING_OPERATOR)
    await _operator_prerequisites(kube)
    # `train` lends nothing and borrows all it runs, from `lender`: every admission of ours
    # borrows, and the lender's Job takes all of it back.
    async with queued_pool(
        cp,
        kube,
        ns,
        tmp_path,
        cohort="kf",
        queues={"train": (0, 4), "lender": (4, 0)},
        peers=[peer_controller(TRAINING_OPERATOR, cp, kube, tmp_path, ns)],
    ):
        # Held at creation; admitted; the operator's pods carry the model.
        made = await kube.create(PYTORCHJOBS, pytorch_job("pt1", ns, "train", 5), ns)
        assert made["spec"]["runPolicy"]["suspend"] is True
        await wait_for(lambda: _admitted(kube, PYTORCHJOBS, ns, "pt1"), 20)
        pods = await wait_for(lambda: _bound(kube, ns, "pt1", 2), 60)
        for pod in pods:
            assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32", pod
        # An MPIJob: its workers get the model, its launcher (no GPU) does not need it.
        made = await kube.create(MPIJOBS, mpi_job("mj1", ns, "train", 5), ns)
        assert made["spec"]["runPolicy"]["suspend"] is True
        mj1 = await wait_for(lambda: _admitted(kube, MPIJOBS, ns, "mj1"), 20)
        assert mj1["metadata"]["annotations"][ANN_BORROWING] == "true"
        mpi_pods = await wait_for(lambda: _bound(kube, ns, "mj1", 3), 60)
        by_role = {p["metadata"]["labels"][REPLICA_TYPE]: p for p in mpi_pods}
        assert by_role["worker"]["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32"
        assert r.LABEL_GPU_MODEL not in by_role["launcher"]["spec"]["nodeSelector"]
        assert await wait_for(lambda: queue_used(kube, f"train-{ns}"), 10) == 4

        # One of each kind more waits for quota until the first two complete.
        await kube.create(PYTORCHJOBS, pytorch_job("pt2", ns, "train", 600), ns)
        await kube.create(MPIJOBS, mpi_job("mj2", ns, "train", 600), ns)
        done = [await _succeeded(kube, PYTORCHJOBS, ns, "pt1"),
                await _succeeded(kube, MPIJOBS, ns, "mj1")]  # fmt: skip
        if not any(done):
            assert await _admitted(kube, PYTORCHJOBS, ns, "pt2") is None
            assert await _admitted(kube, MPIJOBS, ns, "mj2") is None
        await wait_for(lambda: _succeeded(kube, PYTORCHJOBS, ns, "pt1"), 90, 0.2)
        await wait_for(lambda: _succeeded(kube, MPIJOBS, ns, "mj1"), 90, 0.2)
        await wait_for(lambda: _admitted(kube, PYTORCHJOBS, ns, "pt2"), 30)
        await wait_for(lambda: _admitted(kube, MPIJOBS, ns, "mj2"), 30)

        # The lender needs its quota: both are suspended again through their run policy,
        # and the operator deletes their pods.
        await kube.create(JOBS, lender_job("l1", ns, "lender", 4), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"
        for res, name in ((PYTORCHJOBS, "pt2"), (MPIJOBS, "mj2")):
            job = await kube.get(res, name, ns)
            assert job["spec"]["runPolicy"]["suspend"] is True, name
            await wait_for(lambda name=name: _no_pods(kube, ns, name), 60)
            assert await events(kube, ns, name, "Preempted"), name


async def _no_pods(kube: KubeClient, ns: str, name: str) -> bool:
    return not await _pods(kube, ns, name)
