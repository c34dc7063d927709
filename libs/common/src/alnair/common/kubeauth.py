"""Kubernetes credentials that change while a client runs: exec plugins and token files.

Real clusters rarely hand out a static token. Managed clusters (EKS, GKE, AKS, OIDC setups)
put an `exec` credential plugin in the kubeconfig; pods get a projected service-account token
that the kubelet rotates in place; some setups point `tokenFile` at a file another process
refreshes. `alnair.common.kube.KubeClient` asks an `Authenticator` for the `Credential` to send
with each request and tells it when the API server answered 401 to one, so it can renew once.

The hot path stays cheap: a static token or client certificate needs no authenticator at all
(the header lives in the session's defaults); an exec credential is a cached object and a clock
comparison until it expires; a token file is `stat`ed at most every `recheck_s` seconds, at
request time, instead of by a polling task. The plugin protocol is the one client-go speaks
(`client.authentication.k8s.io/v1` and `v1beta1` ExecCredential): the plugin gets
KUBERNETES_EXEC_INFO, prints an ExecCredential, and its `status.token` or
`clientCertificateData`/`clientKeyData` is used until `expirationTimestamp`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from alnair.common.errors import ConfigError

log = logging.getLogger(__name__)

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_CLUSTER_EXTENSION = "client.authentication.k8s.io/exec"
_EXCERPT = 400


@dataclass(frozen=True, eq=False)
class Credential:
    """What one request presents: extra headers, and a TLS context holding a client cert."""

    headers: Mapping[str, str]
    ssl: ssl.SSLContext | None = None
    expires_at: float | None = None
    """Unix seconds after which the credential must not be used; None: until rejected."""


class Authenticator(Protocol):
    async def credential(self) -> Credential:
        """The credential for the next request (cached; renewed when due)."""
        ...

    async def renew(self, rejected: Credential) -> bool:
        """The API server answered 401 to `rejected`; True when a retry may succeed."""
        ...


def _excerpt(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= _EXCERPT else "..." + text[-_EXCERPT:]


# --- exec plugins -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig user's `exec` section, checked and with its paths resolved."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    provide_cluster_info: bool = False
    cluster: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The ExecCredential `spec.cluster` sent when provide_cluster_info is set."""
    install_hint: str = ""
    timeout_s: float = 60.0

    @classmethod
    def from_kubeconfig(
        cls, section: Any, cluster: Mapping[str, Any], *, base: Path, where: str
    ) -> ExecPlugin:
        """Parse `users[].user.exec`; every bad field is named in one ConfigError."""
        if not isinstance(section, Mapping):
            raise ConfigError(f"{where}: exec must be a mapping, not {section!r}", field="exec")
        problems: list[str] = []
        command = section.get("command")
        if not isinstance(command, str) or not command.strip():
            problems.append(f"exec.command={command!r} must be a non-empty string")
            command = ""
        elif os.sep in command and not Path(command).is_absolute():
            # As kubectl does: a relative path is relative to the kubeconfig, a bare name is
            # looked up on PATH.
            command = str(base / command)
        args = section.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            problems.append(f"exec.args={args!r} must be a list of strings")
            args = []
        env: list[tuple[str, str]] = []
        for i, item in enumerate(section.get("env") or []):
            if (
                not isinstance(item, Mapping)
                or not isinstance(item.get("name"), str)
                or not isinstance(item.get("value"), str)
            ):
                problems.append(f"exec.env[{i}]={item!r} must be {{name: str, value: str}}")
            else:
                env.append((item["name"], item["value"]))
        api_version = section.get("apiVersion")
        if api_version not in EXEC_API_VERSIONS:
            problems.append(
                f"exec.apiVersion={api_version!r} must be one of {', '.join(EXEC_API_VERSIONS)}"
            )
        provide = section.get("provideClusterInfo", False)
        if not isinstance(provide, bool):
            problems.append(f"exec.provideClusterInfo={provide!r} must be true or false")
        mode = section.get("interactiveMode", "IfAvailable")
        if mode == "Always":
            problems.append("exec.interactiveMode='Always' needs a terminal; a service has none")
        elif mode not in {"IfAvailable", "Never"}:
            problems.append(f"exec.interactiveMode={mode!r} must be Never or IfAvailable")
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems), field="exec")
        return cls(
            command=command,
            args=tuple(args),
            env=tuple(env),
            api_version=str(api_version),
            provide_cluster_info=bool(provide),
            cluster=_exec_cluster(cluster, base) if provide else {},
            install_hint=str(section.get("installHint") or ""),
        )

    def exec_info(self) -> str:
        """KUBERNETES_EXEC_INFO: the ExecCredential the plugin reads its request from."""
        spec: dict[str, Any] = {"interactive": False}
        if self.provide_cluster_info:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})


