"""`make up` / `make down` / `make status`: the whole system on a developer's machine.

`up` starts the same real servers the tests use (nats-server with JetStream, redis-server, the
Kubernetes control plane with a few KWOK GPU nodes), then every service as a local process,
each on its own port (`alnair.common.settings.DEFAULT_HTTP_PORTS`) with its log in
`<dir>/logs/<service>.log`: the profiler agent with the `sim` backend serving every KWOK node,
the aggregator, the predictor and the scheduler. It waits until each answers `/readyz` and
prints where each API is and the `KUBECONFIG` to export; `<dir>/env` holds the same as shell
exports. `status` says what is up (process alive, `/readyz` answer); `down` stops everything.
`<dir>` is `.dev` unless `ALNAIR_DEV_DIR` says otherwise, and `ALNAIR_DEV_FREE_PORTS=1` (or
`--free-ports`) picks free ports for everything, so a test's stack never clashes with a
developer's.

`up` is idempotent: on a running stack it restarts only the services that died and prints the
same summary. Each service runs under `alnair.dev.supervise`, which starts it again when it
exits, as the kubelet would (a leader that loses its Lease exits on purpose). A service that
exits during start-up fails `up` with the tail of its log.

The stack is secured as a deployment is (issue 16): nats-server admits only one user per
service, each limited to its subjects (`alnair.common.natsauth`), redis-server only its ACL
users (`alnair.common.redisauth`), with passwords generated for this stack and kept in its
state file; each service gets its own credentials and the predictor a model-signing key.
`<dir>/env` exports the operator's (admin) credentials for tools run by hand.

Which services run is the table `SERVICES`: one `ServiceSpec` per process. A service whose
module is not installed yet (the dispatcher, the elastic controller) is skipped with a note and
starts once its `python -m` module exists; `optional` ones (the device plugin, which needs a
kubelet that KWOK nodes do not have) start only when named with `--with`.

The dispatcher serves its admission webhook (HTTPS, a certificate for 127.0.0.1 kept in
`<dir>/dispatcher/tls`) and, once it is ready, the shipped webhook configurations are
registered by URL (the local control plane routes no Services): a queue-labelled Job created
without `suspend` is held for its queue, as in a cluster. The dispatcher's and the scheduler's
query APIs (`kubectl alnair`) are registered as APIServices behind ExternalName Services for
`localhost`, which the aggregator dials without a service network.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from alnair.common.errors import AlnairError, ConfigError
from alnair.common.natsauth import ADMIN_USER as NATS_ADMIN
from alnair.common.natsauth import SERVICE_PERMISSIONS, new_password
from alnair.common.redisauth import ADMIN_USER as REDIS_ADMIN
from alnair.common.redisauth import INFRA_USERS, SERVICE_USERS
from alnair.common.resources import LABEL_GPU_COUNT, LABEL_GPU_MODEL
from alnair.common.settings import DEFAULT_HTTP_PORTS
from alnair.dev.localstack import (
    ControlPlane,
    ManagedProcess,
    NatsCluster,
    NatsServer,
    RedisFailover,
    RedisServer,
)
from alnair.dev.localstack.procs import free_port, port_open
from alnair.dev.localstack.realnode import RealNode, reap_stale
from alnair.dev.stack_services import (
    REALNODE,
    SERVICES,
    ServiceSpec,
    StackInfo,
    real_node_info,
    service,
)
from alnair.dev.supervise import RESTART_MARK

DIR_ENV = "ALNAIR_DEV_DIR"
FREE_PORTS_ENV = "ALNAIR_DEV_FREE_PORTS"
TOPOLOGY_ENV = "ALNAIR_DEV_TOPOLOGY"
IDENTITY_PREFIX = "devstack-"
"""A leader-elected service's identity is this and its name (`devstack-scheduler`)."""
DEFAULT_NODES = "4x V100M32, 2x T4:4"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def state_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or ".dev")


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (guards against a reused pid);
    None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces; fields after its closing parenthesis
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Proc:
    """A process `up` started, as the state file records it."""

    name: str
    pid: int
    started: int | None
    log: str
    port: int | None = None
    argv: list[str] | None = None
    """Its command line as started (redis-server rewrites the one /proc shows)."""

    @classmethod
    def of(cls, p: ManagedProcess, port: int | None = None) -> Proc:
        assert p.proc is not None
        pid = p.proc.pid
        return cls(p.name, pid, _start_ticks(pid), str(p.log_path), port, list(p.argv))

    def alive(self) -> bool:
        return self.started is not None and _start_ticks(self.pid) == self.started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 20) -> str:
        try:
            lines = Path(self.log).read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log})"
        return "\n".join(lines[-n:])

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to its process group, SIGKILL if it has not exited in `timeout_s`."""
        if not self.alive():
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if kill_group(self.pid, sig, timeout_s):
                return

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "started": self.started,
            "log": self.log,
            "port": self.port,
            "argv": self.argv,
        }


def group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` (a service and its supervisor), from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def kill_group(pgid: int, sig: int, timeout_s: float) -> bool:
    """Send `sig` to process group `pgid` and wait for every process in it to exit (a
    supervisor killed before its service leaves the service holding the port a moment)."""
    members = group_members(pgid) or [pgid]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + timeout_s
    return all(_wait_exit(pid, max(0.0, deadline - time.monotonic())) for pid in members)


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Whether `pid` exited within `timeout_s` (woken by its pidfd, not by polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return bool(ready)
    finally:
        os.close(fd)


@dataclass
class State:
    """`<dir>/state.json`: what runs, where, and how to reach it."""

    dir: Path
    nats_url: str
    redis_url: str
    kubeconfig: str
    server: str
    nodes: list[str]
    infra: list[Proc] = field(default_factory=list)
    services: dict[str, Proc] = field(default_factory=dict)
    credentials: dict[str, Any] = field(default_factory=dict)
    """`nats` and `redis` (user -> password) and the predictor's `model_key`; empty: open."""
    real_node: dict[str, str] | None = None
    redis_sentinels: str | None = None
    """The Sentinels (host:port,...) of the production topology; None: one Redis server."""
    nats_replicas: int = 1
    """How many servers keep each stream: 3 on the production topology's NATS cluster."""

    @property
    def path(self) -> Path:
        return self.dir / "state.json"

    def save(self) -> None:
        doc = {
            "nats_url": self.nats_url,
            "redis_url": self.redis_url,
            "kubeconfig": self.kubeconfig,
            "server": self.server,
            "nodes": self.nodes,
            "infra": [p.to_json() for p in self.infra],
            "services": {name: p.to_json() for name, p in self.services.items()},
            "credentials": self.credentials,
            "real_node": self.real_node,
            "redis_sentinels": self.redis_sentinels,
            "nats_replicas": self.nats_replicas,
        }
        self.path.write_text(json.dumps(doc, indent=2))
        self.path.chmod(0o600)  # it holds the stack's passwords
        self.dir.joinpath("env").write_text(self.env_script())

    @classmethod
    def load(cls, directory: Path) -> State | None:
        path = directory / "state.json"
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        if "infra" not in doc:
            raise ConfigError(
                f"{path} was written by an older `make dev-up`: stop that stack with the "
                "commit that started it, or remove the folder",
                path=str(path),
            )
        return cls(
            directory,
            doc["nats_url"],
            doc["redis_url"],
            doc["kubeconfig"],
            doc["server"],
            list(doc["nodes"]),
            [Proc(**p) for p in doc["infra"]],
            {name: Proc(**p) for name, p in doc["services"].items()},
            dict(doc.get("credentials") or {}),
            doc.get("real_node"),
            doc.get("redis_sentinels"),
            int(doc.get("nats_replicas") or 1),
        )

    def connection_env(self) -> dict[str, str]:
        env = {
            "ALNAIR_NATS_URL": self.nats_url,
            "ALNAIR_REDIS_URL": self.redis_url,
            "ALNAIR_KUBECONFIG": self.kubeconfig,
        }
        if self.redis_sentinels:
            env["ALNAIR_REDIS_SENTINELS"] = self.redis_sentinels
        if self.nats_replicas > 1:
            env["ALNAIR_NATS_REPLICAS"] = str(self.nats_replicas)
        return env

    def admin_env(self) -> dict[str, str]:
        """The operator's NATS and Redis credentials (tools, scripts, tests)."""
        nats, redis = self.credentials.get("nats") or {}, self.credentials.get("redis") or {}
        env: dict[str, str] = {}
        if NATS_ADMIN in nats:
            env |= {"ALNAIR_NATS_USER": NATS_ADMIN, "ALNAIR_NATS_PASSWORD": nats[NATS_ADMIN]}
        if REDIS_ADMIN in redis:
            env |= {"ALNAIR_REDIS_USER": REDIS_ADMIN, "ALNAIR_REDIS_PASSWORD": redis[REDIS_ADMIN]}
        if self.redis_sentinels and self.credentials.get("sentinel"):
            env["ALNAIR_REDIS_SENTINEL_PASSWORD"] = str(self.credentials["sentinel"])
        return env

    def service_env(self, name: str) -> dict[str, str]:
        """Service `name`'s own credentials: its NATS user, its Redis user if it has one."""
        nats, redis = self.credentials.get("nats") or {}, self.credentials.get("redis") or {}
        env: dict[str, str] = {}
        if name in nats:
            env |= {"ALNAIR_NATS_USER": name, "ALNAIR_NATS_PASSWORD": nats[name]}
        if name in redis:
            env |= {"ALNAIR_REDIS_USER": name, "ALNAIR_REDIS_PASSWORD": redis[name]}
        if name in redis and self.redis_sentinels and self.credentials.get("sentinel"):
            env["ALNAIR_REDIS_SENTINEL_PASSWORD"] = str(self.credentials["sentinel"])
        if name == "predictor" and self.credentials.get("model_key"):
            env["ALNAIR_PREDICTOR_MODEL_KEY"] = str(self.credentials["model_key"])
        return env

    def env_script(self) -> str:
        lines = [
            f"# the local stack in {self.dir.resolve()}: `source` this file",
            f"export KUBECONFIG={self.kubeconfig}",
            *(f"export {k}={v}" for k, v in self.connection_env().items()),
            *(f"export {k}={v}" for k, v in self.admin_env().items()),
            *(f"export {url_variable(n)}={p.url}" for n, p in self.services.items()),
        ]
        return "\n".join(lines) + "\n"


