"""A service's read API served as a Kubernetes aggregated API (an `APIService`).

Users reach it through the API server (`kubectl get --raw /apis/<group>/<version>/...`,
`kubectl alnair`), with their own identity and ordinary RBAC, as they reach metrics-server:

1. The API server authenticates the user and authorizes the request against the aggregated
   resource (`list workloads.dispatcher.query.alnair.io` in a namespace) before it proxies.
2. It then calls the service over TLS, presenting its front-proxy client certificate, with
   who the user is in request headers (`X-Remote-User`, `X-Remote-Group`,
   `X-Remote-Extra-*`; the header names are the API server's `--requestheader-*` flags).
3. The service trusts those headers only from a client certificate that chains to the
   front proxy's CA and whose common name the API server allows
   (`kube-system/extension-apiserver-authentication`, the ConfigMap the API server publishes
   for exactly this, readable with the `extension-apiserver-authentication-reader` Role).
   Headers from any other caller are ignored: a caller without that certificate may present
   a bearer token instead, reviewed as everywhere else (`httpauth`).
4. The service authorizes the identity itself with a SubjectAccessReview for the same
   resource attributes, so the API is as closed when reached directly as through the API
   server, and a cluster whose authorizer is not RBAC decides the same way.

Errors under `/apis/` are Kubernetes `Status` objects (kubectl prints their message), not
problem responses: this part of the service is a Kubernetes API.

The client certificate reaches the application through the ASGI TLS extension
(`scope["extensions"]["tls"]["client_cert_chain"]`), which `ClientCertH11` adds to uvicorn's
h11 protocol; OpenSSL has verified the chain during the handshake (`require_client_ca`), and
`FrontProxy.identity` checks it again against the CA the ConfigMap holds now, so a rotated CA
stops being trusted without a restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from alnair.common.http import bound_port, start_http, stop_http
from alnair.common.httpauth import Access, Identity, TokenReviewer
from alnair.common.informer import Informer
from alnair.common.kube import CONFIGMAPS, KubeClient, Obj, Unavailable
from alnair.common.settings import ServiceSettings
from alnair.common.tasks import spawn
from alnair.common.tls import CertReloader

log = logging.getLogger(__name__)

DISPATCHER_GROUP = "dispatcher.query.alnair.io"
"""The dispatcher's aggregated API group (queues, queued workloads, why one waits)."""
SCHEDULER_GROUP = "scheduler.query.alnair.io"
"""The scheduler's aggregated API group (GPUs and their holders, pod metrics, why a pod waits)."""
QUERY_VERSION = "v1alpha1"
"""The version every Alnair query API serves."""

AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
"""Where the API server publishes its front proxy's CA and header names."""


def status(code: int, reason: str, message: str) -> JSONResponse:
    """A Kubernetes `Status` failure, as the API server answers one."""
    return JSONResponse(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status_code=code,
    )


def _json_list(raw: str | None) -> tuple[str, ...]:
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True)
class FrontProxy:
    """What the API server's front proxy presents: its CA, the client names it allows, and
    the headers that carry the user (the ConfigMap's `requestheader-*` keys)."""

    cas: tuple[x509.Certificate, ...]
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)
    ca_pem: str = ""

    @classmethod
    def from_configmap(cls, cm: Obj) -> FrontProxy | None:
        """The front proxy a ConfigMap describes (None: the API server has none configured,
        so no request through it can be authenticated)."""
        data = cm.get("data") or {}
        pem = data.get("requestheader-client-ca-file") or ""
        if not pem.strip():
            return None
        cas = tuple(x509.load_pem_x509_certificates(pem.encode()))
        return cls(
            cas=cas,
            allowed_names=frozenset(_json_list(data.get("requestheader-allowed-names"))),
            username_headers=_json_list(data.get("requestheader-username-headers"))
            or ("X-Remote-User",),
            uid_headers=_json_list(data.get("requestheader-uid-headers")),
            group_headers=_json_list(data.get("requestheader-group-headers"))
            or ("X-Remote-Group",),
            extra_prefixes=_json_list(data.get("requestheader-extra-headers-prefix"))
            or ("X-Remote-Extra-",),
            ca_pem=pem,
        )

    def verified(self, leaf_pem: str, now: dt.datetime | None = None) -> str:
        """'' when `leaf_pem` is a client certificate of the front proxy: issued by one of its
        CAs, valid now, a name the API server allows (any, when it names none); else why not."""
        try:
            cert = x509.load_pem_x509_certificate(leaf_pem.encode())
        except ValueError as exc:
            return f"unreadable client certificate: {exc}"
        when = now or dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= when <= cert.not_valid_after_utc:
            return "client certificate not valid now"
        for ca in self.cas:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            break
        else:
            return "client certificate not issued by the front proxy's CA"
        names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        if self.allowed_names and not self.allowed_names.intersection(names):
            return f"client certificate name {names} is not one the API server allows"
        return ""

    def identity(self, headers: Mapping[str, str]) -> Identity | None:
        """The user the front proxy names in `headers` (None: it names none)."""
        user = next((headers[h] for h in self.username_headers if headers.get(h)), "")
        if not user:
            return None
        uid = next((headers[h] for h in self.uid_headers if headers.get(h)), "")
        lowered = {h.lower() for h in self.group_headers}
        groups: list[str] = []
        for key, value in headers.items():
            if key.lower() in lowered:
                groups.extend(g.strip() for g in value.split(",") if g.strip())
        return Identity(username=user, uid=uid, groups=tuple(groups))


