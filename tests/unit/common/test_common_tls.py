"""The services' HTTPS: a certificate issued for the names the API server dials, served from a
folder, reloaded when the folder changes (new connections see the new certificate), and a
broken folder never takes the last good certificate out of service."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from fastapi import FastAPI

from alnair.common.errors import ConfigError
from alnair.common.http import bound_port, start_http, stop_http
from alnair.common.tasks import within
from alnair.common.tls import CA_FILE, CERT_FILE, KEY_FILE, CertReloader, issue, write_folder


def test_issue_names_every_host_and_signs_with_its_own_ca() -> None:
    now = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
    made = issue(["alnair-dispatcher.alnair-system.svc", "127.0.0.1"], days=30, now=now)
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["alnair-dispatcher.alnair-system.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert cert.not_valid_after_utc == now + dt.timedelta(days=30)
    assert set(made.secret_data()) == {CERT_FILE, KEY_FILE, CA_FILE}


@pytest.mark.parametrize(("hosts", "days"), [([], 30), ([" "], 30), (["a.svc"], 0)])
def test_issue_refuses_what_cannot_be_a_certificate(hosts: list[str], days: int) -> None:
    with pytest.raises(ConfigError):
        issue(hosts, days=days)


def test_a_folder_without_a_certificate_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=str(tmp_path)):
        CertReloader(tmp_path)


def _app() -> FastAPI:
    api = FastAPI()

    @api.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    return api


@contextlib.asynccontextmanager
async def serving(folder: Path) -> AsyncIterator[tuple[CertReloader, str]]:
    tls = CertReloader(folder)
    stop = asyncio.Event()
    watcher = asyncio.create_task(tls.watch(stop))
    server, task = await start_http(_app(), "127.0.0.1", 0, name="tls-test", tls=tls)
    try:
        yield tls, f"https://127.0.0.1:{bound_port(server)}/ping"
    finally:
        stop.set()
        await stop_http(server, task)
        await within(watcher, 5)


async def _get(url: str, ca_pem: bytes) -> int:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    async with httpx.AsyncClient(verify=context) as client:
        return (await client.get(url)).status_code


async def _until(check: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_new_connections_get_the_certificate_the_folder_changed_to(tmp_path: Path) -> None:
    first = issue(["127.0.0.1"])
    write_folder(tmp_path, first.secret_data())
    async with serving(tmp_path) as (tls, url):
        assert await _get(url, first.ca_pem) == 200
        second = issue(["127.0.0.1"])
        write_folder(tmp_path, second.secret_data())
        await _until(lambda: tls.loads == 2)
        assert await _get(url, second.ca_pem) == 200
        # Signed by a CA the client no longer trusts: the old certificate is out of service.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await _get(url, first.ca_pem)


async def test_a_broken_folder_keeps_the_last_good_certificate(tmp_path: Path) -> None:
    good = issue(["127.0.0.1"])
    write_folder(tmp_path, good.secret_data())
    async with serving(tmp_path) as (tls, url):
        other = issue(["127.0.0.1"])
        # A certificate with someone else's key: refused, and said so.
        write_folder(tmp_path, {KEY_FILE: other.key_pem})
        await _until(lambda: tls.failures >= 1)
        assert tls.loads == 1
        assert await _get(url, good.ca_pem) == 200
        (tmp_path / CERT_FILE).unlink()
        await _until(lambda: tls.failures >= 2)
        assert await _get(url, good.ca_pem) == 200
        assert tls.reload() is False
