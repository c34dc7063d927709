"""Kubernetes auth as real clusters need it, against the real API server.

A kubeconfig whose user is an `exec` plugin (a script that prints an ExecCredential holding a
ServiceAccount token from the TokenRequest API, or the admin client certificate) lists
namespaces; an expiring credential is renewed; a rejected one is renewed once and the request
retried; a failing plugin is a clear error; a token file that changes is picked up, both when
it is looked at again and at once on a 401.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from alnair.common.errors import ConfigError
from alnair.common.kube import (
    KIND_RESOURCES,
    NAMESPACES,
    SERVICEACCOUNTS,
    ApiError,
    KubeClient,
    NotFound,
)
from alnair.common.kubeauth import TokenFileAuth
from alnair.common.kubeconfig import KubeConfig
from alnair.common.tasks import within
from alnair.dev.localstack import ControlPlane
from kube_auth_support import Plugin, write_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

SELF_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def whoami(client: KubeClient) -> str:
    """The user the API server sees (SelfSubjectReview: any authenticated user may ask)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    review = await client.request("POST", SELF_REVIEW, body=body)
    name: str = review["status"]["userInfo"]["username"]
    return name


@contextlib.asynccontextmanager
async def namespace_reader(kube: KubeClient, namespace: str, name: str) -> Any:
    """A ServiceAccount allowed to list and watch namespaces (cluster-scoped RBAC, removed afterwards)."""
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        namespace,
    )
    role = f"{namespace}-{name}"
    await kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}],
        }
    )
    await kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
    )
    try:
        yield await kube.service_account_token(namespace, name)
    finally:
        for kind in ("ClusterRoleBinding", "ClusterRole"):
            with contextlib.suppress(NotFound):
                await kube.delete(KIND_RESOURCES[kind], role)


def exec_kubeconfig(cp: ControlPlane, plugin: Plugin, path: Path, api_version: str) -> str:
    assert cp.pki is not None
    user = {"exec": plugin.exec_section(api_version)}
    return str(write_kubeconfig(path, cp.server, cp.pki.ca_cert, user))


async def list_namespace_names(client: KubeClient) -> set[str]:
    return {n["metadata"]["name"] for n in (await client.list(NAMESPACES))["items"]}


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
async def test_exec_plugin_token_lists_namespaces(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path, api_version: str
) -> None:
    async with namespace_reader(kube, namespace, "reader") as token:
        plugin = Plugin(tmp_path / "plugin").plan({"status": {"token": token}})
        path = exec_kubeconfig(control_plane, plugin, tmp_path / "kubeconfig", api_version)
        async with KubeClient.from_config(path) as client:
            assert namespace in await list_namespace_names(client)
            assert await whoami(client) == f"system:serviceaccount:{namespace}:reader"
            # No expiry: one run serves every request.
            await asyncio.gather(*(client.list(NAMESPACES) for _ in range(8)))
        assert plugin.runs == 1
        info = plugin.exec_info()
        assert info["apiVersion"] == api_version
        assert info["spec"]["cluster"]["server"] == control_plane.server
        assert plugin.env_seen() == {"PLUGIN_FLAVOUR": "vanilla"}


async def test_exec_plugin_client_certificate(
    control_plane: ControlPlane, kube: KubeClient, tmp_path: Path, namespace: str
) -> None:
    assert control_plane.pki is not None
    plugin = Plugin(tmp_path / "plugin").plan(
        {
            "status": {
                "clientCertificateData": control_plane.pki.admin_cert.read_text(),
                "clientKeyData": control_plane.pki.admin_key.read_text(),
            }
        }
    )
    path = exec_kubeconfig(
        control_plane, plugin, tmp_path / "kubeconfig", "client.authentication.k8s.io/v1"
    )
    async with KubeClient.from_config(path) as client:
        assert namespace in await list_namespace_names(client)
        # The same user as the control plane's own kubeconfig, whose certificate it is.
        assert await whoami(client) == await whoami(kube)
    assert plugin.runs == 1


async def test_expiring_credential_is_renewed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    async with namespace_reader(kube, namespace, "reader") as token:
        plugin = Plugin(tmp_path / "plugin").plan({"status": {"token": token}, "ttl_s": 2})
        path = exec_kubeconfig(
            control_plane, plugin, tmp_path / "kubeconfig", "client.authentication.k8s.io/v1"
        )
        async with KubeClient.from_config(path) as client:
            await client.list(NAMESPACES)
            await client.list(NAMESPACES)
            assert plugin.runs == 1
            # The plugin writes whole seconds: the credential expires within 2 s.
            await asyncio.sleep(2.1)
            await client.list(NAMESPACES)
            assert plugin.runs == 2
            await client.list(NAMESPACES)
            assert plugin.runs == 2


