"""`make dev-up` / `make dev-down`: the local stack for a developer, left running in the background.

Starts the same real servers the tests use (nats-server with JetStream, redis-server, and the
Kubernetes control plane with a few KWOK GPU nodes), records their process groups in
`.dev/state.json`, and prints how to reach each one. `down` stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from alnair.common.localstack import ControlPlane, NatsServer, RedisServer

STATE_DIR = Path(".dev")
STATE = STATE_DIR / "state.json"


def up(nodes: str) -> int:
    if STATE.exists():
        print(f"already up (see {STATE}); run `make dev-down` first", file=sys.stderr)
        return 1
    STATE_DIR.mkdir(exist_ok=True)
    nats = NatsServer(STATE_DIR / "nats", port=4222 if _free(4222) else None)
    (STATE_DIR / "nats").mkdir(exist_ok=True)
    nats.start()
    (STATE_DIR / "redis").mkdir(exist_ok=True)
    redis = RedisServer(STATE_DIR / "redis", port=6379 if _free(6379) else None).start()
    (STATE_DIR / "k8s").mkdir(exist_ok=True)
    cp = ControlPlane(STATE_DIR.resolve() / "k8s").start()
    created = asyncio.run(cp.create_gpu_nodes(nodes)) if nodes else []
    pids = [p.proc.pid for p in cp.procs.values() if p.proc is not None]
    for srv in (nats, redis):
        proc = srv._proc
        if proc is not None and proc.proc is not None:
            pids.append(proc.proc.pid)
    STATE.write_text(
        json.dumps(
            {
                "pids": pids,
                "nats_url": nats.url,
                "redis_url": redis.url,
                "kubeconfig": str(cp.kubeconfig),
                "server": cp.server,
                "nodes": created,
            },
            indent=2,
        )
    )
    print(
        f"""Alnair local stack is up.
  NATS (JetStream):  {nats.url}
  Redis:             {redis.url}
  Kubernetes API:    {cp.server}
  kubeconfig:        export KUBECONFIG={cp.kubeconfig}
  KWOK GPU nodes:    {len(created)} ({nodes})
  logs:              {STATE_DIR / "k8s" / "logs"}
For the services: export ALNAIR_NATS_URL={nats.url} ALNAIR_REDIS_URL={redis.url} \\
  ALNAIR_KUBECONFIG={cp.kubeconfig}
Stop everything with `make dev-down`."""
    )
    return 0


def down() -> int:
    if not STATE.exists():
        print("nothing to stop")
        return 0
    state = json.loads(STATE.read_text())
    for pid in state["pids"]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    STATE.unlink()
    print(f"stopped {len(state['pids'])} processes")
    return 0


def _free(port: int) -> bool:
    from alnair.common.localstack.procs import port_open

    return not port_open(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.common.devstack")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up")
    p_up.add_argument("--nodes", default="4x V100M32, 2x T4:4", help="KWOK GPU nodes to create")
    sub.add_parser("down")
    args = parser.parse_args(argv)
    return up(args.nodes) if args.cmd == "up" else down()


if __name__ == "__main__":
    raise SystemExit(main())
