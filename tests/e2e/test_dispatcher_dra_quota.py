"""GPUs asked through DRA claims count in the queue's quota (issue 24), under the dispatcher's
shipped ServiceAccount: a Job whose pods ask two of Alnair's GPUs through a
ResourceClaimTemplate takes two GPUs of its queue's quota, and a second one waits for it."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common import dra
from alnair.common.kube import CLUSTERQUEUES, JOBS, LOCALQUEUES, KubeClient
from alnair.dev.builders import shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from dispatcher_support import (
    POOL,
    admitted_type,
    cluster_queue,
    dispatcher_settings,
    explain,
    gpu_job,
    local_queue,
)

pytestmark = pytest.mark.e2e


def claim_job(name: str, ns: str, queue: str) -> dict[str, Any]:
    job = gpu_job(name, ns, queue, 1)
    pod = job["spec"]["template"]["spec"]
    pod["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    pod["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    return job


async def test_gpus_asked_through_claims_take_their_queues_quota(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    config = await shipped_account(control_plane, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"dra-{ns}", None, {"V100M32": 2}))
    await kube.create(LOCALQUEUES, local_queue("dra", ns, f"dra-{ns}"), ns)
    await kube.create(dra.RESOURCECLAIMTEMPLATES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": dra.CLASS_WHOLE, "count": 2}}]}}},
    }, ns)  # fmt: skip
    async with KubeClient(config) as as_dispatcher:
        running = await start_dispatcher(dispatcher_settings(control_plane, ns), as_dispatcher)
        try:
            await kube.create(JOBS, claim_job("d1", ns, "dra"), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "d1"), 20) == "V100M32"
            # The node has 8 GPUs: only the queue's quota (2, taken by d1's claim) holds d2.
            await kube.create(JOBS, claim_job("d2", ns, "dra"), ns)
            waiting = await wait_for(
                lambda: explain(running, ns, "d2", lambda d: d.get("reason") is not None), 10
            )
            assert waiting["reason"]["kind"] == "quota", waiting["reason"]
            assert await admitted_type(kube, ns, "d2") is None
            cq = await wait_for(lambda: _used(kube, f"dra-{ns}"), 10)
            assert cq == 2
        finally:
            await running.stop()


async def _used(kube: KubeClient, name: str) -> int | None:
    status = (await kube.get(CLUSTERQUEUES, name)).get("status") or {}
    return status.get("usedGPUs") or None
