"""HTTP API of the device plugin: health, Prometheus metrics, and what the node holds.

`GET /v1/devices` lists each resource's devices and health as the kubelet sees them;
`GET /v1/vgpus` lists the fractional grants with their live usage from the regions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from alnair.common.bus import Bus, not_ready
from alnair.common.http import install_problem_handlers, problem
from alnair.common.metrics import CONTENT_TYPE_LATEST, render
from alnair.deviceplugin.metrics import DevicePluginMetrics
from alnair.deviceplugin.registry import VgpuRegistry
from alnair.deviceplugin.state import NodeDevices


def create_app(
    state: NodeDevices,
    vgpus: VgpuRegistry,
    metrics: DevicePluginMetrics,
    resources: list[str],
    bus: Bus | None = None,
    unregistered: Callable[[], str | None] = lambda: None,
) -> FastAPI:
    """`unregistered`: why the kubelet cannot use the plugin yet (None: registered)."""
    app = FastAPI(title="alnair-deviceplugin")
    install_problem_handlers(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        # Without the bus, GPU health and the node's inventory stop arriving: not ready.
        if (why := not_ready(bus)) is not None:
            return problem(503, "Not Ready", why)
        # A plugin the kubelet does not know serves no pod: the node's GPUs are not offered.
        if (why := unregistered()) is not None:
            return problem(503, "Not Ready", why)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/devices")
    async def list_devices() -> dict[str, Any]:
        snap = state.snapshot
        out: dict[str, Any] = {"node": snap.node, "resources": {}}
        for resource in resources:
            devices = snap.devices(resource)
            out["resources"][resource] = {
                "total": len(devices),
                "healthy": sum(d.healthy for d in devices),
            }
        out["gpus"] = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "healthy": snap.health.healthy(g.uuid),
                "reason": (h.reason if (h := snap.health.get(g.uuid)) else ""),
            }
            for g in snap.gpus
        ]
        return out

    @app.get("/v1/vgpus")
    async def list_vgpus() -> list[dict[str, Any]]:
        rows = []
        for rec in vgpus.records():
            usage = vgpus.usage(rec.vgpu_id)
            row: dict[str, Any] = asdict(rec)
            row["processes"] = len(vgpus.connections(rec.vgpu_id))
            row["usage"] = asdict(usage.device(0)) if usage else None
            rows.append(row)
        return rows

    return app
