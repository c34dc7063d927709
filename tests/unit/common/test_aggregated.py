"""The aggregated API's front-proxy authentication, request attributes and the plugin's
rendering (`alnair.common.aggregated`, `alnair.common.kubectl_alnair`)."""

from __future__ import annotations

import datetime as dt
import json
from typing import cast

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI

from alnair.common.aggregated import FrontProxy, GroupVersion, Resource, install_aggregated
from alnair.common.httpauth import Access, Identity, TokenReviewer
from alnair.common.kube import Unavailable
from alnair.common.kubectl_alnair import (
    ago_or_in,
    gpus_table,
    jobs_table,
    queues_table,
    table,
    top_table,
    why_pod_text,
    why_text,
)
from alnair.common.tls import new_ca

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    return new_ca(name, NOW - dt.timedelta(days=1), NOW + dt.timedelta(days=30))


def _leaf(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], cn: str, days: int = 30) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=2))
        .not_valid_after(NOW + dt.timedelta(days=days))
        .sign(ca[1], hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _configmap(ca: x509.Certificate, **extra: str) -> dict[str, object]:
    pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    return {"data": {"requestheader-client-ca-file": pem, **extra}}


def test_a_front_proxy_is_read_from_the_api_servers_configmap() -> None:
    ca = _ca("front-proxy-ca")
    proxy = FrontProxy.from_configmap(_configmap(
        ca[0],
        **{
            "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
            "requestheader-username-headers": json.dumps(["X-Remote-User"]),
            "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
            "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
        },
    ))  # fmt: skip
    assert proxy is not None
    assert proxy.allowed_names == {"front-proxy-client"}
    assert proxy.cas == (ca[0],)
    # Without a request-header CA there is no front proxy: nothing through it is trusted.
    assert FrontProxy.from_configmap({"data": {"client-ca-file": "x"}}) is None


def test_only_the_front_proxys_own_certificate_is_trusted() -> None:
    ca, other = _ca("front-proxy-ca"), _ca("cluster-ca")
    allowed = json.dumps(["front-proxy-client"])
    proxy = FrontProxy.from_configmap(_configmap(ca[0], **{"requestheader-allowed-names": allowed}))
    assert proxy is not None
    assert proxy.verified(_leaf(ca, "front-proxy-client"), NOW) == ""
    assert "not issued by" in proxy.verified(_leaf(other, "front-proxy-client"), NOW)
    assert "not one the API server allows" in proxy.verified(_leaf(ca, "someone"), NOW)
    assert "not valid now" in proxy.verified(_leaf(ca, "front-proxy-client", days=-1), NOW)
    assert "unreadable" in proxy.verified("not a certificate", NOW)
    # No allowed names listed: any certificate the CA issued (as the API server reads it).
    open_names = FrontProxy.from_configmap(_configmap(ca[0]))
    assert open_names is not None and open_names.verified(_leaf(ca, "anyone"), NOW) == ""


def test_the_user_is_read_from_the_configured_headers() -> None:
    proxy = FrontProxy(cas=(), group_headers=("X-Remote-Group",), uid_headers=("X-Remote-Uid",))
    who = proxy.identity(
        {"X-Remote-User": "alice", "X-Remote-Uid": "u1", "x-remote-group": "dev, ops"}
    )
    assert who is not None
    assert (who.username, who.uid, who.groups) == ("alice", "u1", ("dev", "ops"))
    assert proxy.identity({"X-Remote-Group": "system:masters"}) is None


def test_a_request_path_amounts_to_the_api_servers_resource_attributes() -> None:
    api = GroupVersion("q.alnair.io", "v1alpha1", (Resource("things", True, "Thing"),))
    base = "/apis/q.alnair.io/v1alpha1"
    assert api.access("GET", f"{base}/namespaces/ml/things") == Access(
        "list", "q.alnair.io", "things", "ml"
    )
    assert api.access("GET", f"{base}/namespaces/ml/jobs/train") == Access(
        "get", "q.alnair.io", "jobs", "ml", "train"
    )
    assert api.access("GET", f"{base}/clusterqueues") == Access(
        "list", "q.alnair.io", "clusterqueues"
    )
    # Discovery and other paths are not resource requests.
    assert api.access("GET", base) is None
    assert api.access("GET", "/apis/other.io/v1/things") is None
    assert api.api_service == "v1alpha1.q.alnair.io"


def test_tables_are_kubectls() -> None:
    assert table(("NAME", "USED"), [("a", {"T4": 2}), ("longer", None)]) == (
        "NAME     USED\na        T4=2\nlonger   <none>\n"
    )
    assert ago_or_in(None, 0) == "<none>"
    assert ago_or_in(300, 0) == "in 5m"
    assert ago_or_in(0, 90) == "90s ago"
    assert ago_or_in(3 * 3600 + 120, 0) == "in 3h2m"


def test_the_plugin_renders_queues_jobs_and_why() -> None:
    queues = {"items": [{
        "name": "team-a", "cohort": "c", "active": True, "pending": 2, "admitted": 1,
        "nominal": {"V100M32": 8}, "used": {"V100M32": 12}, "borrowed": 4, "lent": 0,
    }]}  # fmt: skip
    assert queues_table(queues).splitlines()[1].split() == [
        "team-a", "c", "True", "2", "1", "V100M32=8", "V100M32=12", "4", "0",
    ]  # fmt: skip
    item = {
        "job": "ml/train",
        "kind": "Job",
        "queue": "ml",
        "status": "waiting",
        "position": 1,
        "gpu_model": None,
        "predicted_start_s": 1060.0,
        "predicted_finish_s": 4660.0,
        "reason": {"kind": "reservation", "message": "held for big"},
    }
    lines = jobs_table({"items": [item]}, all_namespaces=True, now=1000.0).splitlines()
    assert lines[1].split() == [
        "ml", "train", "Job", "ml", "waiting", "1", "<none>", "in", "60s", "in", "61m",
        "reservation",
    ]  # fmt: skip
    why = why_text({**item, "cluster_queue": "team-a", "policy": "alnair"}, now=1000.0)
    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in why.splitlines())}
    assert fields["Queue"] == "ml (ClusterQueue team-a)"
    assert fields["Because"] == "held for big"
    assert fields["Predicted start"] == "in 60s"


