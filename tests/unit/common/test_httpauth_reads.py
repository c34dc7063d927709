"""Reads of one tenant's objects need a token and the right to get them (`object_reads`,
`install_token_auth(authorize_read=...)`); other reads stay open. The profiler's mapping is
the one its app installs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from alnair.common.httpauth import Access, Identity, install_token_auth, object_reads
from alnair.profiler.api import PROFILE_LISTS, PROFILE_READS


class Reviewer:
    """Tokens are user names; `grants` is what each may do."""

    def __init__(self, grants: dict[str, set[Access]]) -> None:
        self.grants = grants
        self.asked: list[Access] = []

    async def review(self, token: str) -> Identity | None:
        return Identity(token, token, ()) if token in self.grants else None

    async def allowed(self, identity: Identity, access: Access) -> tuple[bool, str]:
        self.asked.append(access)
        return access in self.grants[identity.username], ""


def app(reviewer: Reviewer) -> FastAPI:
    api = FastAPI()

    @api.get("/v1/jobs/{ns}/{name}/profile")
    async def profile(ns: str, name: str) -> dict[str, Any]:
        return {"job": f"{ns}/{name}"}

    @api.get("/v1/records")
    async def records() -> list[str]:
        return ["r"]

    @api.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    install_token_auth(
        api, reviewer, service="profiler",  # type: ignore[arg-type]
        authorize_read=object_reads(PROFILE_READS, PROFILE_LISTS),
    )  # fmt: skip
    return api


@pytest.mark.parametrize(
    ("token", "path", "status"),
    [
        (None, "/v1/jobs/a/train/profile", 401),
        ("tenant-b", "/v1/jobs/a/train/profile", 403),
        ("tenant-a", "/v1/jobs/a/train/profile", 200),
        ("tenant-a", "/v1/records", 403),
        ("admin", "/v1/records", 200),
        (None, "/healthz", 200),
    ],
)
async def test_a_profile_is_its_namespaces(token: str | None, path: str, status: int) -> None:
    reviewer = Reviewer({
        "tenant-a": {Access("get", "batch", "jobs", "a", "train")},
        "tenant-b": {Access("get", "batch", "jobs", "b", "train")},
        "admin": {Access("list", "batch", "jobs")},
    })  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app(reviewer))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        resp = await http.get(path, headers=headers)
    assert resp.status_code == status, resp.text
    if status == 403:
        assert "may not" in resp.json()["detail"]


def test_object_reads_maps_paths_to_get_on_the_object() -> None:
    access = object_reads({"jobs": ("batch", "jobs"), "pods": ("", "pods")})

    class Req:
        def __init__(self, path: str) -> None:
            self.url = type("U", (), {"path": path})()

    assert access(Req("/v1/jobs/ns/j")) == Access("get", "batch", "jobs", "ns", "j")  # type: ignore[arg-type]
    assert access(Req("/v1/pods/ns/p/explain")) == Access("get", "", "pods", "ns", "p")  # type: ignore[arg-type]
    assert access(Req("/v1/queues")) is None  # type: ignore[arg-type]
    assert access(Req("/v1/nodes/n1/gpus")) is None  # type: ignore[arg-type]
