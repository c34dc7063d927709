"""The scheduler's /readyz reflects its watches (issue 16): a watch the API server refuses
makes it 503 naming the informer and the error, and it turns ready by itself once fixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from alnair.common.kube import KIND_RESOURCES, SERVICEACCOUNTS, KubeClient, NotFound
from alnair.common.tasks import cancel_all, spawn, within
from alnair.dev.waiting import wait_for
from alnair.scheduler.api import build_api
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.e2e

RULES = [
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]},
    {"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"], "verbs": ["list", "watch"]},
]
PDB_RULE = {
    "apiGroups": ["policy"],
    "resources": ["poddisruptionbudgets"],
    "verbs": ["list", "watch"],
}


@pytest.fixture
async def limited(kube: KubeClient, namespace: str) -> AsyncIterator[tuple[KubeClient, str]]:
    """A client as a ServiceAccount that may watch everything the scheduler needs but PDBs."""
    role = f"readyz-{uuid.uuid4().hex[:6]}"
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sched"}},
        namespace,
    )
    await kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": RULES,
        }
    )
    await kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "sched", "namespace": namespace}],
        }
    )
    token = await kube.service_account_token(namespace, "sched")
    config = dataclasses.replace(kube.config, cert_file=None, key_file=None, token=token)
    try:
        async with KubeClient(config) as client:
            yield client, role
    finally:
        for kind in ("ClusterRoleBinding", "ClusterRole"):
            with contextlib.suppress(NotFound):
                await kube.delete(KIND_RESOURCES[kind], role)


async def test_readyz_names_the_failing_watch_and_recovers(
    kube: KubeClient, limited: tuple[KubeClient, str]
) -> None:
    client, role = limited
    settings = SchedulerSettings(leader_elect=False, nats_enabled=False, identity="readyz")
    scheduler = Scheduler(client, settings)
    for inf in scheduler.informers():
        inf.stale_after_s, inf.max_backoff_s = 0.2, 0.3
    tasks = [spawn(inf.run(), name=f"test.{inf.name}") for inf in scheduler.informers()]
    app = build_api(scheduler)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as http:
            await within(scheduler.pods.synced.wait(), 15)
            # The PDB watch has failed long enough to be unhealthy (stale after 0.2 s).
            await wait_for(lambda: not scheduler.pdbs.healthy, 10)
            reply = await http.get("/readyz")
            assert reply.status_code == 503
            assert reply.headers["content-type"] == "application/problem+json"
            body = reply.json()
            pdbs = body["informers"]["poddisruptionbudgets"]
            assert not pdbs["healthy"] and pdbs["running"]
            assert "403" in pdbs["last_error"]
            assert body["informers"]["pods"]["healthy"]
            # RBAC fixed: ready again without a restart
            await kube.apply(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": role},
                    "rules": [*RULES, PDB_RULE],
                }
            )

            async def ready() -> httpx.Response | None:
                reply = await http.get("/readyz")
                return reply if reply.status_code == 200 else None

            reply = await wait_for(ready, 10, 0.1, what="/readyz to answer 200")
            assert reply.json()["status"] == "ready"
    finally:
        await cancel_all(tasks)
        await scheduler.stop()
