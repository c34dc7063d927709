"""Fixtures for the device plugin's integration tests. A stand-in kubelet for the device plugin's integration tests, speaking real gRPC on unix
sockets: it serves Registration on kubelet.sock, and calls plugins the way the kubelet does.
A restart removes every socket in the directory, as a starting kubelet does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from alnair.common.tasks import within
from alnair.deviceplugin.protos import api_pb2 as pb


class FakeKubelet:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "kubelet.sock"
        self.requests: list[pb.RegisterRequest] = []
        self._arrived = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    async def _register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        async with self._arrived:
            self.requests.append(request)
            self._arrived.notify_all()
        return pb.Empty()

    async def start(self) -> FakeKubelet:
        self.dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1beta1.Registration",
                    {
                        "Register": grpc.unary_unary_rpc_method_handler(
                            self._register,
                            request_deserializer=pb.RegisterRequest.FromString,
                            response_serializer=pb.Empty.SerializeToString,
                        )
                    },
                ),
            )
        )
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        return self

    async def stop(self, *, clear: bool = True) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        if clear:
            for sock in self.dir.glob("*.sock"):
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()

    async def wait_registrations(
        self, count: int, timeout_s: float = 10.0
    ) -> list[pb.RegisterRequest]:
        async def enough() -> None:
            async with self._arrived:
                await self._arrived.wait_for(lambda: len(self.requests) >= count)

        await within(enough(), timeout_s)
        return list(self.requests)


class PluginClient:
    """The kubelet's side of one plugin endpoint."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}")

    async def close(self) -> None:
        await self.channel.close()

    def _unary(self, method: str, req_cls: Any, rep_cls: Any) -> Any:
        return self.channel.unary_unary(
            f"/v1beta1.DevicePlugin/{method}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=rep_cls.FromString,
        )

    async def options(self) -> pb.DevicePluginOptions:
        rep: pb.DevicePluginOptions = await self._unary(
            "GetDevicePluginOptions", pb.Empty, pb.DevicePluginOptions
        )(pb.Empty(), timeout=5)
        return rep

    async def allocate(self, *containers: list[str]) -> pb.AllocateResponse:
        req = pb.AllocateRequest()
        for ids in containers:
            req.container_requests.add(devices_ids=ids)
        rep: pb.AllocateResponse = await self._unary(
            "Allocate", pb.AllocateRequest, pb.AllocateResponse
        )(req, timeout=5)
        return rep

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        req = pb.PreferredAllocationRequest()
        req.container_requests.add(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
        )
        rep: pb.PreferredAllocationResponse = await self._unary(
            "GetPreferredAllocation", pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        )(req, timeout=5)
        return list(rep.container_responses[0].deviceIDs)

    async def pre_start(self, ids: list[str]) -> pb.PreStartContainerResponse:
        rep: pb.PreStartContainerResponse = await self._unary(
            "PreStartContainer", pb.PreStartContainerRequest, pb.PreStartContainerResponse
        )(pb.PreStartContainerRequest(devices_ids=ids), timeout=5)
        return rep

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[Watch]:
        call = self.channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=pb.Empty.SerializeToString,
            response_deserializer=pb.ListAndWatchResponse.FromString,
        )(pb.Empty())
        try:
            yield Watch(call)
        finally:
            call.cancel()


class Watch:
    def __init__(self, call: Any) -> None:
        self.call = call

    async def next(self, timeout_s: float = 10.0) -> dict[str, str]:
        """The next device list, as id -> health."""
        msg = await within(self.call.read(), timeout_s)
        assert msg is not grpc.aio.EOF
        return {d.ID: d.health for d in msg.devices}

    async def next_raw(self, timeout_s: float = 10.0) -> pb.ListAndWatchResponse:
        msg = await within(self.call.read(), timeout_s)
        assert msg is not grpc.aio.EOF
        return msg  # type: ignore[no-any-return]


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    fake = await FakeKubelet(tmp_path / "device-plugins").start()
    yield fake
    await fake.stop()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[Path], PluginClient]]:
    clients: list[PluginClient] = []

    def make(socket: Path) -> PluginClient:
        client = PluginClient(socket)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
