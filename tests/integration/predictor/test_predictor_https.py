"""Issue 25: a service's own API is HTTPS only in the deploy's settings.

The production overlay gives every service `ALNAIR_HTTP_CERT_DIR` (alnair-config, the https
component) and mounts its own certificate Secret there. Here the predictor (real nats-server
and redis-server) is started with that setting, pointed at a folder laid out as the Secret
volume is: HTTPS with the Secret's CA is answered; plain HTTP gets no HTTP answer at all; a
client trusting another CA fails the handshake; a renewed certificate written into the folder
(as the kubelet updates a Secret volume) is served without a restart.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from alnair.common.tls import CA_FILE, issue, write_folder
from alnair.dev.waiting import wait_for
from alnair.predictor.app import start
from alnair.predictor.settings import PredictorSettings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
HOSTS = ["alnair-predictor.alnair-system.svc", "127.0.0.1"]


def deploy_config() -> dict[str, str]:
    kubectl = Path(sys.executable).parent / "kubectl"
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(REPO / "deploy/kustomize/overlays/production")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for doc in yaml.safe_load_all(rendered):
        if (
            doc
            and doc["kind"] == "ConfigMap"
            and doc["metadata"]["name"].startswith("alnair-config")
        ):
            return dict(doc["data"])
    raise AssertionError("no alnair-config in the production overlay")


def trusting(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


async def test_the_predictor_serves_https_only_with_the_deploys_setting(
    nats_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounted = deploy_config()["ALNAIR_HTTP_CERT_DIR"]
    assert mounted == "/etc/alnair/http-tls"
    folder = tmp_path / "http-tls"  # where the Secret volume would be
    first = issue(HOSTS)
    write_folder(folder, first.secret_data())
    # The deploy's variable, as the service reads it from its environment.
    monkeypatch.setenv("ALNAIR_HTTP_CERT_DIR", str(folder))
    settings = PredictorSettings(
        nats_url=nats_url, redis_url=redis_url, http_host="127.0.0.1", http_port=0,
        log_json=False,
    )  # fmt: skip
    assert settings.http_cert_dir == str(folder)
    running = await start(settings, CollectorRegistry())
    port = running.http_port
    try:
        async with httpx.AsyncClient(verify=trusting(first.ca_pem)) as https:
            assert (await https.get(f"https://127.0.0.1:{port}/healthz")).status_code == 200
        # Plain HTTP: the TLS listener answers no HTTP request.
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{port}/healthz")
        # A client that trusts another CA fails the handshake.
        other = issue(HOSTS)
        async with httpx.AsyncClient(verify=trusting(other.ca_pem)) as wrong:
            with pytest.raises(httpx.ConnectError):
                await wrong.get(f"https://127.0.0.1:{port}/healthz")

        # Renewed in place (a new CA, as `alnair certs` does): served without a restart.
        write_folder(folder, other.secret_data())

        async def renewed() -> bool:
            try:
                async with httpx.AsyncClient(verify=trusting(other.ca_pem)) as https:
                    r = await https.get(f"https://127.0.0.1:{port}/healthz")
                return r.status_code == 200
            except httpx.ConnectError:
                return False

        assert await wait_for(renewed, 10, 0.1)
        assert (folder / CA_FILE).read_bytes() == other.ca_pem
    finally:
        await running.stop()
    assert not os.environ.get("ALNAIR_PREDICTOR_HTTP_CERT_DIR")
