"""Child processes with readiness checks, plus the nats and redis servers built on them."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from alnair.common.errors import ConfigError, TemporaryError
from alnair.common.natsauth import NatsCredentials, server_config
from alnair.common.redisauth import REPLICATION_USER, SENTINEL_USER, acl_file
from alnair.common.tls import CA_FILE, CERT_FILE, KEY_FILE, issue, write_folder

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 20_000
"""Picked ports lie between this and the kernel's ephemeral range (clear of 4222, 6379,
808x and 9443, the stack's fixed ports)."""
_picked: set[int] = set()
_random = random.SystemRandom()


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    return 32_768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port free right now, below the kernel's ephemeral range: a port the kernel may
    hand to an outgoing connection (an API server's to etcd, started after the pick) could
    be taken before the server it was picked for binds it (seen: a service of `make up` that
    could not bind its port). Never the same port twice in one process."""
    high = _ephemeral_low() - 1
    if high > LOWEST_PICKED:
        for _ in range(200):
            port = _random.randint(LOWEST_PICKED, high)
            if port not in _picked and _bindable(port):
                _picked.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        picked: int = s.getsockname()[1]
        return picked


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def find_binary(name: str, env_var: str | None = None) -> str:
    """`name` from $env_var, the running virtualenv's bin/, or PATH."""
    if env_var and os.environ.get(env_var):
        return os.environ[env_var]
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"{name} not found: run `make setup` (or set {env_var})", binary=name)
    return found


class ManagedProcess:
    """A child process whose output goes to a log file, stopped with SIGTERM then SIGKILL.

    With `restarts` above zero the process is supervised as systemd would a kubelet: when it
    exits without `stop()` it is started again (at most `restarts` times per `start()`), and
    the exit is written to its log. KWOK v0.8.0 needs this: its node and pod workers build
    their stages' CEL environments lazily and unlocked, and when both start on a cluster that
    already holds nodes and pods (a control plane started again on its etcd) the race can
    panic the process. It holds no state, so starting it again is all a crash costs."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        *,
        restarts: int = 0,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = restarts
        self.restarted = 0
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> None:
        with self._lock:
            self._stopping = False
            self.restarted = 0
            proc = self._spawn()
        if self.restarts > 0:
            threading.Thread(
                target=self._supervise, args=(proc,), name=f"{self.name}-supervisor", daemon=True
            ).start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(self.env or {})},
            start_new_session=True,
        )
        log.close()
        return self.proc

    def _supervise(self, proc: subprocess.Popen[bytes]) -> None:
        while True:
            code = proc.wait()
            time.sleep(0.2)  # a process that dies at once is not restarted in a tight loop
            with self._lock:
                if self._stopping or proc is not self.proc:
                    return
                if self.restarted >= self.restarts:
                    self._note(f"{self.name} exited with {code}; not restarted again")
                    return
                self.restarted += 1
                self._note(f"{self.name} exited with {code}; restart {self.restarted}")
                proc = self._spawn()

    def _note(self, line: str) -> None:
        with self.log_path.open("a") as log:
            log.write(f"[localstack] {line}\n")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise TemporaryError(
                    f"{self.name} exited during start-up: {self.tail()}", name=self.name
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.05)
        raise TemporaryError(
            f"{self.name} not ready after {timeout_s}s: {self.tail()}", name=self.name
        )

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the process group (a lost node: no goodbye to peers or clients) and wait."""
        with self._lock:
            self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout_s)