def url_variable(name: str) -> str:
    """`ALNAIR_SCHEDULER_URL`, `ALNAIR_PROFILER_AGENT_URL`: where `<dir>/env` puts an API."""
    return f"ALNAIR_{name.upper().replace('-', '_')}_URL"


# --- readiness ---------------------------------------------------------------------------


def probe(port: int, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(ready, what it said): `/readyz`, or `/healthz` for a service without one."""
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as http:
            resp = http.get("/readyz")
            if resp.status_code == 404:
                resp = http.get("/healthz")
    except httpx.HTTPError as exc:
        return False, f"no answer ({type(exc).__name__})"
    if resp.status_code == 200:
        return True, f"{resp.request.url.path} 200"
    detail = ""
    with contextlib.suppress(ValueError):
        detail = str(resp.json().get("detail", ""))
    return False, f"{resp.request.url.path} {resp.status_code} {detail}".strip()


class StartError(AlnairError):
    """A service did not come up; the message carries its log tail."""


def _restarted(proc: Proc) -> bool:
    """Whether the service's supervisor has started it again (its log is this run's only)."""
    try:
        with open(proc.log, "rb") as log:
            return any(line.startswith(RESTART_MARK.encode()) for line in log)
    except OSError:
        return False


def _wait_ready(procs: Sequence[tuple[ManagedProcess, Proc]], timeout_s: float) -> None:
    """Until every process answers ready; the first one that exits fails at once."""
    waiting = list(procs)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for managed, proc in list(waiting):
            if not managed.alive() or _restarted(proc):
                managed.stop()  # no crash loop is left behind a failed start
                raise StartError(
                    f"{proc.name} exited during start-up (log {proc.log}):\n{proc.tail()}",
                    service=proc.name,
                )
            assert proc.port is not None
            if probe(proc.port, timeout_s=1.0)[0]:
                waiting.remove((managed, proc))
        if waiting and time.monotonic() > deadline:
            names = ", ".join(p.name for _, p in waiting)
            tails = "\n".join(f"--- {p.name} ({p.log})\n{p.tail(10)}" for _, p in waiting)
            raise StartError(f"not ready after {timeout_s:.0f}s: {names}\n{tails}")
        time.sleep(0.2)


# --- up, down, status --------------------------------------------------------------------


@dataclass(frozen=True)
class UpOptions:
    nodes: str = DEFAULT_NODES
    free_ports: bool = False
    extra: tuple[str, ...] = ()
    """Optional services to start too (`--with`)."""
    only: tuple[str, ...] | None = None
    """Start only these services (None: every available non-optional one)."""
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Extra environment per service name (the live demo tunes the profiler with it)."""
    ready_timeout_s: float = READY_TIMEOUT_S
    topology: str = "single"
    """`single`: one nats-server and one redis-server; `production`: the production overlay's
    three-node NATS JetStream cluster (streams kept by all three) and Redis with a replica and
    three Sentinels (`alnair.dev.localstack.NatsCluster`, `RedisFailover`)."""

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError(
                f"unknown topology {self.topology!r}: one of {', '.join(TOPOLOGIES)}",
                topology=self.topology,
            )


