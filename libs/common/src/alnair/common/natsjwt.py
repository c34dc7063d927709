"""The NATS JWTs of an auth callout (nats-server 2.10+): the server's authorization request,
and the response carrying the user it will admit, each an `ed25519-nkey` JWT.

Written from the claims nats-server documents and checks: the response is issued by the
callout's account key, for the server (`aud`: its id) and the per-connection user key the
request named (`sub`); the user JWT inside names the same user key, the account it is placed
in (`aud`, `$G` without accounts), its publish and subscribe permissions and an expiry, after
which the server closes the connection (the client reconnects, authenticating again).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from alnair.common import nkeys
from alnair.common.errors import PermanentError

REQUEST_AUDIENCE = "nats-authorization-request"
CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
GLOBAL_ACCOUNT = "$G"
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


class InvalidJwt(PermanentError):
    """A JWT that is not a valid, signed authorization request."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def encode(claims: dict[str, Any], issuer: nkeys.KeyPair) -> str:
    """Sign `claims` (their `nats` part typed and versioned) as `issuer`."""
    body = {**claims, "iss": issuer.public_key, "iat": int(time.time())}
    body.pop("jti", None)
    digest = hashlib.new("sha512_256", _json(body)).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signed = f"{_b64(_json(_HEADER))}.{_b64(_json(body))}"
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


@dataclass(frozen=True)
class AuthRequest:
    """What nats-server asks about one connection."""

    server_id: str
    user_nkey: str
    token: str
    client_name: str
    client_host: str


def decode_request(token: str) -> AuthRequest:
    """The authorization request in `token`, its signature checked against the server key it
    names; InvalidJwt otherwise."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise InvalidJwt("an authorization request has three parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except ValueError as exc:
        raise InvalidJwt(f"unreadable authorization request: {exc}") from exc
    if str(header.get("alg", "")).lower() != "ed25519-nkey":
        raise InvalidJwt(f"unexpected JWT algorithm {header.get('alg')!r}")
    issuer = str(claims.get("iss", ""))
    if not nkeys.verify(issuer, nkeys.SERVER, f"{parts[0]}.{parts[1]}".encode(), signature):
        raise InvalidJwt("authorization request not signed by the server it names")
    nats = claims.get("nats") or {}
    if claims.get("aud") != REQUEST_AUDIENCE or nats.get("type") != "authorization_request":
        raise InvalidJwt("not an authorization request")
    expires = claims.get("exp")
    if isinstance(expires, int) and expires < time.time():
        raise InvalidJwt("authorization request expired")
    server = nats.get("server_id") or {}
    opts = nats.get("connect_opts") or {}
    client = nats.get("client_info") or {}
    return AuthRequest(
        server_id=str(server.get("id", "")),
        user_nkey=str(nats.get("user_nkey", "")),
        token=str(opts.get("auth_token", "")),
        client_name=str(opts.get("name") or client.get("name") or ""),
        client_host=str(client.get("host", "")),
    )


@dataclass(frozen=True)
class Grant:
    """Whom a connection is admitted as, and what it may publish and subscribe to."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    ttl_s: int


def response(request: AuthRequest, issuer: nkeys.KeyPair, grant: Grant | None,
             error: str = "") -> str:  # fmt: skip
    """The signed answer to `request`: the user `grant` admits, or `error` (refused)."""
    answer: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if grant is not None:
        user = {
            "sub": request.user_nkey,
            "aud": GLOBAL_ACCOUNT,
            "name": grant.name,
            "exp": int(time.time()) + grant.ttl_s,
            "nats": {
                "type": "user", "version": 2,
                "pub": {"allow": list(grant.publish)},
                "sub": {"allow": list(grant.subscribe)},
                "subs": -1, "data": -1, "payload": -1,
            },
        }  # fmt: skip
        answer["jwt"] = encode(user, issuer)
    else:
        answer["error"] = error or "not authorized"
    claims = {"sub": request.user_nkey, "aud": request.server_id, "nats": answer}
    return encode(claims, issuer)