class NatsServer:
    """nats-server with JetStream on a free port; `restart()` keeps the port and the store.

    With `users` (service name -> password, see `alnair.common.natsauth`) the server starts
    from a configuration that lets only those users in, each limited to its service's
    subjects; `credentials(user)` is what that service then presents.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        users: Mapping[str, str] | None = None,
        callout_issuer: str | None = None,
        *,
        server_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[int] = (),
        tls: bool = False,
        tls_hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    ) -> None:
        # Absolute: the server runs with this folder as its working directory, so a relative
        # path handed to it (store, config, ACL file) would be resolved twice.
        self.workdir = (workdir or Path(tempfile.mkdtemp(prefix="alnair-nats-"))).resolve()
        self.port = port or free_port()
        self.store = self.workdir / "jetstream"
        self.users = dict(users or {})
        self.callout_issuer = callout_issuer
        self.server_name = server_name
        self.cluster_port = cluster_port
        self.routes = list(routes)
        self.monitor_port = free_port() if cluster_port else None
        self.tls = tls
        self.tls_hosts = tuple(tls_hosts)
        self._proc: ManagedProcess | None = None

    @property
    def ca_file(self) -> Path:
        """The CA that signed the server's certificate (with `tls`): what clients verify with
        (`ALNAIR_NATS_TLS_CA`)."""
        return self.workdir / "tls" / CA_FILE

    def _tls_files(self) -> tuple[Path, Path]:
        """A serving certificate for loopback, issued once (a restart keeps it)."""
        folder = self.workdir / "tls"
        if not (folder / CERT_FILE).exists():
            write_folder(folder, issue(self.tls_hosts).secret_data())
        return folder / CERT_FILE, folder / KEY_FILE

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def jetstream_healthy(self) -> bool:
        """The server's own health check: JetStream up and, in a cluster, in contact with a
        meta leader (only a clustered server has a monitoring port here)."""
        if self.monitor_port is None:
            return port_open(self.port)
        url = f"http://127.0.0.1:{self.monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def credentials(self, user: str) -> NatsCredentials:
        """The user and password `user` connects with (a user the server was started with)."""
        if user not in self.users:
            raise ConfigError(f"nats-server has no user {user!r}", user=user)
        return NatsCredentials(user=user, password=self.users[user])

    def start(self) -> NatsServer:
        self.start_process()
        self.process.wait_ready(self.jetstream_healthy, 30)
        return self

    def start_process(self) -> None:
        """Start the server without waiting for it (a cluster starts every member first:
        none is healthy before a meta leader is elected among them)."""
        argv = [
            find_binary("nats-server", "ALNAIR_NATS_SERVER"),
            "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store),
        ]  # fmt: skip
        if self.cluster_port is not None:
            assert self.server_name is not None
            assert self.monitor_port is not None
            argv += [
                "-n", self.server_name, "--cluster_name", "alnair",
                "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes),
                "-m", str(self.monitor_port),
            ]  # fmt: skip
        if self.tls:
            # Every client must speak TLS (nats-server refuses a plain one) and verify it.
            cert, key = self._tls_files()
            argv += ["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
        if self.users:
            conf = self.workdir / "nats.conf"
            conf.write_text(server_config(self.users, callout_issuer=self.callout_issuer))
            conf.chmod(0o600)
            argv += ["-c", str(conf)]
        self._proc = ManagedProcess(self.server_name or "nats-server", argv, self.workdir)
        self._proc.start()

    @property
    def process(self) -> ManagedProcess:
        """The running server process (after `start()`)."""
        if self._proc is None:
            raise RuntimeError("nats-server not started")
        return self._proc

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()

    def restart(self) -> None:
        self.stop()
        self.start()


class NatsCluster:
    """Three (or `size`) nats-servers in one JetStream cluster on loopback, as the production
    overlay runs them: clients take `url` (every server, comma-separated) and streams made
    with `replicas` 3 survive one server's loss. `kill(i)` takes server i down as a lost node
    would; `start_server(i)` brings it back on its port and store."""

    def __init__(
        self, workdir: Path, size: int = 3, users: Mapping[str, str] | None = None
    ) -> None:
        ports = [free_port() for _ in range(size)]
        self.servers = [
            NatsServer(
                workdir / f"nats-{i}",
                users=users,
                server_name=f"nats-{i}",
                cluster_port=port,
                routes=[p for p in ports if p != port],
            )
            for i, port in enumerate(ports)
        ]
        for srv in self.servers:
            srv.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return ",".join(srv.url for srv in self.servers)

    def credentials(self, user: str) -> NatsCredentials:
        return self.servers[0].credentials(user)

    def start(self, timeout_s: float = 60.0) -> NatsCluster:
        for srv in self.servers:
            srv.start_process()
        for srv in self.servers:
            srv.process.wait_ready(srv.jetstream_healthy, timeout_s)
        return self

    def kill(self, i: int) -> None:
        """SIGKILL server i: no goodbye to its peers or clients (a node lost)."""
        self.servers[i].process.kill()

    def start_server(self, i: int, timeout_s: float = 60.0) -> None:
        srv = self.servers[i]
        srv.start_process()
        srv.process.wait_ready(srv.jetstream_healthy, timeout_s)

    def stop(self) -> None:
        for srv in self.servers:
            srv.stop()


class RedisServer:
    """redis-server on a free port with an append-only file in its own directory.

    With `users` (service name -> password, see `alnair.common.redisauth`) it starts with an
    ACL file: only those users get in, each limited to its service's keys and commands.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        users: Mapping[str, str] | None = None,
        *,
        replica_of: RedisServer | None = None,
        name: str = "redis-server",
    ) -> None:
        self.workdir = (workdir or Path(tempfile.mkdtemp(prefix="alnair-redis-"))).resolve()
        self.port = port or free_port()
        self.users = dict(users or {})
        self.replica_of = replica_of
        self.name = name
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def credentials(self, user: str) -> dict[str, str]:
        """`username`/`password` keyword arguments for `redis.asyncio.from_url`."""
        if user not in self.users:
            raise ConfigError(f"redis-server has no user {user!r}", user=user)
        return {"username": user, "password": self.users[user]}

    def start(self) -> RedisServer:
        binary = find_binary("redis-server", "ALNAIR_REDIS_SERVER")
        argv = [
            binary,
            "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.workdir),
            "--appendonly", "yes", "--save", "", "--protected-mode", "no",
        ]  # fmt: skip
        if self.users:
            acl = self.workdir / "users.acl"
            acl.write_text(acl_file(self.users, redis_major=_redis_major(binary)))
            acl.chmod(0o600)
            argv += ["--aclfile", str(acl)]
        if REPLICATION_USER in self.users:
            # Every server of a replicated set: any of them may be made a replica later.
            argv += ["--masteruser", REPLICATION_USER,
                     "--masterauth", self.users[REPLICATION_USER]]  # fmt: skip
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        self._proc = ManagedProcess(self.name, argv, self.workdir)
        self._proc.start()
        self._proc.wait_ready(lambda: port_open(self.port), 30)
        return self

    @property
    def process(self) -> ManagedProcess:
        """The running server process (after `start()`)."""
        if self._proc is None:
            raise RuntimeError("redis-server not started")
        return self._proc

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()