class FrontProxyWatch:
    """The API server's front-proxy settings, followed by a watch on their ConfigMap."""

    def __init__(self, kube: KubeClient, context: ssl.SSLContext | None = None) -> None:
        namespace, name = AUTH_CONFIGMAP
        self.context = context
        self.informer = Informer(
            kube, CONFIGMAPS, namespace=namespace, field_selector=f"metadata.name={name}",
            name="front-proxy",
        )  # fmt: skip
        self.informer.add_handler(self._changed)
        self.current: FrontProxy | None = None

    def _changed(self, _event: Any, obj: Obj, _old: Obj | None) -> None:
        try:
            proxy = FrontProxy.from_configmap(obj)
        except ValueError as exc:
            log.error("front proxy CA unreadable; requests through the API server are refused",
                      extra={"error": str(exc)})  # fmt: skip
            proxy = None
        changed = proxy is not None and (self.current is None or proxy.cas != self.current.cas)
        self.current = proxy
        if changed and proxy is not None:
            log.info("front proxy CA loaded", extra={"cas": len(proxy.cas)})
            if self.context is not None:
                # TLS clients are asked for a certificate (optional: a caller with a bearer
                # token sends none), and OpenSSL refuses one no trusted CA issued. A CA
                # rotated out stays loaded in OpenSSL until a restart, but `verified` no
                # longer accepts its certificates.
                self.context.verify_mode = ssl.CERT_OPTIONAL
                self.context.load_verify_locations(cadata=proxy.ca_pem)


