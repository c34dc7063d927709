"""Informers never end quietly (issue 16): against the real API server, a 403, a refused list
and a handler that raises leave the informer running, report it unhealthy while it fails,
and it recovers on its own once the cause is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest

from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    CONFIGMAPS,
    KIND_RESOURCES,
    SERVICEACCOUNTS,
    KubeClient,
    NotFound,
    Resource,
)
from alnair.common.tasks import spawn, within
from alnair.dev.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
async def as_account(kube: KubeClient, namespace: str) -> AsyncIterator[KubeClient]:
    """A client acting as a fresh ServiceAccount that may do nothing yet."""
    await kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "watcher"}},
        namespace,
    )
    token = await kube.service_account_token(namespace, "watcher")
    config = dataclasses.replace(kube.config, cert_file=None, key_file=None, token=token)
    async with KubeClient(config) as client:
        yield client


async def test_forbidden_watch_keeps_trying_and_recovers_when_allowed(
    kube: KubeClient, namespace: str, as_account: KubeClient
) -> None:
    informer = Informer(
        as_account, CONFIGMAPS, namespace=namespace, stale_after_s=0.3, max_backoff_s=0.5
    )
    task = spawn(informer.run(), name="test.informer")
    try:
        await wait_for(lambda: informer.failures >= 2)
        assert not task.done()
        assert not informer.healthy
        assert "403" in (informer.last_error or "")
        status = informer.status()
        assert status["running"] and not status["synced"]
        # RBAC fixed: it syncs without a restart
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-cm", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "read-cm", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cm"},
            "subjects": [{"kind": "ServiceAccount", "name": "watcher", "namespace": namespace}],
        }
        await kube.create(KIND_RESOURCES["Role"], role, namespace)
        await kube.create(KIND_RESOURCES["RoleBinding"], binding, namespace)
        await wait_for(lambda: informer.healthy)
        assert informer.failures == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_refused_list_is_retried_and_reported(kube: KubeClient, namespace: str) -> None:
    # The API server refuses the selector (400): the informer must say so, not die.
    informer = Informer(
        kube,
        CONFIGMAPS,
        namespace=namespace,
        field_selector="spec.nonsense=1",
        stale_after_s=0.2,
        max_backoff_s=0.3,
    )
    task = spawn(informer.run(), name="test.informer.bad")
    try:
        await wait_for(lambda: informer.failures >= 3)
        # It keeps trying: more failures come, and the task is still there.
        await wait_for(lambda: informer.failures >= 5)
        assert not task.done()
        assert not informer.healthy
        assert "400" in (informer.last_error or "")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_handler_exception_does_not_stop_the_others(kube: KubeClient, namespace: str) -> None:
    informer = Informer(kube, CONFIGMAPS, namespace=namespace)
    seen: list[str] = []

    def handler(event: WatchEvent, obj: dict[str, object], _old: object) -> None:
        name = obj["metadata"]["name"]  # type: ignore[index]
        if name == "poison":
            raise RuntimeError("bug in a handler")
        seen.append(f"{event.value}:{name}")

    informer.add_handler(handler)
    task = spawn(informer.run(), name="test.informer.handlers")
    try:
        await informer.synced.wait()
        last = f"x-{uuid.uuid4().hex[:4]}"
        for name in ("poison", "after", last):
            await kube.create(
                CONFIGMAPS,
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}},
                namespace,
            )
        await wait_for(lambda: f"ADDED:{last}" in seen)
        assert "ADDED:after" in seen
        assert informer.handler_errors == 1
        assert informer.healthy and not task.done()
        assert informer.get(f"{namespace}/poison") is not None  # the cache stays complete
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(NotFound):
            await kube.delete(CONFIGMAPS, "poison", namespace)


async def test_health_is_told_on_failure_and_recovery(
    kube: KubeClient, namespace: str, as_account: KubeClient
) -> None:
    """`on_health` is how a consumer learns that a watch failed or came back (the hub marks
    a worker away with it): told on the first failure and again on recovery, no polling."""
    told: list[tuple[int, bool]] = []
    informer = Informer(as_account, CONFIGMAPS, namespace=namespace, max_backoff_s=0.5)
    informer.on_health = lambda: told.append((informer.failures, informer.synced.is_set()))
    task = spawn(informer.run(), name="test.informer.health")
    try:
        await wait_for(lambda: informer.failures >= 1)
        assert told and told[0][0] >= 1 and informer.failing_since is not None
        assert isinstance(informer.last_exception, Exception)
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-cm-h", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "read-cm-h", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-cm-h",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "watcher", "namespace": namespace}],
        }
        await kube.create(KIND_RESOURCES["Role"], role, namespace)
        await kube.create(KIND_RESOURCES["RoleBinding"], binding, namespace)
        await wait_for(lambda: told[-1] == (0, True), what="the recovery told")
        assert informer.failing_since is None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_optional_resource_the_server_does_not_serve_ends_the_informer(
    kube: KubeClient,
) -> None:
    """A kind from another project whose CRD is not installed: a 404 on the first list is an
    answer (`unserved`), not a failure, and the informer ends; a required one keeps trying."""
    absent = Resource("widgets.example.com", "v1", "widgets")
    told: list[bool] = []
    optional = Informer(kube, absent, optional=True, on_health=lambda: told.append(True))
    await within(optional.run(), 10)
    assert optional.unserved and optional.synced.is_set() and told == [True]
    assert optional.failures == 0

    required = Informer(kube, absent, max_backoff_s=0.2)
    task = spawn(required.run(), name="test.informer.required")
    try:
        await wait_for(lambda: required.failures >= 2)
        assert not task.done() and not required.unserved and not required.healthy
        assert "404" in (required.last_error or "")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
