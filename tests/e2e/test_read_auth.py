"""A workload's explanation is its namespace's (issue 25): with the deploy's
`ALNAIR_HTTP_AUTH_READS`, the dispatcher, under its shipped ServiceAccount (which the deploy
binds to `system:auth-delegator`), answers `GET /v1/jobs/<ns>/<name>` only to an identity the
API server lets `get` that Job. Another tenant's ServiceAccount gets 403, no token 401, a
token for the API server's own audience 401; bound to the built-in `view` role in the
namespace, the same account reads it. Health, metrics and the queue list stay open."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from alnair.common.kube import (
    CLUSTERQUEUES,
    JOBS,
    KIND_RESOURCES,
    LOCALQUEUES,
    NAMESPACES,
    SERVICEACCOUNTS,
    KubeClient,
)
from alnair.dev.builders import shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from dispatcher_support import POOL, cluster_queue, dispatcher_settings, gpu_job, local_queue

pytestmark = pytest.mark.e2e
RBAC = "rbac.authorization.k8s.io"


async def test_another_tenant_cannot_read_a_jobs_explanation(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    other = f"{ns}-b"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": other}})  # fmt: skip
    config = await shipped_account(control_plane, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"read-{ns}", None, {"V100M32": 1}))
    await kube.create(LOCALQUEUES, local_queue("read", ns, f"read-{ns}"), ns)
    await kube.create(JOBS, gpu_job("mine", ns, "read", 4), ns)  # waits: over its quota
    for where in (ns, other):
        await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                            "metadata": {"name": "reader"}}, where)  # fmt: skip
    theirs = await kube.service_account_token(other, "reader", audiences=["alnair"])
    ours = await kube.service_account_token(ns, "reader", audiences=["alnair"])
    api_audience = await kube.service_account_token(ns, "reader")
    path = f"/v1/jobs/{ns}/mine"
    async with KubeClient(config) as as_dispatcher:
        running = await start_dispatcher(
            dispatcher_settings(control_plane, ns, http_auth_reads=True), as_dispatcher
        )
        try:
            async with httpx.AsyncClient(base_url=running.url) as http:

                def get(token: str | None) -> Any:
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    return http.get(path, headers=headers)

                anonymous = await get(None)
                wrong_audience = await get(api_audience)
                another_tenant = await get(theirs)
                before_binding = await get(ours)
                await kube.create(KIND_RESOURCES["RoleBinding"], {
                    "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                    "metadata": {"name": "reader-view", "namespace": ns},
                    "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "view"},
                    "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
                }, ns)  # fmt: skip
                allowed: Any = None
                for _ in range(100):  # the binding reaches the authorizer (refusals cached 2 s)
                    allowed = await get(ours)
                    if allowed.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                still_refused = await get(theirs)
                health = await http.get("/healthz")
                queues = await http.get("/v1/queues")
        finally:
            await running.stop()
    for refused in (anonymous, wrong_audience):
        assert refused.status_code == 401, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
    assert another_tenant.status_code == 403
    assert f"may not get jobs.batch mine in namespace {ns}" in another_tenant.json()["detail"]
    assert before_binding.status_code == 403
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["status"] == "waiting"
    assert still_refused.status_code == 403
    assert health.status_code == 200 and queues.status_code == 200
    await kube.delete(NAMESPACES, other)