def _exec_cluster(cluster: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The ExecCredential's view of a kubeconfig cluster (CA as base64 data, as client-go)."""
    out: dict[str, Any] = {"server": str(cluster.get("server", ""))}
    ca_data = cluster.get("certificate-authority-data")
    if ca_data is None and cluster.get("certificate-authority"):
        ca = Path(str(cluster["certificate-authority"]))
        try:
            ca_data = base64.b64encode((ca if ca.is_absolute() else base / ca).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read certificate-authority {ca}: {exc}") from exc
        ca_data = ca_data.decode()
    if ca_data:
        out["certificate-authority-data"] = ca_data
    for key in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url"):
        if key in cluster:
            out[key] = cluster[key]
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, Mapping) and ext.get("name") == EXEC_CLUSTER_EXTENSION:
            out["config"] = ext.get("extension")
    return out


TlsFactory = Callable[[bytes, bytes], ssl.SSLContext]
"""Builds the client's TLS context around a client certificate and key (PEM)."""


def parse_exec_credential(
    output: bytes, plugin: ExecPlugin, tls: TlsFactory | None = None
) -> Credential:
    """The Credential in a plugin's stdout, or a ConfigError naming what is wrong with it."""
    where = f"exec plugin {plugin.command!r}"
    try:
        doc = json.loads(output)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        # The output may hold a secret: name the position, never echo it.
        raise ConfigError(
            f"{where} printed no valid ExecCredential JSON ({exc}; {len(output)} bytes)",
            command=plugin.command,
        ) from exc
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} printed JSON that is not an object", command=plugin.command)
    if doc.get("kind") != "ExecCredential":
        problems.append(f"kind={doc.get('kind')!r} is not 'ExecCredential'")
    if doc.get("apiVersion") != plugin.api_version:
        problems.append(
            f"apiVersion={doc.get('apiVersion')!r} differs from the kubeconfig's "
            f"{plugin.api_version!r}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        problems.append("status is missing")
        status = {}
    token = status.get("token")
    cert = status.get("clientCertificateData")
    key = status.get("clientKeyData")
    for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData", key)):
        if value is not None and not isinstance(value, str):
            problems.append(f"status.{name} is not a string")
    if bool(cert) != bool(key):
        problems.append("status.clientCertificateData and status.clientKeyData come together")
    if status and not token and not cert:
        problems.append("status has neither token nor clientCertificateData")
    expires_at: float | None = None
    stamp = status.get("expirationTimestamp")
    if stamp is not None:
        try:
            parsed = datetime.fromisoformat(str(stamp))
            if parsed.tzinfo is None:
                raise ValueError("no time zone")
            expires_at = parsed.timestamp()
        except ValueError:
            problems.append(f"status.expirationTimestamp={stamp!r} is not an RFC 3339 time")
    if problems:
        raise ConfigError(f"{where} returned a bad ExecCredential: " + "; ".join(problems))
    context: ssl.SSLContext | None = None
    if cert and key:
        if tls is None:
            raise ConfigError(f"{where} returned a client certificate this client cannot use")
        try:
            context = tls(str(cert).encode(), str(key).encode())
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"{where} returned an unusable client certificate: {exc}", command=plugin.command
            ) from exc
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Credential(headers=headers, ssl=context, expires_at=expires_at)


