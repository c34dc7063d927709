"""NATS nkeys: Ed25519 keys in NATS's text form (base32, a role prefix, a CRC-16), as
nats-server reads and writes them, written from the published format with `cryptography`.

A public key is one prefix byte (its role: account `A`, user `U`, server `N`, ...) and the 32
key bytes; a seed is two bytes carrying the seed marker `S` and the role, then the 32 seed
bytes. Both end in a CRC-16/XMODEM of what precedes it, little-endian, and are base32 without
padding. Used by the bus's auth callout (`alnair.common.busauth`) to sign user JWTs.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from alnair.common.errors import ConfigError

SEED = 18 << 3
ACCOUNT = 0
SERVER = 13 << 3
USER = 20 << 3
ROLES = {ACCOUNT: "A", SERVER: "N", USER: "U"}


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    raw += _crc16(raw).to_bytes(2, "little")
    return base64.b32encode(raw).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not an nkey: {exc}") from exc
    if len(raw) < 3 or _crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise ConfigError("not an nkey: its checksum does not match")
    return raw[:-2]


def public_key(role: int, key: bytes) -> str:
    return _encode(bytes([role]) + key)


def decode_public(text: str, role: int) -> bytes:
    """The 32 key bytes of a public nkey of `role`; ConfigError otherwise."""
    raw = _decode(text)
    if len(raw) != 33 or raw[0] != role:
        raise ConfigError(f"not a public {ROLES.get(role, '?')} nkey: {text[:8]}...")
    return raw[1:]


@dataclass(frozen=True)
class KeyPair:
    """A signing key of one role (from its seed)."""

    role: int
    seed_bytes: bytes = field(repr=False)

    @classmethod
    def create(cls, role: int) -> KeyPair:
        return cls(role, secrets.token_bytes(32))

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        raw = _decode(seed.strip())
        if len(raw) != 34 or raw[0] & 0xF8 != SEED:
            raise ConfigError("not an nkey seed")
        role = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
        return cls(role, raw[2:])

    @property
    def seed(self) -> str:
        return _encode(bytes([SEED | (self.role >> 5), (self.role & 31) << 3]) + self.seed_bytes)

    @property
    def public_key(self) -> str:
        pub = self._private().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return public_key(self.role, pub)

    def sign(self, data: bytes) -> bytes:
        return self._private().sign(data)

    def _private(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed_bytes)


def verify(public: str, role: int, data: bytes, signature: bytes) -> bool:
    """Whether `signature` over `data` is by the key `public` (of `role`)."""
    try:
        key = Ed25519PublicKey.from_public_bytes(decode_public(public, role))
        key.verify(signature, data)
    except (ConfigError, InvalidSignature, ValueError):
        return False
    return True
