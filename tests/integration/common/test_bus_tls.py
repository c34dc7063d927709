"""NATS over TLS (issue 25): a nats-server that requires TLS, with a certificate of its own
CA, against the services' bus client (`ALNAIR_NATS_TLS_CA`): a service that verifies the
server with that CA publishes and consumes; a plain client and one trusting another CA are
refused before they can say anything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from alnair.common.bus import Bus
from alnair.common.events import Envelope, JobEvent, JobPhase
from alnair.common.natsauth import NatsCredentials, new_password
from alnair.common.tls import CA_FILE, issue, write_folder
from alnair.dev.localstack import NatsServer
from alnair.dev.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", users={"scheduler": new_password()}, tls=True)
    server.workdir.mkdir(parents=True, exist_ok=True)
    server.start()
    yield server
    server.stop()


async def test_a_service_that_verifies_the_server_uses_the_bus(tls_nats: NatsServer) -> None:
    password = tls_nats.users["scheduler"]
    creds = NatsCredentials(user="scheduler", password=password, tls_ca_file=tls_nats.ca_file)
    bus = await Bus.connect(tls_nats.url, name="tls-test", credentials=creds)
    try:
        assert bus.nc.connected_server_version  # connected, over TLS
        assert bus.nc._server_info.get("tls_required") is True
        seen: list[str] = []

        async def on_job(event: JobEvent, _env: Envelope[JobEvent]) -> None:
            seen.append(event.name)

        await bus.subscribe(JobEvent, on_job, durable="scheduler-jobs-tls")
        event = JobEvent(phase=JobPhase.SUBMITTED, namespace="ns", kind="Job", name="j",
                         uid="u1")  # fmt: skip
        await bus.publish(event, source="test")
        await wait_for(lambda: seen == ["j"], 10)
    finally:
        await bus.close()


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """What the server says within 3 s, up to its closing the connection."""
    try:
        async with asyncio.timeout(3):
            return await reader.read(4096)
    except (TimeoutError, ConnectionError):
        return b""


async def _refused(**options: Any) -> BaseException:
    try:
        nc = await nats.connect(
            allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **options
        )
    except Exception as exc:
        return exc
    await nc.close()
    raise AssertionError(f"connected with {options}")


async def test_a_plain_client_and_one_trusting_another_ca_are_refused(
    tls_nats: NatsServer, tmp_path: Path
) -> None:
    password = tls_nats.users["scheduler"]
    # A client that speaks plain NATS (as nats-server's protocol, by hand): the server's
    # INFO says TLS is required, and a CONNECT sent in the clear gets no PONG.
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_nats.port)
    info = await reader.readline()
    assert b'"tls_required":true' in info, info
    connect = json.dumps({"user": "scheduler", "pass": password, "verbose": False})
    writer.write(f"CONNECT {connect}\r\nPING\r\n".encode())
    await writer.drain()
    answer = await _answer(reader)
    assert answer == b"", answer  # it hung up: no PONG, nothing served in the clear
    writer.close()
    other = tmp_path / "other-ca"
    write_folder(other, issue(["127.0.0.1"]).secret_data())
    creds = NatsCredentials(user="scheduler", password=password, tls_ca_file=other / CA_FILE)
    stranger = await _refused(servers=[tls_nats.url], **creds.connect_options())
    assert "certificate verify failed" in repr(stranger) or "CERTIFICATE" in repr(stranger), repr(
        stranger
    )


async def test_a_server_named_by_its_certificate_is_reached_at_any_address(
    tmp_path: Path,
) -> None:
    """A certificate for the Service's name only (as a cluster's servers have), dialled at an
    IP address (as a client reconnecting to an advertised peer does): verified against
    `ALNAIR_NATS_TLS_HOSTNAME`, not the address."""
    server = NatsServer(tmp_path / "nats", tls=True, tls_hosts=["nats.example.svc"])
    server.workdir.mkdir(parents=True, exist_ok=True)
    server.start()
    try:
        named = NatsCredentials(tls_ca_file=server.ca_file, tls_hostname="nats.example.svc")
        nc = await nats.connect(servers=[server.url], **named.connect_options())
        assert nc.is_connected
        await nc.close()
        by_address = NatsCredentials(tls_ca_file=server.ca_file)
        refused = await _refused(servers=[server.url], **by_address.connect_options())
        assert "certificate verify failed" in repr(refused) or "match" in repr(refused)
    finally:
        server.stop()
