"""A small asyncio Kubernetes client over aiohttp, built for controllers and schedulers.

Why not the official `kubernetes` package: it is synchronous, and a scheduler that binds
thousands of pods needs many requests in flight on one event loop. This client speaks the REST
API directly: typed errors (`NotFound`, `Conflict`, `Gone`, ...), list and watch with
resourceVersion (the building blocks of `alnair.common.informer`), the Binding subresource,
patches (merge, strategic, JSON, server-side apply) and Events. Where the API server is and
which credentials to present come from `alnair.common.kubeconfig` (a kubeconfig or the
in-cluster service account, whose projected token is re-read when the kubelet rotates it);
credentials that change are `alnair.common.kubeauth`'s, and a 401 renews them once and
retries.

The transport is aiohttp: a scheduler binding thousands of pods spends its time in the HTTP
client, and a profile of the same workload on httpx showed two thirds of the CPU in its
connection-pool bookkeeping.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp

from alnair.common.errors import ConfigError, PermanentError, TemporaryError
from alnair.common.kubeauth import (
    Credential,
)
from alnair.common.kubeconfig import KubeConfig

Obj = dict[str, Any]
PatchType = Literal["merge", "strategic", "json", "apply"]
_PATCH_CT = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class ApiError(PermanentError):
    """The API server refused a request; `status` is the HTTP code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str, path: str) -> None:
        super().__init__(f"{status} {reason}: {message}", path=path)
        self.status = status
        self.reason = reason
        self.api_message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: already exists, or a resourceVersion/binding conflict."""


class Gone(ApiError):
    """410: the resourceVersion is too old; relist."""


class Unavailable(TemporaryError):
    """The API server could not be reached or asked us to back off."""


def _raise_for(status: int, text: str, path: str) -> None:
    if status < 400:
        return
    try:
        doc = json.loads(text)
        reason, message = doc.get("reason", ""), doc.get("message", text)
    except (json.JSONDecodeError, AttributeError):
        reason, message = "", text
    if status in {429, 500, 502, 503, 504}:
        raise Unavailable(f"{status} {reason}: {message}", delay_s=1.0, path=path, status=status)
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    raise cls(status, reason or str(status), message, path)


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
EVENTS = Resource("", "v1", "events")
CONFIGMAPS = Resource("", "v1", "configmaps")
JOBS = Resource("batch", "v1", "jobs")
STATEFULSETS = Resource("apps", "v1", "statefulsets")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
PODGROUPS = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
PODDISRUPTIONBUDGETS = Resource("policy", "v1", "poddisruptionbudgets")
PRIORITYCLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
ELASTICJOBS = Resource("alnair.io", "v1alpha1", "elasticjobs")
CLUSTERQUEUES = Resource("alnair.io", "v1alpha1", "clusterqueues", namespaced=False)
LOCALQUEUES = Resource("alnair.io", "v1alpha1", "localqueues")
COHORTS = Resource("alnair.io", "v1alpha1", "cohorts", namespaced=False)
TRIALJOBS = Resource("alnair.io", "v1alpha1", "trialjobs")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
DAEMONSETS = Resource("apps", "v1", "daemonsets")
SERVICES = Resource("", "v1", "services")
SECRETS = Resource("", "v1", "secrets")
APISERVICES = Resource("apiregistration.k8s.io", "v1", "apiservices", namespaced=False)
RESOURCEQUOTAS = Resource("", "v1", "resourcequotas")
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
LEADERWORKERSETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters")
RAYJOBS = Resource("ray.io", "v1", "rayjobs")
TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs")
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs")
MPIJOBS = Resource("kubeflow.org", "v1", "mpijobs")
TRAININGRUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes")
CLUSTERTRAININGRUNTIMES = Resource(
    "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", namespaced=False
)
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", namespaced=False
)
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False
)
ADMISSION_POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", namespaced=False
)
ADMISSION_POLICY_BINDINGS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", namespaced=False
)
_RBAC = "rbac.authorization.k8s.io"

KIND_RESOURCES: dict[str, Resource] = {
    "Pod": PODS,
    "Node": NODES,
    "Namespace": NAMESPACES,
    "Event": EVENTS,
    "ConfigMap": CONFIGMAPS,
    "Job": JOBS,
    "StatefulSet": STATEFULSETS,
    "Lease": LEASES,
    "CustomResourceDefinition": CRDS,
    "PodGroup": PODGROUPS,
    "PriorityClass": PRIORITYCLASSES,
    "ElasticJob": ELASTICJOBS,
    "ClusterQueue": CLUSTERQUEUES,
    "LocalQueue": LOCALQUEUES,
    "Cohort": COHORTS,
    "TrialJob": TRIALJOBS,
    "ServiceAccount": SERVICEACCOUNTS,
    "Service": SERVICES,
    "Secret": SECRETS,
    "MutatingWebhookConfiguration": MUTATING_WEBHOOKS,
    "ValidatingWebhookConfiguration": VALIDATING_WEBHOOKS,
    "Deployment": DEPLOYMENTS,
    "DaemonSet": DAEMONSETS,
    "ValidatingAdmissionPolicy": ADMISSION_POLICIES,
    "ValidatingAdmissionPolicyBinding": ADMISSION_POLICY_BINDINGS,
    "ResourceQuota": RESOURCEQUOTAS,
    "ClusterRole": Resource(_RBAC, "v1", "clusterroles", namespaced=False),
    "ClusterRoleBinding": Resource(_RBAC, "v1", "clusterrolebindings", namespaced=False),
    "Role": Resource(_RBAC, "v1", "roles"),
    "RoleBinding": Resource(_RBAC, "v1", "rolebindings"),
}


def _with(cred: Credential | None, headers: dict[str, str] | None) -> dict[str, Any]:
    """Per-request aiohttp arguments for a renewable credential (none for a static one)."""
    if cred is None:
        return {"headers": headers}
    extra: dict[str, Any] = {"headers": {**cred.headers, **(headers or {})}}
    if cred.ssl is not None:
        # A new context is a new connection-pool key: connections made with an older
        # certificate finish their requests and age out.
        extra["ssl"] = cred.ssl
    return extra


VERSION = "0.1.0"


def user_agent(component: str = "alnair", identity: str | None = None) -> str:
    """The User-Agent the API server records for a client (its audit log's `userAgent`):
    client-go's `<component>/<version> (<os>/<arch>)`, and the replica's identity where
    replicas share one account, so the audit log tells a leader's writes from its standby's."""
    agent = f"{component}/{VERSION} ({sys.platform}/{platform.machine().lower() or 'unknown'})"
    return f"{agent} {identity}" if identity else agent


class KubeClient:
    """Async Kubernetes REST client. Use as `async with KubeClient.from_config(...) as kube:`.

    `token_recheck_s`: how long a token file's contents are trusted before it is `stat`ed again.
    `agent`: the User-Agent sent (`user_agent`).
    """

    def __init__(
        self,
        config: KubeConfig,
        *,
        max_connections: int = 256,
        timeout_s: float = 30,
        token_recheck_s: float = 60.0,
        agent: str | None = None,
    ):
        self.config = config
        self.headers = {"Accept": "application/json", "User-Agent": agent or user_agent()}
        self.auth = config.authenticator(token_recheck_s)
        if config.token and self.auth is None:
            # Static: the session sends it, nothing to do per request.
            self.headers["Authorization"] = f"Bearer {config.token}"
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._ssl = config.ssl_context()
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running event loop, as aiohttp requires.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                base_url=self.config.server,
                headers=self.headers,
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, ssl=self._ssl, keepalive_timeout=60
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=5.0),
            )
        return self._session

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, **kw: Any) -> KubeClient:
        return cls(KubeConfig.load(kubeconfig), **kw)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        data = None
        if body is not None:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        headers = {"Content-Type": content_type} if data is not None else None
        if self.auth is not None:
            return await self._request_renewing(method, path, data, query, headers)
        # Static credentials ride on the session: this path pays nothing for renewable ones.
        try:
            async with self.session.request(
                method, path, data=data, params=query, headers=headers
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"API server unreachable: {exc!r}", path=path) from exc
        _raise_for(status, text, path)
        if not text:
            return {}
        result: Obj = json.loads(text)
        return result

    async def _request_renewing(
        self,
        method: str,
        path: str,
        data: bytes | str | None,
        query: Mapping[str, str],
        headers: dict[str, str] | None,
    ) -> Obj:
        """`request` with a renewable credential: the current one, renewed once after a 401."""
        assert self.auth is not None
        cred: Credential | None = await self.auth.credential()
        for attempt in range(2):
            try:
                async with self.session.request(
                    method, path, data=data, params=query, **_with(cred, headers)
                ) as resp:
                    text = await resp.text()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise Unavailable(f"API server unreachable: {exc!r}", path=path) from exc
            if status != 401 or attempt or not (cred := await self._renewed(cred)):
                break
        _raise_for(status, text, path)
        if not text:
            return {}
        result: Obj = json.loads(text)
        return result

    async def _renewed(self, rejected: Credential | None) -> Credential | None:
        """After a 401: the renewed credential to retry with, or None when none can help.

        A 401 means the server did nothing, so retrying even a POST is safe.
        """
        auth = self.auth
        if rejected is None or auth is None or not await auth.renew(rejected):
            return None
        return await auth.credential()

    # --- verbs ---------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """List (all pages merged); returns the List object with metadata.resourceVersion."""
        params: dict[str, Any] = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit or 2000,
            "resourceVersion": resource_version,
        }
        result = await self.request("GET", res.path(namespace), params=params)
        items: list[Obj] = list(result.get("items", []))
        while result.get("metadata", {}).get("continue"):
            params["continue"] = result["metadata"]["continue"]
            params.pop("resourceVersion", None)
            result = await self.request("GET", res.path(namespace), params=params)
            items.extend(result.get("items", []))
        result["items"] = items
        return result

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yield (type, object) from a watch; BOOKMARKs update nothing but the version.

        Raises `Gone` when the version is too old (the caller relists) and returns when the
        server closes the stream (the caller resumes from the last version it saw).
        """
        params: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        path = res.path(namespace)
        query = {k: str(v) for k, v in params.items() if v is not None}
        cred = None if self.auth is None else await self.auth.credential()
        try:
            for attempt in range(2):
                async with self.session.get(
                    path,
                    params=query,
                    timeout=aiohttp.ClientTimeout(total=timeout_s + 30, connect=5.0),
                    **_with(cred, None),
                ) as resp:
                    if resp.status == 401 and not attempt and (cred := await self._renewed(cred)):
                        continue
                    if resp.status >= 400:
                        _raise_for(resp.status, await resp.text(), path)
                    # Split lines ourselves: readline() caps a line at 64 KiB and big objects
                    # (a node with many images) exceed that.
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            ev = json.loads(line)
                            if ev.get("type") == "ERROR":
                                status = ev.get("object", {})
                                code = int(status.get("code", 500))
                                if code == 410:
                                    raise Gone(410, "Expired", status.get("message", ""), path)
                                raise ApiError(code, status.get("reason", ""), str(status), path)
                            yield ev["type"], ev["object"]
                    return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"watch broken: {exc!r}", path=path) from exc

    async def create(self, res: Resource, body: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or body.get("metadata", {}).get("namespace")
        return await self.request("POST", res.path(ns), body=body)

    async def replace(self, res: Resource, body: Obj, sub: str = "") -> Obj:
        meta = body["metadata"]
        path = res.path(meta.get("namespace"), meta["name"], sub)
        return await self.request("PUT", path, body=body)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        sub: str = "",
        field_manager: str | None = None,
        force: bool = False,
    ) -> Obj:
        params: dict[str, Any] = {"fieldManager": field_manager}
        if patch_type == "apply":
            params["force"] = "true" if force else None
            params["fieldManager"] = field_manager or "alnair"
        return await self.request(
            "PATCH",
            res.path(namespace, name, sub),
            body=patch,
            params=params,
            content_type=_PATCH_CT[patch_type],
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_s: int | None = None,
        propagation: str | None = None,
        preconditions_uid: str | None = None,
    ) -> Obj:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if propagation:
            body["propagationPolicy"] = propagation
        if preconditions_uid:
            body["preconditions"] = {"uid": preconditions_uid}
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def apply(self, body: Obj, *, field_manager: str = "alnair", force: bool = True) -> Obj:
        """Server-side apply of a manifest whose kind is in KIND_RESOURCES."""
        res = KIND_RESOURCES.get(body.get("kind", ""))
        if res is None:
            raise ConfigError(f"no REST mapping for kind {body.get('kind')!r}")
        meta = body["metadata"]
        return await self.patch(
            res,
            meta["name"],
            json.dumps(body),
            meta.get("namespace") if res.namespaced else None,
            patch_type="apply",
            field_manager=field_manager,
            force=force,
        )

    async def service_account_token(
        self,
        namespace: str,
        name: str,
        expiration_s: int = 3600,
        audiences: Sequence[str] = (),
        bound_pod: Obj | None = None,
    ) -> str:
        """A token for a ServiceAccount through the TokenRequest API (tests, tools); for
        `audiences` (default: the API server's own). Bound to `bound_pod`, it is valid only
        while that pod exists, and the API server adds the pod's node to its user info
        (`authentication.kubernetes.io/node-name`), as for a pod's projected token."""
        spec: dict[str, Any] = {"expirationSeconds": expiration_s}
        if audiences:
            spec["audiences"] = list(audiences)
        if bound_pod is not None:
            meta = bound_pod["metadata"]
            spec["boundObjectRef"] = {
                "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
            }  # fmt: skip
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        doc = await self.request("POST", SERVICEACCOUNTS.path(namespace, name, "token"), body=body)
        token: str = doc["status"]["token"]
        return token

    async def bind(
        self,
        namespace: str,
        name: str,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Obj:
        """Bind a pod to a node through the Binding subresource (what kube-scheduler does).

        The API server copies the Binding's annotations onto the pod in the same write, so a
        scheduler's decision (the chosen GPUs) lands atomically with the binding.
        """
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if uid:
            body["metadata"]["uid"] = uid
        if annotations:
            body["metadata"]["annotations"] = dict(annotations)
        return await self.request("POST", PODS.path(namespace, name, "binding"), body=body)

    async def event(
        self,
        involved: Obj,
        *,
        reason: str,
        message: str,
        type_: Literal["Normal", "Warning"] = "Normal",
        component: str = "alnair",
    ) -> Obj:
        """Record a core/v1 Event about `involved` (shown by `kubectl describe`)."""
        meta = involved["metadata"]
        ns = meta.get("namespace") or "default"
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": os.environ.get("HOSTNAME", component),
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        return await self.create(EVENTS, body, ns)


def resource_for(api_version: str, kind: str) -> Resource:
    """The REST location of an owner reference (known kinds, else the lowercase plural guess)."""
    known = KIND_RESOURCES.get(kind)
    if known is not None:
        return known
    group, _, version = api_version.rpartition("/")
    plural = kind.lower() + ("es" if kind.lower().endswith("s") else "s")
    return Resource(group, version, plural)