def test_the_plugin_renders_gpus_top_and_why_a_pod_waits() -> None:
    gpus = {"items": [{
        "node": "n1", "model": "T4", "fragmentation": 0.5, "gpus": [
            {"index": 0, "healthy": True, "utilizationPct": 40.0, "usedMilli": 500,
             "holders": [{"pod": "ml/a", "milli": 300}, {"pod": "ml/b", "milli": 200}]},
            {"index": 1, "healthy": False, "utilizationPct": 0.0, "usedMilli": 0, "holders": []},
        ],
    }]}  # fmt: skip
    rows = [line.split() for line in gpus_table(gpus).splitlines()[1:]]
    assert rows == [
        ["n1", "T4", "0", "True", "40%", "0.5", "ml/a=0.3,ml/b=0.2", "0.5"],
        ["n1", "T4", "1", "False", "0%", "0", "<none>", "0.5"],
    ]
    top = {"items": [{"pod": "ml/a", "node": "n1", "gpus": [
        {"index": 0, "milli": 300, "utilizationPct": 25.0, "memoryMiB": 2048.4},
    ]}]}  # fmt: skip
    assert top_table(top, all_namespaces=True).splitlines()[1].split() == [
        "ml", "a", "n1", "0", "0.3", "25%", "2048Mi",
    ]  # fmt: skip
    pod = {
        "pod": "ml/big", "node": None, "message": "0/5 nodes are available",
        "request": {"num_gpu": 1, "gpu_milli": 500, "cpu_milli": 100, "memory_mib": 64},
        "filtered": {"a": "Insufficient GPU memory", "b": "Insufficient GPU memory",
                     "c": "node selector mismatch", "d": "Insufficient GPU memory",
                     "e": "Insufficient GPU memory"},
    }  # fmt: skip
    lines = why_pod_text(pod).splitlines()
    assert lines[2].split(":", 1)[1].strip() == "1 GPU x 0.5, 100m CPU, 64Mi"
    # The filters' verdicts grouped by reason, the largest group first, a few nodes named.
    assert lines[4].split(":", 1)[1].strip() == (
        "Insufficient GPU memory (4 nodes): a, b, d, and 1 more"
    )
    assert lines[5].strip() == "node selector mismatch (1 node): c"


class _Reviewer:
    """A TokenReviewer whose API server answers as told: `review` with an identity, None
    (not authenticated) or Unavailable; `allowed` likewise."""

    def __init__(self, who: Identity | Exception | None, allowed: bool | Exception) -> None:
        self.who = who
        self.verdict = allowed

    async def review(self, _token: str) -> Identity | None:
        if isinstance(self.who, Exception):
            raise self.who
        return self.who

    async def allowed(self, _identity: Identity, _access: Access) -> tuple[bool, str]:
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return self.verdict, ""


@pytest.mark.parametrize(
    ("who", "allowed", "code", "reason"),
    [
        (Unavailable("no API server"), True, 503, "ServiceUnavailable"),
        (None, True, 401, "Unauthorized"),
        (Identity("ann"), Unavailable("no API server"), 503, "ServiceUnavailable"),
        (Identity("ann"), False, 403, "Forbidden"),
        (Identity("ann"), True, 200, None),
    ],
)
async def test_a_bearer_token_that_cannot_be_reviewed_is_no_answer_not_a_refusal(
    who: Identity | Exception | None, allowed: bool | Exception, code: int, reason: str | None
) -> None:
    """The API server unreachable: 503 (retry), as `httpauth` answers; 401 only when the API
    server says the token is nobody's."""
    api = GroupVersion("q.example.io", "v1", (Resource("things", False, "Thing"),))
    app = FastAPI()
    reviewer = cast(TokenReviewer, _Reviewer(who, allowed))
    install_aggregated(app, api, front=None, reviewer=reviewer, service="test")

    @app.get(api.prefix + "/things")
    async def things() -> dict[str, str]:
        return {"kind": "ThingList"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get(api.prefix + "/things", headers={"Authorization": "Bearer x"})
    assert answer.status_code == code, answer.text
    if reason is not None:
        body = answer.json()
        assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
