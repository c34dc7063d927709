"""Where the API server is and how to prove who we are: a kubeconfig (client certificates, a
bearer token, a `tokenFile`, or an `exec` credential plugin, as client-go reads them) or the
in-cluster service account. `KubeConfig` holds it; `alnair.common.kube.KubeClient` uses it, and
`alnair.common.kubeauth` renews the credentials that change.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alnair.common.errors import ConfigError
from alnair.common.kubeauth import (
    Authenticator,
    ExecAuth,
    ExecPlugin,
    TokenFileAuth,
    load_pem_cert_chain,
)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_NOT_WITH_EXEC = (
    "token",
    "tokenFile",
    "client-certificate",
    "client-key",
    "client-certificate-data",
    "client-key-data",
)


@dataclass(frozen=True)
class KubeConfig:
    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    insecure: bool = False
    token_file: str | None = None
    """A file holding the bearer token, re-read when it changes (wins over `token`)."""
    exec_plugin: ExecPlugin | None = None
    """A credential plugin run for a token or client certificate until it expires."""
    namespace: str = ""
    """The context's namespace (kubectl's default for `-n`); in-cluster, the pod's."""

    @classmethod
    def load(cls, path: str | None = None, context: str | None = None) -> KubeConfig:
        """From `path`, else in-cluster, else $KUBECONFIG, else ~/.kube/config; its
        `context`, else its current context."""
        in_cluster = (SA_DIR / "token").exists() and "KUBERNETES_SERVICE_HOST" in os.environ
        if path is None and context is None and in_cluster:
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            # A projected token: the kubelet replaces it before it expires.
            return cls(
                server=f"https://{host}:{port}",
                ca_file=str(SA_DIR / "ca.crt"),
                token_file=str(SA_DIR / "token"),
            )
        path = path or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read kubeconfig {path}: {exc}", path=path) from exc
        try:
            ctx_name = context or doc["current-context"]
            ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
            cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
            user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        except (KeyError, StopIteration, TypeError) as exc:
            raise ConfigError(
                f"kubeconfig {path} has no usable "
                + (f"context {context!r}" if context else "current context"),
                path=path,
            ) from exc
        base = Path(path).parent
        user = user or {}
        token_file = user.get("tokenFile")
        exec_plugin = None
        if user.get("exec") is not None:
            where = f"kubeconfig {path} user {ctx['user']!r}"
            others = [k for k in _NOT_WITH_EXEC if user.get(k)]
            if others:
                # As client-go: the plugin's credential would silently compete with these.
                raise ConfigError(
                    f"{where} sets exec together with {', '.join(others)}; keep one",
                    path=path,
                    field="exec",
                )
            exec_plugin = ExecPlugin.from_kubeconfig(user["exec"], cluster, base=base, where=where)
        return cls(
            server=cluster["server"].rstrip("/"),
            ca_file=_file_or_data(cluster, "certificate-authority", base),
            cert_file=_file_or_data(user, "client-certificate", base),
            key_file=_file_or_data(user, "client-key", base),
            token=user.get("token"),
            insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
            token_file=str(base / token_file) if token_file else None,
            exec_plugin=exec_plugin,
            namespace=str(ctx.get("namespace") or ""),
        )

    def ssl_context(
        self, cert_pem: bytes | None = None, key_pem: bytes | None = None
    ) -> ssl.SSLContext | bool:
        """TLS for the API server; `cert_pem`/`key_pem`: a client certificate held in memory."""
        if self.insecure and cert_pem is None:
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_pem is not None and key_pem is not None:
            load_pem_cert_chain(ctx, cert_pem, key_pem)
        elif self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def _plugin_tls(self, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
        ctx = self.ssl_context(cert_pem, key_pem)
        assert isinstance(ctx, ssl.SSLContext)  # with a certificate it is always a context
        return ctx

    def authenticator(self, token_recheck_s: float = 60.0) -> Authenticator | None:
        """What renews this config's credentials; None when they are static."""
        if self.exec_plugin is not None:
            return ExecAuth(self.exec_plugin, self._plugin_tls)
        if self.token_file is not None:
            return TokenFileAuth(self.token_file, recheck_s=token_recheck_s)
        return None


def _file_or_data(section: Mapping[str, Any], key: str, base: Path) -> str | None:
    if key in section:
        p = Path(section[key])
        return str(p if p.is_absolute() else base / p)
    data = section.get(f"{key}-data")
    if data is None:
        return None
    fd, name = tempfile.mkstemp(prefix="alnair-kube-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return name
