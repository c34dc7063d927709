"""Every service's HTTP API runs the same way: uvicorn on the service's own event loop.

`start_http` starts the server as a guarded task and returns once it listens (uvicorn offers
no start event, so it waits on `server.started`, once, at start-up) or raises `ConfigError`
naming the address when it cannot bind; `bound_port` is the port actually bound (tests ask
for port 0). To stop, set `server.should_exit` and await the task: uvicorn must close its
listening socket itself before anything is cancelled (cancelling it first leaks the socket).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn

from alnair.common.errors import ConfigError
from alnair.common.tasks import spawn


async def start_http(
    app: Any,
    host: str,
    port: int,
    *,
    name: str,
    on_death: Callable[[BaseException], None] | None = None,
) -> tuple[uvicorn.Server, asyncio.Task[Any]]:
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, lifespan="off", access_log=False
    )
    server = uvicorn.Server(config)
    task = spawn(server.serve(), name=name, on_death=on_death)
    while not server.started:
        if task.done():
            raise ConfigError(f"HTTP server did not start on {host}:{port}", host=host, port=port)
        await asyncio.sleep(0.01)
    return server, task


def bound_port(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])