TOPOLOGIES = ("single", "production")


def wanted(opts: UpOptions) -> tuple[list[ServiceSpec], list[ServiceSpec]]:
    """(services to run, services skipped because their module is not installed)."""
    for name in (*opts.extra, *(opts.only or ())):
        if name != REALNODE:
            service(name)  # a clear error for a misspelt name
    # the real node comes with its device plugin (and DRA plugin)
    extra = (*opts.extra, "deviceplugin") if REALNODE in opts.extra else opts.extra
    if opts.only is not None:
        chosen = [s for s in SERVICES if s.name in opts.only]
    else:
        chosen = [s for s in SERVICES if not s.optional or s.name in extra]
    return [s for s in chosen if s.available()], [s for s in chosen if not s.available()]


def _ports(specs: Sequence[ServiceSpec], free: bool) -> dict[str, int]:
    ports = {s.name: free_port() if free else DEFAULT_HTTP_PORTS[s.name] for s in specs}
    return _check_free(ports, specs)


def _check_free(ports: Mapping[str, int], specs: Sequence[ServiceSpec]) -> dict[str, int]:
    """The ports of `specs`, after checking that nothing listens on them yet."""
    chosen = {s.name: ports[s.name] for s in specs}
    busy = [f"{port} ({name})" for name, port in chosen.items() if port_open(port)]
    if busy:
        raise ConfigError(
            f"port {', '.join(busy)} already in use by another process: stop it, or start "
            f"with free ports (`make up FREE_PORTS=1` or {FREE_PORTS_ENV}=1)",
            ports=busy,
        )
    return chosen


