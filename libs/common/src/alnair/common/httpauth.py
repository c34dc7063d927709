"""Bearer tokens on every mutating HTTP endpoint, checked with TokenReview (the Kubernetes way).

A service API that changes something (POST/PUT/PATCH/DELETE) must know who asks. Callers send
a Kubernetes token (`Authorization: Bearer <token>`: a ServiceAccount's projected token, or a
user's token from their kubeconfig), and the service asks the API server whether it is valid
(`authentication.k8s.io/v1` TokenReview), exactly as the kubelet and aggregated API servers
do. Nothing is stored: no second user database, and revoking the ServiceAccount revokes access.
The review names the audiences a token must be minted for (`alnair` by default, see
`ServiceSettings.http_auth_audiences`): a token a caller hands to a service is then one the API
server itself refuses, so the service cannot replay it against the cluster.

`install_token_auth` adds one middleware that guards every mutating method on every route, so
a route added later is guarded without anyone remembering to; queries that use POST only to
carry a body (the predictor's `/v1/predict`) are listed as `exempt` by their service. Reads
(GET, HEAD, OPTIONS) stay open, as the metrics and readiness probes need, except those a
service names an access for (`authorize_read`, `object_reads`): one tenant's data (a job's
explanation, a pod's profile) is read by whoever may `get` that object, and nobody else
(`ALNAIR_HTTP_AUTH_READS`, on in the deploy).

Then who asks must be allowed to do it. A service names, per mutating route, the Kubernetes
access it amounts to (`Access`: resizing an ElasticJob is `update` on `elasticjobs/scale` in
its namespace), and the API server's authorizer is asked with a SubjectAccessReview for that
identity, as aggregated API servers do: RBAC (or whatever authorizer the cluster runs) decides,
so a token valid in the cluster is not by itself a right to change anything. A mutating route
for which the service names no access is refused: a route added later is closed until someone
says who may use it.

Answers: no or malformed header -> 401 problem with `WWW-Authenticate: Bearer`; a token the
API server does not authenticate -> 401; an identity the authorizer does not allow -> 403
naming the access asked; the API server unreachable -> 503 (the caller may retry; we do not
guess). Reviews are cached briefly by the token's SHA-256 (a bounded LRU,
rejections for a shorter time), so a burst of requests costs one review and a flood of
garbage tokens cannot become a flood of TokenReviews. `ALNAIR_HTTP_AUTH=false` turns the
check off for local development; the service logs that it runs unauthenticated.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI, Request
from starlette.responses import Response

from alnair.common.errors import ConfigError
from alnair.common.http import problem
from alnair.common.kube import ApiError, KubeClient, Unavailable
from alnair.common.settings import ServiceSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class Identity:
    """Who a token belongs to, as the API server says."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    node: str = ""
    """The node of the pod a bound token belongs to (`authentication.kubernetes.io/node-name`
    in the review's user extra), when it names one."""