class ExecAuth:
    """Runs an exec plugin when no unexpired credential is cached, one run at a time."""

    def __init__(
        self,
        plugin: ExecPlugin,
        tls: TlsFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plugin = plugin
        self._tls = tls
        self._clock = clock
        self._cached: Credential | None = None
        self._lock = asyncio.Lock()
        self.runs = 0

    def _fresh(self, cred: Credential | None) -> bool:
        return cred is not None and (cred.expires_at is None or self._clock() < cred.expires_at)

    async def credential(self) -> Credential:
        cred = self._cached
        if cred is not None and self._fresh(cred):
            return cred
        async with self._lock:
            # Requests that queued behind a run use its result instead of running again.
            cred = self._cached
            if cred is None or not self._fresh(cred):
                cred = self._cached = await self._run()
            return cred

    async def renew(self, rejected: Credential) -> bool:
        if self._cached is rejected:
            self._cached = None
        return True

    async def _run(self) -> Credential:
        plugin = self.plugin
        where = f"exec plugin {plugin.command!r}"
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": plugin.exec_info()}
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                plugin.command,
                *plugin.args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            hint = f" ({plugin.install_hint.strip()})" if plugin.install_hint.strip() else ""
            raise ConfigError(
                f"{where} could not be started: {exc}{hint}", command=plugin.command
            ) from exc
        try:
            async with asyncio.timeout(plugin.timeout_s):
                out, err = await proc.communicate()
        except TimeoutError as exc:
            raise ConfigError(
                f"{where} gave no credential within {plugin.timeout_s:g}s", command=plugin.command
            ) from exc
        finally:
            if proc.returncode is None:  # timed out or cancelled: leave no plugin behind
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise ConfigError(
                f"{where} exited with status {proc.returncode}: {_excerpt(err) or '(no stderr)'}",
                command=plugin.command,
                exit_code=proc.returncode,
            )
        if err.strip():
            log.info(
                "exec plugin stderr", extra={"command": plugin.command, "stderr": _excerpt(err)}
            )
        return parse_exec_credential(out, plugin, self._tls)


def load_pem_cert_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` from memory (Python's ssl reads files only): a private temp dir."""
    with tempfile.TemporaryDirectory(prefix="alnair-kube-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        context.load_cert_chain(str(cert), str(key))


# --- token files --------------------------------------------------------------------------


class TokenFileAuth:
    """A bearer token read from a file that may be replaced (projected SA tokens, tokenFile).

    The file is `stat`ed at request time once `recheck_s` has passed since the last look and
    re-read when its identity (inode, size, mtime) changed; a 401 re-reads it at once. The
    kubelet swaps a projected token in well before the old one expires, so a minute's delay is
    harmless.
    """

    def __init__(
        self,
        path: str | Path,
        recheck_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._clock = clock
        stamp, token = self._read()
        if token is None:
            raise ConfigError(f"token file {self.path} is empty", path=str(self.path))
        self._stamp = stamp
        self._cred = Credential({"Authorization": f"Bearer {token}"})
        self._next_check = clock() + recheck_s
        self.reads = 1

    def _read(self) -> tuple[tuple[int, ...], str | None]:
        try:
            st = self.path.stat()
            token = self.path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read token file {self.path}: {exc}", path=str(self.path)
            ) from exc
        return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns), token or None

    def _reload(self, *, force: bool) -> None:
        self._next_check = self._clock() + self.recheck_s
        try:
            if not force:
                st = self.path.stat()
                if (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns) == self._stamp:
                    return
            stamp, token = self._read()
        except (OSError, ConfigError) as exc:
            # Mid-swap or briefly missing: keep the last good token, look again later.
            log.warning("token file unreadable", extra={"path": str(self.path), "error": str(exc)})
            return
        self.reads += 1
        self._stamp = stamp
        if token is not None and self._cred.headers["Authorization"] != f"Bearer {token}":
            self._cred = Credential({"Authorization": f"Bearer {token}"})

    async def credential(self) -> Credential:
        if self._clock() >= self._next_check:
            self._reload(force=False)
        return self._cred

    async def renew(self, rejected: Credential) -> bool:
        if self._cred is rejected:
            self._reload(force=True)
        return self._cred is not rejected
