"""Kubeflow TrainJobs through a queue, with Kubeflow Trainer's own CRDs, controller manager and
shipped torch runtime (`github.com/kubeflow/trainer/v2`), and JobSet's (`sigs.k8s.io/jobset`),
both built by hack/build-peers.sh.

A TrainJob is held at creation (`spec.suspend`), and what it asks is read from the runtime it
names, shaped by its `spec.trainer` (`numNodes` x `resourcesPerNode`). It is admitted whole
with the GPU model given through `podSpecOverrides`; Trainer makes the JobSet, JobSet's
controller the Jobs, the Job controller the pods, Alnair's scheduler binds them and KWOK runs
them. Its completion admits the next one; one on borrowed quota is suspended again for the
lender, and Trainer suspends its JobSet, whose pods go.

The runtimes are Trainer's shipped `torch-distributed`, as a platform team running Alnair
would adapt it: its pods name Alnair's scheduler and the test's node pool (no other scheduler
runs here), and say how long KWOK runs them (5 s, or 600 s for a second runtime).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from alnair.common import resources as r
from alnair.common.kube import (
    CLUSTERTRAININGRUNTIMES,
    EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    SECRETS,
    TRAINJOBS,
    VALIDATING_WEBHOOKS,
    KubeClient,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, ANN_BORROWING, LABEL_QUEUE
from dispatcher_support import (
    POOL,
    admitted_type,
    queue_used,
    queued_pool,
)
from dispatcher_support import gpu_job as lender_job
from peers_support import JOBSET, TRAINER, install_crds, peer_controller

pytestmark = pytest.mark.e2e
TRAINJOB_NAME = "jobset.sigs.k8s.io/jobset-name"  # Trainer names the JobSet after the TrainJob


def runtime(name: str, ns: str, seconds: float) -> dict[str, Any]:
    """Trainer's shipped torch runtime, adapted as a platform running Alnair would."""
    shipped = TRAINER.folder() / "runtimes" / "torch_distributed.yaml"
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(shipped.read_text()))
    doc["metadata"] = {"name": name}
    for rj in doc["spec"]["template"]["spec"]["replicatedJobs"]:
        template = rj["template"]["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("annotations", {})[r.ANN_DURATION] = (
            f"{seconds}s"
        )
        spec = template["spec"]
        spec["schedulerName"] = r.SCHEDULER_NAME
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), POOL: ns}
        spec["tolerations"] = [{"operator": "Exists"}]
    return doc


def train_job(name: str, ns: str, queue: str, runtime_name: str, nodes: int) -> dict[str, Any]:
    """`nodes` one-GPU nodes of a runtime, as a user writes it (no `suspend`)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "runtimeRef": {"name": runtime_name},
            "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {r.GPU: "1"}}},
        },
    }


async def _admitted(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    tj = await kube.get(TRAINJOBS, name, ns)
    annotations = tj["metadata"].get("annotations") or {}
    return tj if not tj["spec"].get("suspend") and ANN_ADMITTED_TYPE in annotations else None


async def _pods(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{TRAINJOB_NAME}={name}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def _bound(kube: KubeClient, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    pods = [p for p in await _pods(kube, ns, name) if p["spec"].get("nodeName")]
    return pods if len(pods) == n else []


async def _complete(kube: KubeClient, ns: str, name: str) -> bool:
    conds = ((await kube.get(TRAINJOBS, name, ns)).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)


async def _trainer_prerequisites(kube: KubeClient) -> None:
    """What Trainer's deploy gives its manager: its namespace, the Secret its certificate
    rotation fills, and the webhook configuration it injects its CA into (empty here: see
    `peers_support.Peer.webhooks`)."""
    for create in (
        kube.create(NAMESPACES, {"metadata": {"name": "kubeflow-system"}}),
        kube.create(
            SECRETS,
            {"metadata": {"name": "kubeflow-trainer-webhook-cert", "namespace": "kubeflow-system"}},
            "kubeflow-system",
        ),
        kube.create(
            VALIDATING_WEBHOOKS,
            {"metadata": {"name": "validator.trainer.kubeflow.org"}, "webhooks": []},
        ),
    ):
        try:
            await create
        except Exception as exc:  # already there (another run of this test)
            if "AlreadyExists" not in str(exc) and "409" not in str(exc):
                raise


async def test_train_jobs_queue_by_their_runtime_admit_complete_and_are_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await install_crds(kube, JOBSET)
    await install_crds(kube, TRAINER)
    await _trainer_prerequisites(kube)
    for name, seconds in ((f"torch-{ns}", 5), (f"torch-long-{ns}", 600)):
        await kube.create(CLUSTERTRAININGRUNTIMES, runtime(name, ns, seconds))
    try:
        async with queued_pool(
            cp,
            kube,
            ns,
            tmp_path,
            cohort="tc",
            queues={"train": (2, 2), "lender": (2, 0)},
            peers=[
                peer_controller(JOBSET, cp, kube, tmp_path, ns),
                peer_controller(TRAINER, cp, kube, tmp_path / "trainer", ns),
            ],
        ):
            # Held at creation; admitted within quota; Trainer's JobSet's pods get the model.
            made = await kube.create(TRAINJOBS, train_job("tj1", ns, "train", f"torch-{ns}", 2), ns)
            assert made["spec"]["suspend"] is True
            await wait_for(lambda: _admitted(kube, ns, "tj1"), 20)
            pods = await wait_for(lambda: _bound(kube, ns, "tj1", 2), 60)
            for pod in pods:
                assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32", pod
            assert await wait_for(lambda: queue_used(kube, f"train-{ns}"), 10) == 2

            # A second borrows the idle lender's quota; a third waits for quota.
            long_runtime = f"torch-long-{ns}"
            await kube.create(TRAINJOBS, train_job("tj2", ns, "train", long_runtime, 2), ns)
            tj2 = await wait_for(lambda: _admitted(kube, ns, "tj2"), 20)
            assert tj2["metadata"]["annotations"][ANN_BORROWING] == "true"
            await kube.create(TRAINJOBS, train_job("tj3", ns, "train", long_runtime, 2), ns)
            if not await _complete(kube, ns, "tj1"):
                assert await _admitted(kube, ns, "tj3") is None
            # tj1 completes (KWOK, the Jobs, JobSet, then Trainer): tj3 is admitted.
            await wait_for(lambda: _complete(kube, ns, "tj1"), 90, 0.2)
            await wait_for(lambda: _admitted(kube, ns, "tj3"), 30)

            # The lender needs its quota: a borrowing TrainJob is suspended again and Trainer
            # suspends its JobSet, whose pods go.
            await kube.create(JOBS, lender_job("l1", ns, "lender", 2), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"

            async def one_suspended() -> str | None:
                held = [
                    n for n in ("tj2", "tj3")
                    if (await kube.get(TRAINJOBS, n, ns))["spec"].get("suspend")
                ]  # fmt: skip
                return held[0] if len(held) == 1 else None

            victim = await wait_for(one_suspended, 30)
            await wait_for(lambda: _no_pods(kube, ns, victim), 60)
            events = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={victim}"))[
                "items"
            ]
            assert any(e["reason"] == "Preempted" for e in events)
    finally:
        for name in (f"torch-{ns}", f"torch-long-{ns}"):
            await kube.delete(CLUSTERTRAININGRUNTIMES, name)


async def _no_pods(kube: KubeClient, ns: str, name: str) -> bool:
    return not await _pods(kube, ns, name)
