"""The elastic controller's only mutating endpoint needs a token the API server authenticates
(issue 16): `POST /v1/elasticjobs/{ns}/{name}/scale` without one is a 401 problem, with a
ServiceAccount's token it reaches the route; reads stay open.
"""

from __future__ import annotations

import httpx
import pytest

from alnair.common.kube import SERVICEACCOUNTS, KubeClient
from alnair.common.localstack import ControlPlane
from elastic_support import start_controller

pytestmark = pytest.mark.e2e


async def test_scale_needs_a_reviewed_token(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ops"}},
        namespace,
    )
    token = await kube.service_account_token(namespace, "ops")
    running = await start_controller(control_plane, namespace)
    path = f"/v1/elasticjobs/{namespace}/nope/scale"
    try:
        async with httpx.AsyncClient(base_url=running.url) as http:
            anonymous = await http.post(path, json={"replicas": 2})
            forged = await http.post(
                path, json={"replicas": 2}, headers={"Authorization": "Bearer forged"}
            )
            allowed = await http.post(
                path, json={"replicas": 2}, headers={"Authorization": f"Bearer {token}"}
            )
            listing = await http.get("/v1/elasticjobs")
    finally:
        await running.stop()
    for refused in (anonymous, forged):
        assert refused.status_code == 401
        assert refused.headers["content-type"] == "application/problem+json"
    # authenticated: the route itself answers (no such job)
    assert allowed.status_code == 404
    assert allowed.headers["content-type"] == "application/problem+json"
    assert listing.status_code == 200