class ClientCertH11(H11Protocol):
    """uvicorn's h11 protocol, giving the application the TLS client certificate (the ASGI
    TLS extension, `scope["extensions"]["tls"]["client_cert_chain"]`: PEM, leaf first)."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        inner = self.app

        async def with_tls(scope: Any, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["tls"] = {"client_cert_chain": chain}
            await inner(scope, receive, send)

        self.app = with_tls


@dataclass(frozen=True)
class Resource:
    """One resource of an aggregated group version, as discovery lists it."""

    name: str
    namespaced: bool
    kind: str
    verbs: tuple[str, ...] = ("get", "list")

    def discovery(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "singularName": "",
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }


@dataclass(frozen=True)
class GroupVersion:
    """An aggregated API: its group, version and resources."""

    group: str
    version: str
    resources: Sequence[Resource] = field(default_factory=tuple)

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}"

    @property
    def api_service(self) -> str:
        return f"{self.version}.{self.group}"

    def access(self, verb: str, path: str) -> Access | None:
        """The resource attributes a request path amounts to, as the API server's request
        info reads them (None: not a resource path of this group version)."""
        if not path.startswith(self.prefix + "/"):
            return None
        parts = path[len(self.prefix) + 1 :].strip("/").split("/")
        namespace = ""
        if len(parts) >= 2 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if not parts or not parts[0]:
            return None
        resource, name = parts[0], parts[1] if len(parts) > 1 else ""
        subresource = parts[2] if len(parts) > 2 else ""
        kube_verb = {"GET": "get", "HEAD": "get"}.get(verb.upper(), verb.lower())
        if kube_verb == "get" and not name:
            kube_verb = "list"
        return Access(kube_verb, self.group, resource, namespace, name, subresource)


def install_aggregated(
    app: FastAPI,
    api: GroupVersion,
    *,
    front: FrontProxyWatch | None,
    reviewer: TokenReviewer | None,
    service: str,
) -> None:
    """Discovery for `api` and the authentication and authorization of every request under
    its prefix (see the module). With neither a front proxy nor a reviewer nothing under the
    prefix is served: an aggregated API is never open."""

    @app.get("/apis/" + api.group + "/" + api.version)
    async def discovery() -> dict[str, Any]:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{api.group}/{api.version}",
            "resources": [r.discovery() for r in api.resources],
        }

    @app.get("/apis/" + api.group)
    async def group() -> dict[str, Any]:
        version = {"groupVersion": f"{api.group}/{api.version}", "version": api.version}
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": api.group,
            "versions": [version],
            "preferredVersion": version,
        }

    @app.middleware("http")
    async def _authorize(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        access = api.access(request.method, request.url.path)
        if access is None:
            return await call_next(request)
        try:
            identity, refusal = await _who(request, front, reviewer)
        except Unavailable as exc:
            # As httpauth answers it: the caller may retry; nobody was refused.
            log.warning("token review failed", extra={"service": service, "error": str(exc)})
            return status(503, "ServiceUnavailable", "cannot verify the token right now")
        if identity is None:
            return status(401, "Unauthorized", refusal)
        assert reviewer is not None or front is not None
        if reviewer is None:
            return status(503, "ServiceUnavailable", f"{service} cannot authorize requests")
        try:
            allowed, reason = await reviewer.allowed(identity, access)
        except Unavailable as exc:
            log.warning("access review failed", extra={"service": service, "error": str(exc)})
            return status(503, "ServiceUnavailable", "cannot authorize the request right now")
        if not allowed:
            why = f" ({reason})" if reason else ""
            return status(403, "Forbidden", f'user "{identity.username}" may not {access}{why}')
        request.state.identity = identity
        return await call_next(request)


async def _who(
    request: Request, front: FrontProxyWatch | None, reviewer: TokenReviewer | None
) -> tuple[Identity | None, str]:
    """Who asks: the user the front proxy names (its certificate checked), else the owner of
    a reviewed bearer token; with the reason when nobody is known. Raises `Unavailable` when
    the token cannot be reviewed (the API server unreachable): that is no answer, not a no."""
    chain: Iterable[str] = ((request.scope.get("extensions") or {}).get("tls") or {}).get(
        "client_cert_chain"
    ) or ()
    leaf = next(iter(chain), None)
    if leaf is not None:
        proxy = front.current if front is not None else None
        if proxy is None:
            return None, "no front proxy is configured to present a client certificate"
        if why := proxy.verified(leaf):
            return None, why
        identity = proxy.identity(request.headers)
        return (identity, "") if identity else (None, "the front proxy named no user")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or reviewer is None:
        return None, "authenticate through the API server, or with a bearer token"
    identity = await reviewer.review(token.strip())
    return (identity, "") if identity else (None, "the API server does not authenticate it")


class SecureServer:
    """A service's HTTPS listener for its aggregated API (and, in the dispatcher, its admission
    webhook beside it): the certificate of `cert_dir`, reloaded when the mounted Secret
    changes; the front proxy's CA, followed by a watch; `install_aggregated` on `app` when
    `api` is given."""

    def __init__(
        self,
        tls: CertReloader,
        server: Any,
        http: asyncio.Task[Any],
        front: FrontProxyWatch | None,
        front_task: asyncio.Task[Any] | None,
        name: str,
        on_death: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.tls = tls
        self.server = server
        self.http = http
        self.front = front
        self.front_task = front_task
        self._stop = asyncio.Event()
        self.watcher = spawn(
            tls.watch(self._stop), name=f"{name}-certs", on_death=on_death, ends=self._stop.is_set
        )
        self.closers: list[Callable[[], Awaitable[Any]]] = []
        """What else ends with the server (a subscription feeding it)."""

    @property
    def port(self) -> int:
        return bound_port(self.server)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        """What must keep running (one ending is the service failing)."""
        front = {self.front_task} if self.front_task else set()
        return {self.http, self.watcher, *front}

    @classmethod
    async def start(
        cls,
        app: FastAPI,
        *,
        api: GroupVersion | None,
        kube: KubeClient,
        settings: ServiceSettings,
        cert_dir: str,
        port: int,
        name: str,
        on_death: Callable[[BaseException], None] | None = None,
    ) -> SecureServer:
        tls = CertReloader(cert_dir)
        front = front_task = None
        if api is not None:
            front = FrontProxyWatch(kube, tls.context)
            front_task = spawn(front.informer.run(), name=f"{name}.front-proxy", on_death=on_death)
            await front.informer.synced.wait()
            # Always authorized, whatever ALNAIR_HTTP_AUTH says: an aggregated API is never
            # open, and the reviews ask the API server the caller already went through.
            reviewer = TokenReviewer(
                kube, audiences=settings.http_auth_audiences, cache_s=settings.http_auth_cache_s
            )
            install_aggregated(app, api, front=front, reviewer=reviewer, service=name)
        server, http = await start_http(
            app, settings.http_host, port, name=name, tls=tls, protocol=ClientCertH11,
            on_death=on_death,
        )  # fmt: skip
        return cls(tls, server, http, front, front_task, name, on_death)

    async def stop(self) -> None:
        self._stop.set()
        for close in self.closers:
            try:
                await close()
            except Exception as exc:
                log.warning("closing beside the secure server failed", extra={"error": str(exc)})
        await stop_http(self.server, self.http)
        if self.front_task is not None:
            self.front_task.cancel()
        waited = [self.watcher, *([self.front_task] if self.front_task else [])]
        await asyncio.gather(*waited, return_exceptions=True)
