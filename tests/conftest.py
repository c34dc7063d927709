"""Fixtures that start real servers on loopback: nats-server (JetStream), redis-server, and a
Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, KWOK).

Servers come from `alnair.dev.localstack`, the same code `make dev-up` and the demo use.
The control plane is started once per session (about 4 s) and shared; each test gets its own
namespace. nats and redis are cheap, so each test gets fresh ones.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from alnair.common.kube import NAMESPACES, KubeClient
from alnair.dev.localstack import ControlPlane, NatsServer, RedisServer

# Property tests explore new random examples on every developer run; CI (`.ci/run` sets
# ALNAIR_HYPOTHESIS_PROFILE=ci) replays a fixed set so a landing never depends on luck, and
# `thorough` searches harder when changing a property's code.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("thorough", max_examples=2000)
settings.load_profile(os.environ.get("ALNAIR_HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def collect_after_e2e(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each e2e test, collect garbage: an object it leaked (an unclosed socket, file or
    transport) warns now, and fails that test, instead of whichever test runs when the
    collector next passes."""
    yield
    if request.node.get_closest_marker("e2e") is not None:
        gc.collect()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    (tmp_path / "nats").mkdir()
    srv = NatsServer(tmp_path / "nats").start()
    yield srv
    srv.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("k8s")
    cp = ControlPlane(workdir).start()
    try:
        yield cp
    finally:
        cp.stop()
        if os.environ.get("ALNAIR_KEEP_LOGS"):
            print(f"control-plane logs kept in {workdir / 'logs'}")


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[KubeClient]:
    async with control_plane.client() as client:
        yield client


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    await kube.delete(NAMESPACES, name)