def _start_services(
    state: State, specs: Sequence[ServiceSpec], ports: Mapping[str, int], opts: UpOptions
) -> None:
    logs = state.dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stack = StackInfo(state.dir, tuple(state.nodes), state.real_node)
    started: list[tuple[ManagedProcess, Proc]] = []
    envs: dict[str, dict[str, str]] = {}
    for spec in specs:
        envs[spec.name] = env = {
            **state.connection_env(),
            **state.service_env(spec.account),
            "ALNAIR_LOG_JSON": "false",
            spec.port_env: str(ports[spec.name]),
            # A leader-elected service keeps its name across restarts, as a pod's container
            # does (the pod name is its identity in the deploy): a restarted leader takes its
            # own Lease back at once instead of waiting it out.
            spec.port_env.replace("_HTTP_PORT", "_IDENTITY"): f"{IDENTITY_PREFIX}{spec.name}",
            **(spec.env(stack) if spec.env else {}),
            **opts.env.get(spec.name, {}),
        }
        # Supervised as the kubelet would: a service that exits is started again.
        supervised = [sys.executable, "-m", "alnair.dev.supervise", "--name", spec.name, "--"]
        managed = ManagedProcess(
            spec.name, [*supervised, sys.executable, "-m", *spec.argv], logs, env
        )
        managed.log_path.write_bytes(b"")  # this run's log only, so a failure's tail is its own
        managed.start()
        proc = Proc.of(managed, ports[spec.name])
        state.services[spec.name] = proc
        started.append((managed, proc))
    state.save()
    _wait_ready(started, opts.ready_timeout_s)
    for spec in specs:
        if spec.after_ready is not None:
            spec.after_ready(state.kubeconfig, envs[spec.name])


def stack_credentials() -> dict[str, Any]:
    """Fresh passwords for every NATS and Redis user of the stack, and a model key."""
    return {
        "nats": {u: new_password() for u in [*SERVICE_PERMISSIONS, NATS_ADMIN]},
        "redis": {u: new_password() for u in [*SERVICE_USERS, REDIS_ADMIN, *INFRA_USERS]},
        "model_key": secrets.token_hex(32),
        "sentinel": new_password(),
    }


