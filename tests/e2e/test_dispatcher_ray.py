"""RayClusters and RayJobs through a queue, with KubeRay's own CRDs and operator
(`github.com/ray-project/kuberay/ray-operator`, built by hack/build-peers.sh): nothing of Ray
is written here but the objects a user would write, and one status a Ray head would give.

Both are held at creation by the dispatcher's webhook (`spec.suspend`), admitted whole within
quota with the GPU model in the node selector of every pod template that asks for GPUs (the
head, which asks none, may run anywhere), and KubeRay's operator then makes their pods: a
RayCluster's head and workers, and for a RayJob its own RayCluster (not queued again: the
RayJob owns it). A RayCluster runs until deleted and counts all that time; a RayJob's end
admits the next one; a RayJob on borrowed quota is suspended again for the lender, and KubeRay
deletes its cluster.

What cannot run here: Ray itself. KubeRay learns a RayJob's outcome from the Ray dashboard of
its head pod, which a KWOK pod does not serve, so the test writes that outcome
(`jobDeploymentStatus: Complete`) as KubeRay would once Ray reported it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    EVENTS,
    JOBS,
    PODS,
    RAYCLUSTERS,
    RAYJOBS,
    ApiError,
    KubeClient,
    NotFound,
    Resource,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, ANN_BORROWING, LABEL_QUEUE
from dispatcher_support import (
    POOL,
    admitted_type,
    gpu_job,
    queue_used,
    queued_pool,
)
from peers_support import KUBERAY, install_crds, peer_controller

pytestmark = pytest.mark.e2e
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE = "ray.io/node-type"


def _template(ns: str, gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "ray", "image": "example.invalid/ray:2"}
    if gpus:
        container["resources"] = {"limits": {r.GPU: str(gpus)}}
    return {
        "spec": {
            "schedulerName": r.SCHEDULER_NAME,
            "nodeSelector": {POOL: ns},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
        }
    }


def cluster_spec(ns: str, workers: int) -> dict[str, Any]:
    """A head that asks no GPU and `workers` one-GPU workers."""
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": _template(ns, 0)},
        "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": workers, "minReplicas": workers,
             "maxReplicas": workers, "rayStartParams": {}, "template": _template(ns, 1)}
        ],
    }  # fmt: skip


def ray_cluster(name: str, ns: str, queue: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": cluster_spec(ns, workers),
    }


def ray_job(name: str, ns: str, queue: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "entrypoint": "python train.py",
            "shutdownAfterJobFinishes": True,  # (KubeRay suspends no other RayJob)
            "rayClusterSpec": cluster_spec(ns, workers),
        },
    }


async def _admitted(kube: KubeClient, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(res, name, ns)
    annotations = obj["metadata"].get("annotations") or {}
    return obj if not obj["spec"].get("suspend") and ANN_ADMITTED_TYPE in annotations else None


async def _cluster_pods(kube: KubeClient, ns: str, cluster: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{CLUSTER_LABEL}={cluster}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def _bound(kube: KubeClient, ns: str, cluster: str, n: int) -> list[dict[str, Any]]:
    pods = await _cluster_pods(kube, ns, cluster)
    ok = [p for p in pods if p["spec"].get("nodeName")]
    return ok if len(ok) == n == len(pods) else []


async def _existing(kube: KubeClient, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(res, name, ns)
    except NotFound:
        return None


async def _job_cluster(kube: KubeClient, ns: str, job: str) -> str | None:
    """The RayCluster KubeRay made for a RayJob."""
    name = ((await kube.get(RAYJOBS, job, ns)).get("status") or {}).get("rayClusterName")
    return str(name) if name else None


def _check_model(pods: list[dict[str, Any]]) -> None:
    """Workers carry the model; the head, which asks no GPU, does not."""
    for pod in pods:
        selector = pod["spec"].get("nodeSelector") or {}
        if pod["metadata"]["labels"].get(NODE_TYPE) == "head":
            assert r.LABEL_GPU_MODEL not in selector, pod
        else:
            assert selector[r.LABEL_GPU_MODEL] == "V100M32", pod


async def test_ray_clusters_and_jobs_queue_admit_complete_and_are_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await install_crds(kube, KUBERAY)
    async with queued_pool(
        cp,
        kube,
        ns,
        tmp_path,
        cohort="rc",
        queues={"train": (2, 2), "lender": (2, 0)},
        peers=[peer_controller(KUBERAY, cp, kube, tmp_path, ns)],
    ):
        # A RayCluster: held at creation, admitted within quota; KubeRay makes its head
        # and two workers, the workers with the model.
        made = await kube.create(RAYCLUSTERS, ray_cluster("rc1", ns, "train", 2), ns)
        assert made["spec"]["suspend"] is True
        await wait_for(lambda: _admitted(kube, RAYCLUSTERS, ns, "rc1"), 20)
        _check_model(await wait_for(lambda: _bound(kube, ns, "rc1", 3), 40))
        assert await wait_for(lambda: queue_used(kube, f"train-{ns}"), 10) == 2

        # A RayJob borrows the idle lender's quota; its own RayCluster (owned by it) is
        # not held again, and its workers carry the model.
        await kube.create(RAYJOBS, ray_job("rj1", ns, "train", 2), ns)
        rj1 = await wait_for(lambda: _admitted(kube, RAYJOBS, ns, "rj1"), 20)
        assert rj1["metadata"]["annotations"][ANN_BORROWING] == "true"
        cluster = await wait_for(lambda: _job_cluster(kube, ns, "rj1"), 30)
        # (KubeRay names the cluster in the RayJob's status before it creates it)
        made = await wait_for(lambda: _existing(kube, RAYCLUSTERS, ns, cluster), 30)
        assert not made["spec"].get("suspend")
        _check_model(await wait_for(lambda: _bound(kube, ns, cluster, 3), 40))

        # One KubeRay would not let be suspended is refused at creation, the reason named.
        keeps = ray_job("keeps", ns, "train", 1)
        keeps["spec"]["shutdownAfterJobFinishes"] = False
        with pytest.raises(ApiError) as refused:
            await kube.create(RAYJOBS, keeps, ns)
        assert "spec.shutdownAfterJobFinishes must be true" in str(refused.value)

        # A second RayJob waits for quota until the first ends.
        await kube.create(RAYJOBS, ray_job("rj2", ns, "train", 2), ns)
        assert (await kube.get(RAYJOBS, "rj2", ns))["spec"]["suspend"] is True
        assert await _admitted(kube, RAYJOBS, ns, "rj2") is None
        await _ray_reports_complete(kube, ns, "rj1")
        # Admitted once KubeRay has deleted rj1's cluster: its pods held the GPUs till then.
        await wait_for(lambda: _admitted(kube, RAYJOBS, ns, "rj2"), 40)
        assert await _no_pods(kube, ns, cluster)

        # The lender needs its quota back: the borrowing RayJob is suspended again, and
        # KubeRay deletes its cluster.
        rj2_cluster = await wait_for(lambda: _job_cluster(kube, ns, "rj2"), 30)
        await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"

        async def rj2_suspended() -> bool:
            return bool((await kube.get(RAYJOBS, "rj2", ns))["spec"].get("suspend"))

        await wait_for(rj2_suspended, 30)
        await wait_for(lambda: _no_pods(kube, ns, rj2_cluster), 40)
        events = (await kube.list(EVENTS, ns, field_selector="involvedObject.name=rj2"))["items"]
        assert any(e["reason"] == "Preempted" for e in events)
        # The RayCluster, admitted on its own quota, kept running throughout.
        assert await _admitted(kube, RAYCLUSTERS, ns, "rc1") is not None


async def _ray_reports_complete(kube: KubeClient, ns: str, name: str) -> None:
    """What KubeRay writes once Ray's dashboard reports the job succeeded (no Ray here),
    with the end time it writes then: KubeRay deletes the cluster from it (its pods, holding
    GPUs until then, are what the next RayJob waits for)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await kube.patch(
        RAYJOBS, name,
        {"status": {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "endTime": now}},
        ns, sub="status",
    )  # fmt: skip


async def _no_pods(kube: KubeClient, ns: str, cluster: str) -> bool:
    return not await _cluster_pods(kube, ns, cluster)
