"""The console's routes on the scheduler's aggregated API (`scheduler.query.alnair.io/v1alpha1`).

- `GET .../console/` and its two assets: the page, served from the package (no CDN). Reached
  through the API server (`kubectl proxy`, then `/apis/scheduler.query.alnair.io/v1alpha1/
  console/`), so its reads of both services' APIs are the user's own.
- `GET .../updates`: server-sent events naming the views that changed (`feed.py`).

Both are resources of the group (`console`, `updates`) that RBAC grants like any other.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from alnair.common.aggregated import status
from alnair.scheduler.console.feed import Feed

ASSETS = {
    "": ("index.html", "text/html; charset=utf-8"),
    "console.js": ("console.js", "text/javascript; charset=utf-8"),
    "console.css": ("console.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = {
    # Only its own scripts and styles, reads of its own origin, no framing.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return (files("alnair.scheduler.console") / "static" / name).read_bytes()


def add_console_routes(app: FastAPI, prefix: str, feed: Feed) -> None:
    loaded = {path: (_asset(name), kind) for path, (name, kind) in ASSETS.items()}

    @app.get(prefix + "/console", response_model=None)
    async def console_root() -> Response:
        # Relative: the page is reached under whatever prefix the proxy in front adds.
        return Response(status_code=308, headers={"Location": "console/"})

    @app.get(prefix + "/console/{asset:path}", response_model=None)
    async def console(asset: str) -> Response:
        found = loaded.get(asset)
        if found is None:
            return status(404, "NotFound", f"no console asset {asset!r}")
        body, kind = found
        return Response(body, media_type=kind, headers=SECURITY_HEADERS)

    @app.get(prefix + "/updates", response_model=None)
    async def updates() -> Response:
        client = feed.connect()
        if client is None:
            return status(503, "ServiceUnavailable", "too many console clients; retry later")
        return StreamingResponse(
            feed.stream(client),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
