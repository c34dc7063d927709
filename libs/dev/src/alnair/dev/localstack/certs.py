"""A throwaway PKI for a local control plane: CA, API serving cert, admin client, SA keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from alnair.common.tls import new_ca

FRONT_PROXY_CLIENT = "front-proxy-client"
"""The common name of the API server's client certificate towards aggregated APIs."""
KUBELET_API_CLIENT = "alnair-kube-apiserver-kubelet-client"
"""The API server's identity towards kubelets (logs, exec, port-forward)."""


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca: Path
    front_proxy_cert: Path
    front_proxy_key: Path


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=30)
    ca_name = _name("alnair-local-ca")
    ca, ca_key = new_ca(ca_name, now, later)

    def leaf(
        cn: str, org: str | None, server: bool
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes"),
                        x509.DNSName("kubernetes.default"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                    ]
                ),
                critical=False,
            )
        usage = x509.oid.ExtendedKeyUsageOID
        b = b.add_extension(
            x509.ExtendedKeyUsage([usage.SERVER_AUTH if server else usage.CLIENT_AUTH]),
            critical=False,
        )
        return b.sign(ca_key, hashes.SHA256()), key

    serving, serving_key = leaf("kube-apiserver", None, server=True)
    # The aggregation layer's own CA: the client certificate the API server presents to
    # aggregated APIs is trusted for request headers only, never as a user.
    proxy_ca_name = _name("alnair-local-front-proxy-ca")
    proxy_ca, proxy_ca_key = new_ca(proxy_ca_name, now, later)
    proxy_key = ec.generate_private_key(ec.SECP256R1())
    proxy = (
        x509.CertificateBuilder()
        .subject_name(_name(FRONT_PROXY_CLIENT))
        .issuer_name(proxy_ca_name)
        .public_key(proxy_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(proxy_ca_key, hashes.SHA256())
    )
    admin, admin_key = leaf("alnair-admin", "system:masters", server=False)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        front_proxy_ca=directory / "front-proxy-ca.crt",
        front_proxy_cert=directory / "front-proxy-client.crt",
        front_proxy_key=directory / "front-proxy-client.key",
    )
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    _write_key(ca_key, pki.ca_key)
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    _write_key(serving_key, pki.serving_key)
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    _write_key(admin_key, pki.admin_key)
    _write_key(sa_key, pki.sa_key)
    pki.front_proxy_ca.write_bytes(proxy_ca.public_bytes(pem))
    pki.front_proxy_cert.write_bytes(proxy.public_bytes(pem))
    _write_key(proxy_key, pki.front_proxy_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def issue_leaf(
    pki: Pki, cn: str, org: str | None, cert: Path, key: Path, *, server_ip: str | None = None
) -> None:
    """A certificate signed by the cluster CA: a client one for `cn` in group `org`, or, with
    `server_ip`, one that serves that address too (a kubelet's)."""
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.oid.ExtendedKeyUsageOID
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=30))
    )
    if server_ip is not None:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(server_ip))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([usage.SERVER_AUTH, usage.CLIENT_AUTH]), False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([usage.CLIENT_AUTH]), critical=False)
    cert.write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    _write_key(leaf_key, key)