class RedisFailover:
    """A Redis primary, one replica and three Sentinels on loopback, as the production
    overlay runs them: services take `sentinels` (ALNAIR_REDIS_SENTINELS) and follow a
    failover; `kill_primary()` takes the current primary down as a lost node would.

    With `users` the servers share one ACL file, which must hold `REPLICATION_USER` and
    `SENTINEL_USER` (what the replica and the Sentinels authenticate as). With
    `sentinel_password` the Sentinels answer only clients (and each other) that present it."""

    MASTER = "alnair"

    def __init__(
        self,
        workdir: Path,
        users: Mapping[str, str] | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.users = dict(users or {})
        self.sentinel_password = sentinel_password
        if self.users and not {REPLICATION_USER, SENTINEL_USER} <= set(self.users):
            raise ConfigError(
                f"a replicated Redis with users needs {REPLICATION_USER} and {SENTINEL_USER}"
            )
        primary = RedisServer(workdir / "redis-0", users=self.users, name="redis-0")
        replica = RedisServer(
            workdir / "redis-1", users=self.users, replica_of=primary, name="redis-1"
        )
        self.servers = [primary, replica]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.workdir = workdir
        self._sentinels: list[ManagedProcess] = []
        for srv in self.servers:
            srv.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def _sentinel_conf(self, port: int) -> str:
        primary = self.servers[0].port
        lines = [
            f"port {port}", "bind 127.0.0.1", "protected-mode no",
            f"sentinel monitor {self.MASTER} 127.0.0.1 {primary} 2",
            f"sentinel down-after-milliseconds {self.MASTER} 1000",
            f"sentinel failover-timeout {self.MASTER} 5000",
            f"sentinel parallel-syncs {self.MASTER} 1",
        ]  # fmt: skip
        if self.users:
            lines += [
                f"sentinel auth-user {self.MASTER} {SENTINEL_USER}",
                f"sentinel auth-pass {self.MASTER} {self.users[SENTINEL_USER]}",
            ]
        if self.sentinel_password:
            lines += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
        return "\n".join(lines) + "\n"

    def _ask(self, port: int, *command: str) -> object:
        import redis  # (a dev dependency of every test; the stack's servers need none)

        with redis.Redis(port=port, socket_timeout=2, password=self.sentinel_password) as r:
            return r.execute_command(*command)

    def start(self, timeout_s: float = 60.0) -> RedisFailover:
        for srv in self.servers:
            srv.start()
        binary = find_binary("redis-server", "ALNAIR_REDIS_SERVER")
        for i, port in enumerate(self.sentinel_ports):
            folder = self.workdir / f"sentinel-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"  # (the Sentinel rewrites it: its own copy)
            conf.write_text(self._sentinel_conf(port))
            conf.chmod(0o600)
            proc = ManagedProcess(f"sentinel-{i}", [binary, str(conf), "--sentinel"], folder)
            proc.start()
            self._sentinels.append(proc)

        def agreed(port: int) -> bool:
            replicas = self._ask(port, "SENTINEL", "REPLICAS", self.MASTER)
            peers = self._ask(port, "SENTINEL", "SENTINELS", self.MASTER)
            return bool(replicas) and isinstance(peers, list) and len(peers) == 2

        for proc, port in zip(self._sentinels, self.sentinel_ports, strict=True):
            proc.wait_ready(lambda p=port: agreed(p), timeout_s)  # type: ignore[misc]
        return self

    def primary(self) -> RedisServer:
        """The server the Sentinels name as primary now."""
        host_port = self._ask(self.sentinel_ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                              self.MASTER)  # fmt: skip
        assert isinstance(host_port, list)
        port = int(host_port[1])
        return next(srv for srv in self.servers if srv.port == port)

    @property
    def processes(self) -> list[ManagedProcess]:
        """The servers' and the Sentinels' processes (after `start()`)."""
        return [*(srv.process for srv in self.servers), *self._sentinels]

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary; the server killed."""
        srv = self.primary()
        srv.process.kill()
        return srv

    def stop(self) -> None:
        for proc in self._sentinels:
            proc.stop()
        for srv in self.servers:
            srv.stop()


def _redis_major(binary: str) -> int:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    version = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "0")
    return int(version.split(".", 1)[0])