def up(directory: Path, opts: UpOptions) -> State:
    """Start the stack in `directory` (or what of it died); raise StartError/ConfigError."""
    specs, _ = wanted(opts)
    state = State.load(directory)
    if state is not None:
        dead = [p.name for p in state.infra if not p.alive()]
        if dead:
            raise ConfigError(
                f"the stack in {directory} is partly down ({', '.join(dead)} not running): "
                "run `make down`, then `make up`",
                dead=dead,
            )
        gone = [s for s in specs if not (p := state.services.get(s.name)) or not p.alive()]
        if gone:
            # a restarted service keeps its port, so the URLs printed before stay right
            recorded = {n: p.port for n, p in state.services.items() if p.port}
            fresh = _ports([s for s in gone if s.name not in recorded], opts.free_ports)
            _start_services(state, gone, _check_free(recorded | fresh, gone), opts)
        return state

    ports = _ports(specs, opts.free_ports)
    directory.mkdir(parents=True, exist_ok=True)
    for sub in ("nats", "redis", "k8s", "logs"):
        (directory / sub).mkdir(exist_ok=True)
    nats_port = None if opts.free_ports or port_open(4222) else 4222
    redis_port = None if opts.free_ports or port_open(6379) else 6379
    credentials = stack_credentials()
    nats: NatsServer | NatsCluster
    redis: RedisServer | RedisFailover
    if opts.topology == "production":
        nats = NatsCluster(directory / "nats", users=credentials["nats"]).start()
        redis = RedisFailover(
            directory / "redis", users=credentials["redis"],
            sentinel_password=credentials["sentinel"],
        ).start()  # fmt: skip
        infra = [*(n.process for n in nats.servers), *redis.processes]
        redis_url, sentinels, replicas = "redis://sentinel/0", redis.sentinels, 3
    else:
        nats = NatsServer(directory / "nats", port=nats_port, users=credentials["nats"]).start()
        redis = RedisServer(directory / "redis", port=redis_port, users=credentials["redis"])
        redis.start()
        infra = [nats.process, redis.process]
        redis_url, sentinels, replicas = redis.url, None, 1
    cp = ControlPlane(directory.resolve() / "k8s")
    try:
        cp.start()
    except BaseException:
        cp.stop()
        redis.stop()
        nats.stop()
        raise
    state = State(
        directory,
        nats.url,
        redis_url,
        str(cp.kubeconfig),
        cp.server,
        [],
        [Proc.of(p) for p in (*infra, *cp.procs.values())],
        credentials=credentials,
        redis_sentinels=sentinels,
        nats_replicas=replicas,
    )
    state.save()  # from here on `make down` can clean up whatever fails next
    if opts.nodes:
        state.nodes = asyncio.run(cp.create_gpu_nodes(opts.nodes))
    if REALNODE in opts.extra:
        # GPUs the simulated agent serves by the node's labels, as on the KWOK nodes
        labels = {LABEL_GPU_MODEL: "V100M16", LABEL_GPU_COUNT: "2"}
        node = RealNode(cp, labels=labels, detached=True).start()
        state.infra += [Proc.of(p) for p in node.procs.values()]
        state.real_node = real_node_info(node)
        state.save()
    _start_services(state, specs, ports, opts)
    return state


def down(directory: Path) -> list[str]:
    """Stop every process of the stack in `directory`, services first; their names."""
    state = State.load(directory)
    if state is None:
        return []
    stopped = []
    # Services first, so they leave cleanly (the scheduler hands its Lease back), then the
    # control plane from KWOK down to etcd, then redis and nats.
    for proc in [*state.services.values(), *reversed(state.infra)]:
        if proc.alive():
            proc.stop()
            stopped.append(proc.name)
    if state.real_node is not None:
        reap_stale()  # its kubelet and containerd are stopped: its containers, mounts, bridge
    # another `down` (or the live demo's own clean-up) may have finished first
    state.path.unlink(missing_ok=True)
    (directory / "env").unlink(missing_ok=True)
    return stopped


@dataclass(frozen=True)
class Row:
    name: str
    alive: bool
    ready: bool | None
    detail: str
    url: str


def status(directory: Path) -> list[Row] | None:
    """One row per process of the stack in `directory`; None when no stack is recorded."""
    state = State.load(directory)
    if state is None:
        return None
    rows = [Row(p.name, p.alive(), None, f"pid {p.pid}", "") for p in state.infra]
    for name, p in state.services.items():
        alive = p.alive()
        ready, said = probe(p.port) if alive and p.port else (False, "")
        rows.append(Row(name, alive, ready, said if alive else f"log: {p.log}", p.url))
    return rows


