"""TLS for the services' own HTTPS endpoints, one mechanism for all of them.

A service serves with the certificate in a folder that holds a mounted `kubernetes.io/tls`
Secret (`tls.crt`, `tls.key`; `ca.crt` beside them). `CertReloader` loads it into one live
`ssl.SSLContext` and loads it again when the files change (the kubelet swaps a Secret volume's
files atomically): new connections get the new certificate, open ones keep theirs, and a
folder that turns unreadable or inconsistent keeps the last good certificate and says so.
No timer: the folder is watched with inotify.

`issue` makes what goes into that Secret: a CA of its own and a serving certificate it signed
for the names the API server will dial (the Service's DNS names in a cluster; 127.0.0.1 on the
local control plane). `alnair certs` (`alnair.common.certs_cli`) writes it into the Secret and
hands the CA to the webhook configurations.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from alnair.common.errors import ConfigError

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"


@dataclass(frozen=True, slots=True)
class Issued:
    """A CA and a serving certificate it signed, PEM-encoded."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    not_after: dt.datetime

    def secret_data(self) -> dict[str, bytes]:
        """The files of a `kubernetes.io/tls` Secret, the CA beside them."""
        return {CERT_FILE: self.cert_pem, KEY_FILE: self.key_pem, CA_FILE: self.ca_pem}


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "alnair"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
    decipher_only=False,
)  # fmt: skip


def new_ca(
    name: x509.Name, not_before: dt.datetime, not_after: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that signs leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(hosts: Iterable[str], *, days: int = 365, now: dt.datetime | None = None) -> Issued:
    """A new CA and a serving certificate for `hosts` (DNS names or IP addresses), valid
    `days` from `now`. The CA's key is not kept: nothing else can be signed with it."""
    names = [h.strip() for h in hosts if h.strip()]
    if not names:
        raise ConfigError("a serving certificate needs at least one host name", hosts=names)
    if days < 1:
        raise ConfigError(f"certificate lifetime must be at least one day, not {days}", days=days)
    now = now or dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    sans: list[x509.GeneralName] = []
    for host in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    ca_name = _name(f"alnair-ca-{int(now.timestamp())}")
    ca, ca_key = new_ca(ca_name, start, end)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        not_after=end,
    )


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    """Write `files` into `folder` as the kubelet updates a Secret volume: each file whole,
    replaced by a rename, readable by the owner only."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / name)


def not_after(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


class CertReloader:
    """One server-side SSLContext whose certificate follows the files in `folder`."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loads = 0
        self.failures = 0
        self.serving_until: dt.datetime | None = None
        self._loaded: tuple[bytes, bytes] | None = None
        if not self.reload():
            raise ConfigError(
                f"no usable certificate in {self.folder} ({CERT_FILE} and {KEY_FILE} expected)",
                folder=str(self.folder),
            )

    @property
    def cert_file(self) -> Path:
        return self.folder / CERT_FILE

    @property
    def key_file(self) -> Path:
        return self.folder / KEY_FILE

    def reload(self) -> bool:
        """Load the folder's certificate and key if they changed. False when they cannot be
        used (missing, unreadable, not a pair): the last good certificate stays in service."""
        try:
            pair = (self.cert_file.read_bytes(), self.key_file.read_bytes())
        except OSError as exc:
            self.failures += 1
            log.error("TLS files not readable; serving the last good certificate",
                      extra={"folder": str(self.folder), "error": str(exc)})  # fmt: skip
            return False
        if pair == self._loaded:
            return True
        try:
            # One call loads both from the files just read; a key that does not match the
            # certificate raises here, before the context is touched.
            with tempfile.TemporaryDirectory(prefix="alnair-tls-") as tmp:
                cert, key = Path(tmp) / CERT_FILE, Path(tmp) / KEY_FILE
                cert.write_bytes(pair[0])
                key.write_bytes(pair[1])
                probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                probe.load_cert_chain(cert, key)
                self.context.load_cert_chain(cert, key)
            self.serving_until = not_after(pair[0])
        except (ssl.SSLError, ValueError) as exc:
            self.failures += 1
            log.error("TLS files are not a certificate and its key; serving the last good one",
                      extra={"folder": str(self.folder), "error": str(exc)})  # fmt: skip
            return False
        self._loaded = pair
        self.loads += 1
        log.info("TLS certificate loaded", extra={"folder": str(self.folder),
                 "not_after": self.serving_until.isoformat()})  # fmt: skip
        return True

    async def watch(self, stop: asyncio.Event | None = None) -> None:
        """Reload on every change in the folder, until `stop` is set (or cancelled)."""
        from watchfiles import awatch

        async for _changes in awatch(self.folder, stop_event=stop, recursive=False):
            self.reload()
