"""Every error a service's API answers is an RFC 9457 problem that names what was wrong."""

from __future__ import annotations

import httpx
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from alnair.common.errors import InvalidValueError
from alnair.common.http import PROBLEM_JSON, install_problem_handlers


class Body(BaseModel):
    batch_size: int = Field(gt=0)
    gpu: str


def app() -> FastAPI:
    api = FastAPI()
    install_problem_handlers(api)

    @api.post("/things")
    async def make(body: Body) -> dict[str, int]:
        return {"batch_size": body.batch_size}

    @api.get("/things/{name}")
    async def get(name: str) -> dict[str, str]:
        if name == "gone":
            raise HTTPException(status_code=404, detail="thing 'gone' not found")
        if name == "odd":
            raise InvalidValueError("name", name, "odd things are refused")
        raise RuntimeError("secret internals")

    return api


def client() -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app(), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api")


async def test_a_bad_body_is_a_422_problem_naming_every_bad_field() -> None:
    async with client() as api:
        reply = await api.post("/things", json={"batch_size": -3})
    assert reply.status_code == 422
    assert reply.headers["content-type"] == PROBLEM_JSON
    body = reply.json()
    assert body["status"] == 422 and body["title"] == "Invalid request"
    named = {p["name"]: p for p in body["invalid_params"]}
    assert set(named) == {"batch_size", "gpu"}
    assert named["batch_size"]["value"] == -3
    assert "batch_size" in body["detail"] and "gpu" in body["detail"]


async def test_a_body_that_is_not_json_is_a_problem() -> None:
    async with client() as api:
        reply = await api.post(
            "/things", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert reply.status_code == 422
    assert reply.headers["content-type"] == PROBLEM_JSON


async def test_http_errors_invalid_values_and_crashes_are_problems() -> None:
    async with client() as api:
        gone = await api.get("/things/gone")
        odd = await api.get("/things/odd")
        crash = await api.get("/things/boom")
        missing = await api.get("/nowhere")
    assert (gone.status_code, gone.headers["content-type"]) == (404, PROBLEM_JSON)
    assert gone.json()["detail"] == "thing 'gone' not found"
    assert odd.status_code == 422
    assert odd.json()["invalid_params"] == [
        {"name": "name", "reason": "odd things are refused", "value": "odd"}
    ]
    assert (crash.status_code, crash.headers["content-type"]) == (500, PROBLEM_JSON)
    assert "secret" not in crash.text and crash.json()["detail"] == "unexpected RuntimeError"
    assert (missing.status_code, missing.headers["content-type"]) == (404, PROBLEM_JSON)