# --- what a person reads -----------------------------------------------------------------


def summary(state: State, skipped: Sequence[ServiceSpec] = ()) -> str:
    width = max((len(n) for n in state.services), default=10) + 2
    apis = "\n".join(
        f"  {name + ':':{width}} {p.url}  (API docs {p.url}/docs, metrics {p.url}/metrics)"
        for name, p in state.services.items()
    )
    later = "".join(
        f"\n  {s.name + ':':{width}} not started: `python -m {s.module}` does not exist yet"
        for s in skipped
    )
    streams = f"  (streams on {state.nats_replicas} servers)" if state.nats_replicas > 1 else ""
    redis = state.redis_url
    if state.redis_sentinels:
        redis = f"the primary the Sentinels {state.redis_sentinels} name"
    return f"""Alnair is up ({state.dir.resolve()}).
Services (logs in {state.dir / "logs"}/<service>.log):
{apis}{later}
Infrastructure:
  NATS (JetStream):  {state.nats_url}{streams}
  Redis:             {redis}
  Kubernetes API:    {state.server}  ({len(state.nodes)} KWOK GPU nodes)
  control-plane logs {state.dir / "k8s" / "logs"}
Use it:
  export KUBECONFIG={state.kubeconfig}
  source {state.dir / "env"}   # KUBECONFIG, ALNAIR_* connections and ALNAIR_<SERVICE>_URL
  .venv/bin/kubectl get nodes -L alnair.io/gpu-model
`make status` says what is up; `make down` stops everything."""


def _print_status(rows: list[Row] | None, directory: Path) -> int:
    if rows is None:
        print(f"nothing is up (no stack recorded in {directory})")
        return 1
    healthy = True
    for row in rows:
        if row.ready is None:
            state = "running" if row.alive else "DEAD"
        elif not row.alive:
            state = "DEAD"
        else:
            state = "ready" if row.ready else "NOT READY"
        healthy &= row.alive and row.ready is not False
        print(f"  {row.name:24} {state:10} {row.url:24} {row.detail}")
    print("all up" if healthy else "some parts are down: `make up` restarts dead services")
    return 0 if healthy else 1


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.replace(" ", ",").split(",") if n.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.dev.devstack")
    parser.add_argument(
        "--dir", type=Path, default=None, help=f"state folder (default ${DIR_ENV} or .dev)"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start everything (or restart what died)")
    p_up.add_argument("--nodes", default=DEFAULT_NODES, help="KWOK GPU nodes to create")
    p_up.add_argument(
        "--free-ports",
        action="store_true",
        default=os.environ.get(FREE_PORTS_ENV, "") not in ("", "0", "false"),
        help=f"free ports for everything instead of the defaults (or {FREE_PORTS_ENV}=1)",
    )
    p_up.add_argument(
        "--with", dest="extra", default="", help="optional services too, e.g. deviceplugin"
    )
    p_up.add_argument(
        "--only", default=None, help="only these services, comma-separated ('' for none)"
    )
    p_up.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default=os.environ.get(TOPOLOGY_ENV) or "single",
        help=f"single NATS and Redis servers, or the production overlay's (or {TOPOLOGY_ENV})",
    )
    sub.add_parser("down", help="stop everything")
    sub.add_parser("status", help="what is up and ready")
    args = parser.parse_args(argv)
    directory: Path = args.dir or state_dir()
    try:
        if args.cmd == "down":
            stopped = down(directory)
            print(f"stopped {len(stopped)} processes" if stopped else "nothing to stop")
            return 0
        if args.cmd == "status":
            return _print_status(status(directory), directory)
        opts = UpOptions(
            nodes=args.nodes,
            free_ports=args.free_ports,
            extra=_names(args.extra),
            only=None if args.only is None else _names(args.only),
            topology=args.topology,
        )
        already = State.load(directory) is not None
        state = up(directory, opts)
        if already:
            print("already up; dead services, if any, were restarted.")
        print(summary(state, wanted(opts)[1]))
        return 0
    except AlnairError as exc:
        print(
            f"make {args.cmd}: {exc.message if isinstance(exc, StartError) else exc}",
            file=sys.stderr,
        )
        if args.cmd == "up":
            print("`make status` shows what runs; `make down` stops it.", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