async def test_rejected_credential_reruns_the_plugin_once(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    async with namespace_reader(kube, namespace, "reader") as token:
        # The first answer is a token the server does not know (revoked, say).
        plugin = Plugin(tmp_path / "plugin").plan(
            {"status": {"token": "revoked"}}, {"status": {"token": token}}
        )
        path = exec_kubeconfig(
            control_plane, plugin, tmp_path / "kubeconfig", "client.authentication.k8s.io/v1"
        )
        async with KubeClient.from_config(path) as client:
            assert namespace in await list_namespace_names(client)
        assert plugin.runs == 2

        # A watch opened with a rejected credential is reopened with the renewed one.
        watcher = Plugin(tmp_path / "watcher").plan(
            {"status": {"token": "revoked"}}, {"status": {"token": token}}
        )
        path = exec_kubeconfig(
            control_plane, watcher, tmp_path / "watch.kubeconfig", "client.authentication.k8s.io/v1"
        )
        version = (await kube.list(NAMESPACES))["metadata"]["resourceVersion"]
        extra = f"{namespace}-w"
        await kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": extra}}
        )
        try:
            async with KubeClient.from_config(path) as client:
                # Watched from before the namespace existed: its ADDED event comes first.
                events = client.watch(NAMESPACES, resource_version=version, timeout_s=10)
                try:
                    kind, obj = await within(anext(events), 10)
                finally:
                    await events.aclose()
            assert (kind, obj["metadata"]["name"]) == ("ADDED", extra)
        finally:
            await kube.delete(NAMESPACES, extra)
        assert watcher.runs == 2

        # A plugin that keeps answering with a rejected token: one retry, then the 401.
        stuck = Plugin(tmp_path / "stuck").plan({"status": {"token": "revoked"}})
        path = exec_kubeconfig(
            control_plane, stuck, tmp_path / "stuck.kubeconfig", "client.authentication.k8s.io/v1"
        )
        async with KubeClient.from_config(path) as client:
            with pytest.raises(ApiError) as info:
                await client.list(NAMESPACES)
        assert info.value.status == 401
        assert stuck.runs == 2


async def test_failing_plugin_is_a_clear_error(control_plane: ControlPlane, tmp_path: Path) -> None:
    plugin = Plugin(tmp_path / "plugin").plan(
        {"exit": 2, "stderr": "error: you must be logged in to the server (token expired)\n"},
        {"raw": "Welcome! Your token is on the next line"},
    )
    path = exec_kubeconfig(
        control_plane, plugin, tmp_path / "kubeconfig", "client.authentication.k8s.io/v1"
    )
    async with KubeClient.from_config(path) as client:
        with pytest.raises(ConfigError) as info:
            await client.list(NAMESPACES)
        assert "exited with status 2" in str(info.value)
        assert "token expired" in str(info.value)
        with pytest.raises(ConfigError, match="no valid ExecCredential JSON"):
            await client.list(NAMESPACES)
    assert plugin.runs == 2


async def test_token_file_change_is_picked_up(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    assert control_plane.pki is not None
    token_file = tmp_path / "token"
    async with (
        namespace_reader(kube, namespace, "first") as first,
        namespace_reader(kube, namespace, "second") as second,
    ):
        token_file.write_text(first)
        config = KubeConfig(
            server=control_plane.server,
            ca_file=str(control_plane.pki.ca_cert),
            token_file=str(token_file),
        )
        # Looked at again on every request: a rotated token is used at once.
        async with KubeClient(config, token_recheck_s=0) as client:
            assert await whoami(client) == f"system:serviceaccount:{namespace}:first"
            rotated = tmp_path / "token.new"
            rotated.write_text(second)
            rotated.replace(token_file)
            assert await whoami(client) == f"system:serviceaccount:{namespace}:second"

        # Looked at hourly: still picked up at once when the token read before is refused.
        # (A made-up token: a deleted ServiceAccount's token was still accepted 10 s later.)
        token_file.write_text("revoked")
        async with KubeClient(config, token_recheck_s=3600) as client:
            token_file.write_text(second)
            assert await whoami(client) == f"system:serviceaccount:{namespace}:second"
            assert namespace in await list_namespace_names(client)
            assert isinstance(client.auth, TokenFileAuth)
            assert client.auth.reads == 2