@dataclass(frozen=True)
class Access:
    """What a request amounts to, in Kubernetes terms (a SubjectAccessReview's attributes)."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.resource}{sub}.{self.group} {self.name}{where}".replace(
            "  ", " "
        )


Authorize = Callable[[Request], "Access | None"]
"""Per request: the access it amounts to, or None when the service names none (refused)."""


class TokenReviewer:
    """Asks the API server who a bearer token belongs to; caches answers briefly."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        audiences: Collection[str] = (),
        cache_s: float = 10.0,
        rejected_cache_s: float = 2.0,
        max_entries: int = 4096,
    ) -> None:
        self.kube = kube
        self.audiences = list(audiences)
        self.cache_s = cache_s
        self.rejected_cache_s = rejected_cache_s
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, Identity | None]] = OrderedDict()
        self._decisions: OrderedDict[str, tuple[float, tuple[bool, str]]] = OrderedDict()
        self.reviews = 0
        """TokenReviews sent (the cache's misses)."""
        self.access_reviews = 0
        """SubjectAccessReviews sent (the cache's misses)."""

    async def review(self, token: str) -> Identity | None:
        """The token's identity, or None when the API server does not authenticate it.

        Raises `Unavailable` when the API server cannot be asked."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        if (hit := self._recall(self._cache, key, now)) is not None:
            return hit[1]
        spec: dict[str, object] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        self.reviews += 1
        try:
            doc = await self.kube.request("POST", TOKENREVIEWS, body=body)
        except ApiError as exc:
            # 403: this service's account may not create TokenReviews (RBAC: the
            # system:auth-delegator role); that is the operator's to fix, not the caller's.
            raise Unavailable(
                f"TokenReview refused by the API server: {exc}", status=exc.status
            ) from exc
        status = doc.get("status") or {}
        identity: Identity | None = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            nodes = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or [""]
            identity = Identity(
                username=str(user.get("username", "")),
                uid=str(user.get("uid", "")),
                groups=tuple(str(g) for g in user.get("groups") or ()),
                node=str(nodes[0]),
            )
        ttl = self.cache_s if identity is not None else self.rejected_cache_s
        self._remember(self._cache, key, now + ttl, identity)
        return identity

    @staticmethod
    def _recall(
        cache: OrderedDict[str, tuple[float, T]], key: str, now: float
    ) -> tuple[float, T] | None:
        """A cached answer still valid at `now` (marked recently used), or None."""
        hit = cache.get(key)
        if hit is None or hit[0] <= now:
            return None
        cache.move_to_end(key)
        return hit

    def _remember(self, cache: OrderedDict[str, tuple[float, T]], key: str, until: float,
                  value: T) -> None:  # fmt: skip
        cache[key] = (until, value)
        cache.move_to_end(key)
        while len(cache) > self.max_entries:
            cache.popitem(last=False)

    async def allowed(self, identity: Identity, access: Access) -> tuple[bool, str]:
        """Whether the API server's authorizer lets `identity` do `access`, and its reason.

        Raises `Unavailable` when the API server cannot be asked."""
        key = f"{identity.username}|{identity.uid}|{','.join(identity.groups)}|{access!r}"
        now = time.monotonic()
        if (hit := self._recall(self._decisions, key, now)) is not None:
            return hit[1]
        attributes = {
            "verb": access.verb, "group": access.group, "resource": access.resource,
            "namespace": access.namespace, "name": access.name,
            "subresource": access.subresource,
        }  # fmt: skip
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": identity.username,
                "uid": identity.uid,
                "groups": list(identity.groups),
                "resourceAttributes": {k: v for k, v in attributes.items() if v},
            },
        }
        self.access_reviews += 1
        try:
            doc = await self.kube.request("POST", SUBJECTACCESSREVIEWS, body=body)
        except ApiError as exc:
            raise Unavailable(
                f"SubjectAccessReview refused by the API server: {exc}", status=exc.status
            ) from exc
        status = doc.get("status") or {}
        decision = (bool(status.get("allowed")), str(status.get("reason") or ""))
        ttl = self.cache_s if decision[0] else self.rejected_cache_s
        self._remember(self._decisions, key, now + ttl, decision)
        return decision


def reviewer_for(settings: ServiceSettings, kube: KubeClient | None) -> TokenReviewer | None:
    """The service's token reviewer, or None when `settings.http_auth` is off."""
    if not settings.http_auth:
        return None
    if kube is None:
        raise ConfigError(
            "ALNAIR_HTTP_AUTH needs a Kubernetes client to review tokens; set it to false"
            " for a service run without one"
        )
    return TokenReviewer(
        kube, audiences=settings.http_auth_audiences, cache_s=settings.http_auth_cache_s
    )


def _unauthorized(detail: str) -> Response:
    response = problem(401, "Unauthorized", detail)
    response.headers["WWW-Authenticate"] = 'Bearer realm="alnair"'
    return response


