"""Mutating HTTP requests need a bearer token the real API server authenticates (issue 16).

The guard from `alnair.common.httpauth` on a small app, reviewing tokens against the local
control plane: a ServiceAccount's token is accepted, garbage and a missing header get a 401
problem, reads and exempt queries stay open, answers are cached, and a service whose own
account may not create TokenReviews answers 503 instead of letting anyone in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid

import httpx
import pytest
from fastapi import FastAPI, Request

from alnair.common.http import install_problem_handlers
from alnair.common.httpauth import Access, TokenReviewer, install_token_auth, reviewer_for
from alnair.common.kube import KIND_RESOURCES, SERVICEACCOUNTS, KubeClient, NotFound
from alnair.common.settings import ServiceSettings
from alnair.dev.localstack import ControlPlane

pytestmark = pytest.mark.e2e


SCALE = "update deployments/scale.apps web"


def make_app(reviewer: TokenReviewer | None, namespace: str = "default") -> FastAPI:
    """POST /v1/scale amounts to scaling Deployment `web` in `namespace`; DELETE names no
    access (so nobody may use it)."""

    def authorize(request: Request) -> Access | None:
        if request.url.path == "/v1/scale":
            return Access("update", "apps", "deployments", namespace, "web", "scale")
        return None

    app = FastAPI()
    install_problem_handlers(app)
    install_token_auth(app, reviewer, service="test", exempt={"/v1/query"}, authorize=authorize)
    state: dict[str, int] = {"scaled": 0}

    @app.post("/v1/scale")
    async def scale(request: Request) -> dict[str, object]:
        state["scaled"] += 1
        return {"scaled": state["scaled"], "by": request.state.identity.username}

    @app.delete("/v1/things/{name}")
    async def delete(name: str) -> dict[str, str]:
        return {"deleted": name}

    @app.get("/v1/scale")
    async def read() -> dict[str, int]:
        return state

    @app.post("/v1/query")
    async def query() -> dict[str, str]:
        return {"answer": "42"}

    return app


async def token_of(kube: KubeClient, namespace: str, name: str) -> str:
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        namespace,
    )
    return await kube.service_account_token(namespace, name, audiences=["alnair"])


@pytest.fixture
async def account(kube: KubeClient, namespace: str) -> str:
    """A ServiceAccount's token, the account allowed to scale Deployment `web` (RBAC)."""
    token = await token_of(kube, namespace, "caller")
    rbac = "rbac.authorization.k8s.io"
    await kube.create(KIND_RESOURCES["Role"], {
        "apiVersion": f"{rbac}/v1", "kind": "Role",
        "metadata": {"name": "scaler", "namespace": namespace},
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                   "resourceNames": ["web"], "verbs": ["update"]}],
    }, namespace)  # fmt: skip
    await kube.create(KIND_RESOURCES["RoleBinding"], {
        "apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
        "metadata": {"name": "scaler", "namespace": namespace},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "scaler"},
        "subjects": [{"kind": "ServiceAccount", "name": "caller", "namespace": namespace}],
    }, namespace)  # fmt: skip
    return token


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


async def test_service_account_token_accepted_garbage_refused(
    kube: KubeClient, namespace: str, account: str
) -> None:
    reviewer = TokenReviewer(kube, audiences=["alnair"], cache_s=0.0, rejected_cache_s=0.0)
    async with client(make_app(reviewer, namespace)) as http:
        missing = await http.post("/v1/scale")
        garbage = await http.post("/v1/scale", headers={"Authorization": "Bearer not-a-token"})
        basic = await http.delete("/v1/things/x", headers={"Authorization": "Basic YTpi"})
        for refused in (missing, garbage, basic):
            assert refused.status_code == 401
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "bearer token" in missing.json()["detail"]
        assert "does not authenticate" in garbage.json()["detail"]
        assert (await http.get("/v1/scale")).json() == {"scaled": 0}  # nothing happened

        for _ in range(50):  # RBAC caches take a moment to see the new binding
            ok = await http.post("/v1/scale", headers={"Authorization": f"Bearer {account}"})
            if ok.status_code != 403:
                break
            await asyncio.sleep(0.1)
        assert ok.status_code == 200
        assert ok.json()["by"] == f"system:serviceaccount:{namespace}:caller"
        scaled = ok.json()["scaled"]
        again = await http.post("/v1/scale", headers={"Authorization": f"Bearer {account}"})
        assert again.json()["scaled"] == scaled + 1
        # reads and exempt queries need nothing
        assert (await http.get("/v1/scale")).status_code == 200
        assert (await http.post("/v1/query")).json() == {"answer": "42"}


