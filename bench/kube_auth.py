"""What each kind of Kubernetes credential costs per request. Prints JSON.

    python bench/kube_auth.py [--requests 4000] [--rounds 5]

The scheduler binds hundreds of pods a second through `KubeClient.request`, so renewable
credentials must not slow that path. Two figures per credential kind (static bearer token, a
token file, an exec plugin whose answer has no expiry):

- `auth_step_ns`: the step `request` adds for the credential (ask the authenticator, build the
  per-request arguments; for a static one, only the test that there is no authenticator),
  timed alone over many iterations, loop included;
- `requests_per_s`: whole requests, 64 in flight, against a loopback aiohttp server that
  answers `{}` after checking the Authorization header (no TLS, so the HTTP client's own cost
  is as small as it gets and the credential's share as large as it gets).

Kinds run in alternating order each round; the report gives the median and the spread
(min-max) over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from alnair.common.kube import KubeClient, _with
from alnair.common.kubeauth import ExecPlugin
from alnair.common.kubeconfig import KubeConfig

TOKEN = "bench-token"
PLUGIN = (
    "import json; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
    f"'kind': 'ExecCredential', 'status': {{'token': '{TOKEN}'}}}}))"
)


async def serve() -> tuple[web.AppRunner, int]:
    async def handle(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, int(port)


def configs(server: str, tmp: Path) -> dict[str, KubeConfig]:
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    plugin = ExecPlugin(command=sys.executable, args=("-c", PLUGIN))
    return {
        "static_token": KubeConfig(server=server, token=TOKEN, insecure=True),
        "token_file": KubeConfig(server=server, token_file=str(token_file), insecure=True),
        "exec_plugin": KubeConfig(server=server, exec_plugin=plugin, insecure=True),
    }


async def auth_step_ns(client: KubeClient, iterations: int) -> float:
    headers = {"Content-Type": "application/json"}
    auth = client.auth
    t0 = time.perf_counter_ns()
    for _ in range(iterations):
        # What `request` does before sending: static credentials take no branch.
        if auth is not None:
            _with(await auth.credential(), headers)
    return (time.perf_counter_ns() - t0) / iterations


async def requests_per_s(client: KubeClient, requests: int, in_flight: int = 64) -> float:
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await client.request("GET", "/api/v1/namespaces")

    await asyncio.gather(*(one() for _ in range(200)))  # warm the connection pool
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    return requests / (time.perf_counter() - t0)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step-iterations", type=int, default=200_000)
    args = parser.parse_args()
    runner, port = await serve()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kinds = configs(f"http://127.0.0.1:{port}", Path(tmp))
            clients = {name: KubeClient(config) for name, config in kinds.items()}
            names = list(clients)
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    client = clients[name]
                    out = results.setdefault(name, {"auth_step_ns": [], "requests_per_s": []})
                    out["requests_per_s"].append(await requests_per_s(client, args.requests))
                    out["auth_step_ns"].append(await auth_step_ns(client, args.step_iterations))
            for client in clients.values():
                await client.close()
    finally:
        await runner.cleanup()
    report: dict[str, Any] = {
        name: {metric: summary(values) for metric, values in metrics.items()}
        for name, metrics in results.items()
    }
    report["protocol"] = {"requests": args.requests, "rounds": args.rounds, "in_flight": 64}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