def object_reads(
    objects: Mapping[str, tuple[str, str]], lists: Mapping[str, Access] | None = None
) -> Authorize:
    """`authorize_read` for routes about one namespaced object, `/v1/<plural>/<namespace>/
    <name>[/...]`: `get` on the object the plural names (`objects`: plural -> (API group,
    resource)), as `kubectl get` would need; `lists` names the access of exact paths that
    read across namespaces. Any other read stays open (health, metrics)."""
    exact = dict(lists or {})

    def access(request: Request) -> Access | None:
        path = request.url.path
        if path in exact:
            return exact[path]
        parts = path.strip("/").split("/")
        if len(parts) >= 4 and parts[0] == "v1" and parts[1] in objects:
            group, resource = objects[parts[1]]
            return Access("get", group, resource, parts[2], parts[3])
        return None

    return access


def install_token_auth(
    app: FastAPI,
    reviewer: TokenReviewer | None,
    *,
    service: str,
    exempt: Collection[str] = (),
    authorize: Authorize | None = None,
    authorize_read: Authorize | None = None,
) -> None:
    """Guard every mutating request to `app` with a reviewed bearer token and an access review
    (see the module), and the reads `authorize_read` names an access for.

    `reviewer` None means authentication is off (local development): logged once, loudly.
    `exempt` lists paths whose POST is a query that changes nothing. `authorize` names the
    access each mutating request amounts to; without it, or where it names none, a mutating
    request is refused after authentication. `authorize_read` (`object_reads`) names the
    access a read amounts to where it is one tenant's (a job's explanation, a pod's profile);
    a read it names none for stays open.
    """
    if reviewer is None:
        log.warning(
            "HTTP mutations accept anyone: ALNAIR_HTTP_AUTH is off", extra={"service": service}
        )
        return
    open_paths = frozenset(exempt)

    @app.middleware("http")
    async def _authenticate(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        reading = request.method not in MUTATING
        if reading:
            read = authorize_read(request) if authorize_read is not None else None
            if read is None:
                return await call_next(request)
        elif request.url.path in open_paths:
            return await call_next(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _unauthorized(f"{request.method} {request.url.path} needs a bearer token")
        try:
            identity = await reviewer.review(token)
        except Unavailable as exc:
            log.warning("token review failed", extra={"service": service, "error": str(exc)})
            return problem(503, "Service Unavailable", "cannot verify the token right now")
        if identity is None:
            return _unauthorized("the API server does not authenticate this token")
        if reading:
            access: Access | None = read
        else:
            access = authorize(request) if authorize is not None else None
        if access is None:
            return problem(
                403, "Forbidden",
                f"{request.method} {request.url.path} is not open to anyone: {service} names "
                "no access for it",
            )  # fmt: skip
        try:
            allowed, reason = await reviewer.allowed(identity, access)
        except Unavailable as exc:
            log.warning("access review failed", extra={"service": service, "error": str(exc)})
            return problem(503, "Service Unavailable", "cannot authorize the request right now")
        if not allowed:
            log.info("refused request", extra={"service": service, "user": identity.username,
                                               "access": str(access)})  # fmt: skip
            why = f" ({reason})" if reason else ""
            return problem(403, "Forbidden", f"{identity.username} may not {access}{why}")
        request.state.identity = identity
        log.info(
            "authenticated read" if reading else "authenticated mutation",
            extra={
                "service": service,
                "user": identity.username,
                "method": request.method,
                "path": request.url.path,
            },
        )
        return await call_next(request)


def guard_reads(
    app: FastAPI,
    settings: ServiceSettings,
    kube: KubeClient | None,
    *,
    service: str,
    objects: Mapping[str, tuple[str, str]],
    lists: Mapping[str, Access] | None = None,
) -> None:
    """With `settings.http_auth_reads`, a service's reads of one tenant's objects
    (`object_reads`) need a token whose identity may read them; a service without mutating
    routes calls only this."""
    if not settings.http_auth_reads:
        return
    reviewer = reviewer_for(settings, kube)
    if reviewer is None:
        raise ConfigError("ALNAIR_HTTP_AUTH_READS needs ALNAIR_HTTP_AUTH (token reviews)")
    install_token_auth(app, reviewer, service=service, authorize_read=object_reads(objects, lists))
