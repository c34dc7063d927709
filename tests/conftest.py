"""Fixtures that start real servers on loopback: nats-server (JetStream), redis-server, and a
Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, KWOK).

Servers come from `alnair.dev.localstack`, the same code `make dev-up` and the demo use.
The control plane is started once per session (about 4 s) and shared; each test gets its own
namespace. nats and redis are cheap, so each test gets fresh ones.
"""

from __future__ import annotations

import asyncio.selector_events
import gc
import os
import time
import tracemalloc
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


# Transports still open when a test's event loop closes: nothing can close them after that (the
# loop is gone), and the collector would find them later, in whichever test runs then, with no
# word of who opened them. A TLS connection aiohttp closed (a watch cancelled as a service
# stops) stays open on the socket until the server answers its close_notify, a few dozen loop
# turns; a loop closed sooner, as a loaded machine's last test turns go, left it open. So the
# close first lets such shutdowns finish (as a process draining before exit would), then
# records what is still open, with what it carried, for `collect_after_e2e` to fail the test.
_left_open: list[str] = []
_close_loop = asyncio.selector_events.BaseSelectorEventLoop.close
_DRAIN_S = 2.0


def _describe(transport: asyncio.BaseTransport) -> str:
    protocol = transport.get_protocol()
    kind = f"{type(protocol).__module__}.{type(protocol).__qualname__}"
    ends = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
    made = tracemalloc.get_object_traceback(transport)  # with PYTHONTRACEMALLOC=N
    where = "\n".join(made.format()) if made else "(PYTHONTRACEMALLOC=12 says where it was made)"
    return f"{transport!r} protocol {kind} local {ends[0]} peer {ends[1]}\n{where}"


def _close_draining_transports(loop: asyncio.selector_events.BaseSelectorEventLoop) -> None:
    def still_open() -> list[asyncio.BaseTransport]:
        transports = getattr(loop, "_transports", {})
        return [t for t in list(transports.values()) if not t.is_closing()]

    async def drained() -> None:
        deadline = time.monotonic() + _DRAIN_S
        while still_open() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    if not loop.is_closed() and not loop.is_running() and still_open():
        loop.run_until_complete(drained())
        _left_open.extend(_describe(t) for t in still_open())
    _close_loop(loop)


asyncio.selector_events.BaseSelectorEventLoop.close = _close_draining_transports  # type: ignore[method-assign,assignment]


@pytest.fixture(autouse=True)
def collect_after_e2e(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, fail it when its event loop closed with a transport open (above); after
    each e2e test, collect garbage: an object it leaked (an unclosed socket, file or transport)
    warns now, and fails that test, instead of whichever test runs when the collector next
    passes."""
    _left_open.clear()
    yield
    left = _left_open.copy()
    _left_open.clear()
    if left or request.node.get_closest_marker("e2e") is not None:
        gc.collect()
    if left:
        pytest.fail("the event loop closed with transports open:\n" + "\n".join(left))


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