async def test_an_authenticated_caller_may_do_only_what_its_rbac_allows(
    kube: KubeClient, namespace: str, account: str
) -> None:
    """Authentication is not authorization: a valid token of an account without the right
    gets a 403 naming the access; a route the service names no access for is closed to all."""
    stranger = await token_of(kube, namespace, "stranger")
    reviewer = TokenReviewer(kube, audiences=["alnair"])
    async with client(make_app(reviewer, namespace)) as http:
        refused = await http.post("/v1/scale", headers={"Authorization": f"Bearer {stranger}"})
        assert refused.status_code == 403
        assert refused.headers["content-type"] == "application/problem+json"
        detail = refused.json()["detail"]
        assert f"system:serviceaccount:{namespace}:stranger may not" in detail
        assert SCALE in detail and namespace in detail
        closed = await http.delete("/v1/things/x", headers={"Authorization": f"Bearer {account}"})
        assert closed.status_code == 403
        assert "names no access" in closed.json()["detail"]
        assert (await http.get("/v1/scale")).json() == {"scaled": 0}  # nothing happened
        # Decisions are cached like identities: one review per (identity, access).
        again = await http.post("/v1/scale", headers={"Authorization": f"Bearer {stranger}"})
        assert again.status_code == 403
    assert reviewer.access_reviews == 1
    assert reviewer.reviews == 2  # one per distinct token


async def test_reviewer_without_tokenreview_rights_fails_closed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, account: str
) -> None:
    # The service itself runs as a ServiceAccount; without system:auth-delegator it may not
    # ask the API server, and must answer 503, never let the caller in.
    name = f"svc-{uuid.uuid4().hex[:6]}"
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        namespace,
    )
    own = await kube.service_account_token(namespace, name)
    config = dataclasses.replace(kube.config, cert_file=None, key_file=None, token=own)
    async with KubeClient(config) as as_service:
        async with client(
            make_app(TokenReviewer(as_service, audiences=["alnair"]), namespace)
        ) as http:
            denied = await http.post("/v1/scale", headers={"Authorization": f"Bearer {account}"})
        assert denied.status_code == 503
        assert denied.headers["content-type"] == "application/problem+json"
        binding = f"{name}-auth-delegator"
        await kube.create(
            KIND_RESOURCES["ClusterRoleBinding"],
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )
        try:
            reviewer = TokenReviewer(as_service, audiences=["alnair"])
            async with client(make_app(reviewer, namespace)) as http:
                for _ in range(50):  # RBAC caches take a moment to see the binding
                    ok = await http.post(
                        "/v1/scale", headers={"Authorization": f"Bearer {account}"}
                    )
                    if ok.status_code != 503:
                        break
                    await asyncio.sleep(0.1)
            assert ok.status_code == 200
        finally:
            with contextlib.suppress(NotFound):
                await kube.delete(KIND_RESOURCES["ClusterRoleBinding"], binding)


def test_switch_for_local_development(kube: KubeClient) -> None:
    assert reviewer_for(ServiceSettings(http_auth=False), kube) is None
    assert isinstance(reviewer_for(ServiceSettings(), kube), TokenReviewer)
    with pytest.raises(Exception, match="ALNAIR_HTTP_AUTH needs a Kubernetes client"):
        reviewer_for(ServiceSettings(), None)
