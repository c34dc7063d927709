"""The elastic controller's only mutating endpoint needs a token the API server authenticates
(issue 16), minted for the `alnair` audience, and an identity it authorizes (issue 25). `POST /v1/elasticjobs/{ns}/{name}/scale`
without a token is a 401 problem. With a ServiceAccount's valid token but no right to update
that ElasticJob's scale, it is a 403 naming the access. Once the account is bound to the
built-in `edit` role in the namespace, which gains the right from the shipped
`alnair-elasticjobs-edit` by aggregation, the request reaches the route. Reads stay open.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from alnair.common.kube import KIND_RESOURCES, SERVICEACCOUNTS, KubeClient
from alnair.dev.builders import BASE
from alnair.dev.elastic import start_controller
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import load_manifests

pytestmark = pytest.mark.e2e
RBAC = "rbac.authorization.k8s.io"


async def test_scale_needs_a_reviewed_token_and_the_right_to_scale(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    for doc in load_manifests(BASE / "elastic" / "user-roles.yaml"):
        await kube.apply(doc)
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ops"}},
        namespace,
    )
    token = await kube.service_account_token(namespace, "ops", audiences=["alnair"])
    # The same account's token for the API server's audience is not one the service takes.
    api_token = await kube.service_account_token(namespace, "ops")
    running = await start_controller(control_plane, namespace)
    path = f"/v1/elasticjobs/{namespace}/nope/scale"
    bearer = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(base_url=running.url) as http:
            anonymous = await http.post(path, json={"replicas": 2})
            forged = await http.post(
                path, json={"replicas": 2}, headers={"Authorization": "Bearer forged"}
            )
            unauthorized = await http.post(path, json={"replicas": 2}, headers=bearer)
            wrong_audience = await http.post(
                path, json={"replicas": 2}, headers={"Authorization": f"Bearer {api_token}"}
            )
            await kube.create(KIND_RESOURCES["RoleBinding"], {
                "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                "metadata": {"name": "ops-edit", "namespace": namespace},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "ops",
                              "namespace": namespace}],
            }, namespace)  # fmt: skip
            allowed: Any = None
            for _ in range(100):  # the binding and the aggregation reach the authorizer
                allowed = await http.post(path, json={"replicas": 2}, headers=bearer)
                if allowed.status_code != 403:
                    break
                await asyncio.sleep(0.1)
            elsewhere = await http.post(
                "/v1/elasticjobs/kube-system/x/scale", json={"replicas": 2}, headers=bearer
            )
            listing = await http.get("/v1/elasticjobs")
    finally:
        await running.stop()
    for refused in (anonymous, forged, wrong_audience):
        assert refused.status_code == 401
        assert refused.headers["content-type"] == "application/problem+json"
    assert unauthorized.status_code == 403
    assert "may not update elasticjobs/scale.alnair.io nope" in unauthorized.json()["detail"]
    # authorized: the route itself answers (no such job)
    assert allowed.status_code == 404
    assert allowed.headers["content-type"] == "application/problem+json"
    # the right is the namespace's: another namespace's jobs stay out of reach
    assert elsewhere.status_code == 403
    assert listing.status_code == 200
