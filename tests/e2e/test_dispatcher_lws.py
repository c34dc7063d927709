"""LeaderWorkerSets through a queue, with LeaderWorkerSet's own CRD, controller and webhooks
(`sigs.k8s.io/lws`, built by hack/build-peers.sh): nothing of it is written here but the
LeaderWorkerSets a user would write.

A LeaderWorkerSet is a serving workload: the dispatcher's webhook labels its leader and worker
templates, so every pod its controller makes (the leader StatefulSet's, then each group's
worker StatefulSet's) is gated. The dispatcher, under its shipped account, admits it whole:
every pod ungated with the GPU model in its node selector. It is counted while it runs, its
deletion admits the next one, and one on borrowed quota is evicted whole when the lender needs
its quota back; LeaderWorkerSet's controller makes its pods again, and they wait gated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    JOBS,
    LEADERWORKERSETS,
    PODS,
    ApiError,
    KubeClient,
    Unavailable,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, LABEL_QUEUE, LABEL_WORKLOAD
from dispatcher_support import (
    POOL,
    admitted_type,
    events,
    explain,
    gpu_job,
    queue_used,
    queued_pool,
)
from peers_support import LWS, install_crds, peer_controller

pytestmark = pytest.mark.e2e
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def lws(name: str, ns: str, queue: str, size: int, *, gpu_leader: bool) -> dict[str, Any]:
    """One group of `size` pods: one-GPU workers, and a leader that asks for none (its own
    template) or, with `gpu_leader`, the workers' template for the leader too."""

    def template(gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "serve", "image": "example.invalid/serve:1"}
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

    lwt: dict[str, Any] = {"size": size, "workerTemplate": template(1)}
    if not gpu_leader:
        lwt["leaderTemplate"] = template(0)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {"replicas": 1, "leaderWorkerTemplate": lwt},
    }


async def _pods(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(PODS, ns, label_selector=f"{LWS_NAME}={name}"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def _all_running(kube: KubeClient, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    pods = await _pods(kube, ns, name)
    ok = [p for p in pods if p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")]
    return ok if len(ok) == n and len(pods) == n else []


async def _all_gated(kube: KubeClient, ns: str, name: str, n: int) -> list[dict[str, Any]]:
    pods = await _pods(kube, ns, name)
    gated = [p for p in pods if p["spec"].get("schedulingGates")]
    return gated if len(gated) == n and len(pods) == n else []


async def test_leaderworkersets_are_admitted_whole_counted_and_evicted_whole(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await install_crds(kube, LWS)
    async with queued_pool(
        cp,
        kube,
        ns,
        tmp_path,
        cohort="lc",
        queues={"serve": (2, 2), "lender": (2, 0)},
        peers=[peer_controller(LWS, cp, kube, tmp_path, ns)],
    ) as running:
        await wait_for(lambda: _labelled_on_dry_run(kube, ns), 30, 0.2)
        # Both templates are labelled at creation, so all three pods come gated; admitted
        # within quota, each is ungated with the model (the leader's too: it asks none).
        made = await kube.create(LEADERWORKERSETS, lws("a", ns, "serve", 3, gpu_leader=False))
        lwt = made["spec"]["leaderWorkerTemplate"]
        for t in ("leaderTemplate", "workerTemplate"):
            assert lwt[t]["metadata"]["labels"][LABEL_WORKLOAD] == "leaderworkerset.a"
        pods = await wait_for(lambda: _all_running(kube, ns, "a", 3), 40)
        for pod in pods:
            assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32", pod
            assert pod["metadata"]["annotations"][ANN_ADMITTED_TYPE] == "V100M32"
        admitted = await wait_for(lambda: events(kube, ns, "a", "Admitted"), 10)
        assert "2 x V100M32" in admitted[0]["message"]
        # Counted: the two workers' GPUs, nothing for the leader.
        assert await wait_for(lambda: queue_used(kube, f"serve-{ns}"), 10) == 2

        # The next borrows the idle lender's quota; a third (a GPU leader and one worker)
        # waits with both its pods gated.
        await kube.create(LEADERWORKERSETS, lws("b", ns, "serve", 3, gpu_leader=False))
        await wait_for(lambda: _all_running(kube, ns, "b", 3), 40)
        await kube.create(LEADERWORKERSETS, lws("c", ns, "serve", 2, gpu_leader=True))
        waiting = await wait_for(
            lambda: explain(running, ns, "c", lambda d: d["reason"] is not None,
                            kind="leaderworkersets"), 20,
        )  # fmt: skip
        assert waiting["status"] == "waiting"
        await wait_for(lambda: _all_gated(kube, ns, "c", 2), 20)

        # Deleting a gives its quota back: c is admitted, both its pods ungated.
        await kube.delete(LEADERWORKERSETS, "a", ns, propagation="Foreground")
        await wait_for(lambda: _all_running(kube, ns, "c", 2), 40)

        # The lender needs its quota: a borrowing LeaderWorkerSet is evicted whole, and
        # the pods its controller makes again wait gated.
        await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"
        evicted = await wait_for(lambda: _evicted_one(kube, ns), 30)
        reasons = await events(kube, ns, evicted, "Preempted")
        assert "evicted whole" in reasons[0]["message"]


async def _evicted_one(kube: KubeClient, ns: str) -> str | None:
    """The LeaderWorkerSet that was evicted: its pods are back, every one gated."""
    for name, size in (("b", 3), ("c", 2)):
        if await _all_gated(kube, ns, name, size) and await events(kube, ns, name, "Preempted"):
            return name
    return None


async def _labelled_on_dry_run(kube: KubeClient, ns: str) -> bool:
    """A dry-run create: LeaderWorkerSet's webhook defaulted it and ours labelled it."""
    try:
        made = await kube.request(
            "POST", LEADERWORKERSETS.path(ns),
            body=lws("probe", ns, "serve", 2, gpu_leader=True), params={"dryRun": "All"},
        )  # fmt: skip
    except (ApiError, Unavailable):
        return False  # registered, not answering yet
    template = made["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    labelled = LABEL_WORKLOAD in ((template.get("metadata") or {}).get("labels") or {})
    return labelled and "rolloutStrategy" in made["spec"]
