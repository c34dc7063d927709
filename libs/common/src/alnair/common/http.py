"""Every service's HTTP API runs the same way: uvicorn on the service's own event loop, and
every error is an RFC 9457 problem response (`application/problem+json`).

`start_http` starts the server as a guarded task and returns once it listens (uvicorn offers
no start event, so it waits on `server.started`, once, at start-up) or raises `ConfigError`
naming the address when it cannot bind; `bound_port` is the port actually bound (tests ask
for port 0). To stop, set `server.should_exit` and await the task: uvicorn must close its
listening socket itself before anything is cancelled (cancelling it first leaks the socket).

`install_problem_handlers` turns what FastAPI would answer in its own shapes into problems:
a body or parameter that fails validation is a 422 whose `detail` names every bad field and
whose `invalid_params` lists them (field path, message, the value received); an
`InvalidValueError` raised by a route is a 422 naming its field and value; an `HTTPException`
keeps its status; anything unexpected is a logged 500 that leaks no internals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.tasks import spawn
from alnair.common.tls import CertReloader

PROBLEM_JSON = "application/problem+json"

log = logging.getLogger(__name__)


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    """An RFC 9457 problem response; `extra` members are added as extensions."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(jsonable_encoder(body), status_code=status, media_type=PROBLEM_JSON)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "path", "header"}:
        parts = parts[1:] or parts
    return ".".join(parts)


def install_problem_handlers(app: FastAPI) -> None:
    """Every error `app` answers becomes a problem response (see the module's docstring)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        params = [
            {"name": _field(e.get("loc", ())), "reason": e.get("msg", ""), "value": e.get("input")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{p['name']}: {p['reason']}" for p in params) or "invalid request"
        return problem(422, "Invalid request", detail, invalid_params=params)

    @app.exception_handler(InvalidValueError)
    async def _invalid_value(_request: Request, exc: InvalidValueError) -> JSONResponse:
        params = [{"name": exc.field, "reason": exc.reason, "value": exc.value}]
        return problem(422, "Invalid request", str(exc), invalid_params=params)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = _TITLES.get(exc.status_code, "Error")
        return problem(exc.status_code, title, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", extra={"path": request.url.path}, exc_info=exc)
        return problem(500, "Internal Server Error", f"unexpected {type(exc).__name__}")


_TITLES = {
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    422: "Invalid request",
    503: "Service Unavailable",
}


# How long an idle client connection stays open. It must outlast the clients' own idle
# expiry (httpx: 5 s, Go's http.Transport: 90 s): a server that closes first races the
# client's next request on that connection, which then fails with a read error.
KEEP_ALIVE_S = 120


async def start_http(
    app: Any,
    host: str,
    port: int,
    *,
    name: str,
    on_death: Callable[[BaseException], None] | None = None,
    tls: CertReloader | None = None,
    protocol: type[asyncio.Protocol] | None = None,
    cert_dir: str | None = None,
) -> tuple[uvicorn.Server, asyncio.Task[Any]]:
    """Serve `app` on host:port (HTTPS with `tls`'s live context, whose certificate follows
    its folder) until the returned task ends; `protocol`: uvicorn's HTTP protocol class, when
    not its default (`aggregated.ClientCertH11` shows the application the client's
    certificate).

    `cert_dir` (a service's `http_cert_dir`, the mounted Secret of its serving certificate):
    HTTPS only, the certificate reloaded when the Secret changes; the returned task then also
    ends when that watch dies (a plain HTTP request gets no answer but a failed handshake)."""
    if cert_dir:
        reloader = CertReloader(cert_dir)
        server, served = await start_http(
            app, host, port, name=f"{name}.serve", on_death=on_death, tls=reloader,
            protocol=protocol,
        )  # fmt: skip
        # Named as the service's HTTP task: its owner stops it by that name (`stop_http`).
        return server, spawn(
            _serve_and_follow(served, reloader), name=name, on_death=on_death,
            ends=lambda: bool(server.should_exit),
        )  # fmt: skip
    tls_options: dict[str, Any] = {}
    if tls is not None:
        context = tls.context
        tls_options = {"ssl_context_factory": lambda _config, _default: context}
    if protocol is not None:
        tls_options["http"] = protocol
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, lifespan="off", access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S, **tls_options,
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = spawn(
        server.serve(), name=name, on_death=on_death, ends=lambda: bool(server.should_exit)
    )
    while not server.started:
        if task.done():
            raise ConfigError(f"HTTP server did not start on {host}:{port}", host=host, port=port)
        await asyncio.sleep(0.01)
    return server, task


async def _serve_and_follow(served: asyncio.Task[Any], reloader: CertReloader) -> None:
    """Run until the server ends, reloading its certificate meanwhile."""
    stop = asyncio.Event()
    watcher = spawn(reloader.watch(stop), name=f"{served.get_name()}.certs", ends=stop.is_set)
    try:
        done, _ = await asyncio.wait({served, watcher}, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            finished.result()  # a watch that died raises here: the service fails
    finally:
        stop.set()
        for task in (watcher, served):
            if not task.done():
                task.cancel()
        await asyncio.gather(watcher, served, return_exceptions=True)


def bound_port(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])


async def stop_http(server: uvicorn.Server, task: asyncio.Task[Any] | None) -> None:
    """Ask uvicorn to exit and wait (up to 5 s) for it to close its socket: it must close it
    itself before anything is cancelled, or the socket leaks."""
    server.should_exit = True
    if task is not None:
        await asyncio.wait({task}, timeout=5.0)


def named_task(tasks: list[asyncio.Task[Any]], name: str) -> asyncio.Task[Any] | None:
    """The task called `name` among `tasks` (the HTTP server's, for `stop_http`)."""
    return next((t for t in tasks if t.get_name() == name), None)
