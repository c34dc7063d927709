"""The bus's per-node identity, its parts alone: nkeys, the callout's JWTs, the grants, the
decisions (the e2e test `test_bus_node_identity.py` runs them against nats-server)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from alnair.common import natsjwt, nkeys
from alnair.common.busauth import NodeCallout, node_grant
from alnair.common.errors import ConfigError
from alnair.common.httpauth import Identity
from alnair.common.natsauth import server_config


def _claims(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


def test_nkeys_round_trip_and_refuse_a_damaged_key() -> None:
    account = nkeys.KeyPair.create(nkeys.ACCOUNT)
    assert account.public_key.startswith("A") and len(account.public_key) == 56
    assert account.seed.startswith("SA")
    again = nkeys.KeyPair.from_seed(account.seed)
    assert again.public_key == account.public_key and again.role == nkeys.ACCOUNT
    signature = account.sign(b"hello")
    assert nkeys.verify(account.public_key, nkeys.ACCOUNT, b"hello", signature)
    assert not nkeys.verify(account.public_key, nkeys.ACCOUNT, b"hullo", signature)
    assert not nkeys.verify(account.public_key, nkeys.USER, b"hello", signature)  # wrong role
    damaged = account.seed[:-3] + ("A" if account.seed[-3] != "A" else "B") + account.seed[-2:]
    with pytest.raises(ConfigError, match="checksum"):
        nkeys.KeyPair.from_seed(damaged)


def _request(server: nkeys.KeyPair, **nats: Any) -> str:
    user = nkeys.KeyPair.create(nkeys.USER)
    claims = {
        "sub": "AUTHACCOUNT", "aud": natsjwt.REQUEST_AUDIENCE, "exp": int(time.time()) + 5,
        "nats": {"type": "authorization_request", "version": 2,
                 "server_id": {"id": server.public_key, "name": "n"},
                 "user_nkey": user.public_key,
                 "connect_opts": {"auth_token": "tok", "name": "agent-a"},
                 "client_info": {"host": "10.0.0.7"}, **nats},
    }  # fmt: skip
    return natsjwt.encode(claims, server)


def test_a_request_is_read_only_when_the_server_it_names_signed_it() -> None:
    server = nkeys.KeyPair.create(nkeys.SERVER)
    token = _request(server)
    request = natsjwt.decode_request(token)
    assert (request.token, request.client_name, request.server_id) == (
        "tok", "agent-a", server.public_key)  # fmt: skip
    head, body, _ = token.split(".")
    forged = f"{head}.{body}.{natsjwt._b64(nkeys.KeyPair.create(nkeys.SERVER).sign(b'x'))}"
    with pytest.raises(natsjwt.InvalidJwt, match="not signed"):
        natsjwt.decode_request(forged)
    with pytest.raises(natsjwt.InvalidJwt, match="not an authorization request"):
        natsjwt.decode_request(_request(server, type="user"))
    with pytest.raises(natsjwt.InvalidJwt):
        natsjwt.decode_request("a.b")


def test_the_response_admits_the_requested_user_with_the_grant() -> None:
    server = nkeys.KeyPair.create(nkeys.SERVER)
    issuer = nkeys.KeyPair.create(nkeys.ACCOUNT)
    request = natsjwt.decode_request(_request(server))
    grant = node_grant("profiler-agent", "node-a", 600)
    answer = _claims(natsjwt.response(request, issuer, grant))
    assert (answer["sub"], answer["aud"], answer["iss"]) == (
        request.user_nkey, server.public_key, issuer.public_key)  # fmt: skip
    user = _claims(answer["nats"]["jwt"])
    assert (user["sub"], user["aud"], user["name"]) == (request.user_nkey, "$G", grant.name)
    assert user["nats"]["pub"]["allow"] == list(grant.publish)
    assert 0 < user["exp"] - time.time() <= 600
    refused = _claims(natsjwt.response(request, issuer, None, "no"))
    assert refused["nats"] == {"type": "authorization_response", "version": 2, "error": "no"}


def test_a_node_grant_names_its_node_alone() -> None:
    agent = node_grant("profiler-agent", "ip-10-0-0-1.ec2.internal", 60)
    token = "ip-10-0-0-1_ec2_internal"
    for subject in agent.publish:
        assert subject.startswith("$JS.API.") or token in subject, subject
    assert agent.subscribe == (f"_INBOX_{token}.>",)
    plugin = node_grant("deviceplugin", "node-a", 60)
    assert "$JS.API.CONSUMER.MSG.NEXT.HEALTH.deviceplugin-node-a" in plugin.publish
    assert not any(s.split(".")[-1] == ">" and "HEALTH" in s and "node-a" not in s
                   for s in plugin.publish)  # fmt: skip
    with pytest.raises(ConfigError):
        node_grant("scheduler", "node-a", 60)


async def test_the_callout_admits_node_components_of_their_node_only() -> None:
    server = nkeys.KeyPair.create(nkeys.SERVER)
    issuer = nkeys.KeyPair.create(nkeys.ACCOUNT)
    who: dict[str, Identity | None] = {
        "tok": Identity("system:serviceaccount:alnair-system:alnair-profiler-agent", node="a"),
    }

    async def review(token: str) -> Identity | None:
        return who.get(token)

    decisions: list[str] = []
    callout = NodeCallout(issuer, review, {who["tok"].username: "profiler-agent"},  # type: ignore[union-attr]
                          on_decision=decisions.append)  # fmt: skip
    admitted = _claims(await callout.answer(_request(server)))
    assert _claims(admitted["nats"]["jwt"])["name"] == "profiler-agent@a"
    who["tok"] = Identity("system:serviceaccount:alnair-system:alnair-profiler-agent")
    unbound = _claims(await callout.answer(_request(server)))
    assert "bound to no node" in unbound["nats"]["error"]
    who["tok"] = Identity("system:serviceaccount:team-a:default", node="a")
    stranger = _claims(await callout.answer(_request(server)))
    assert "is not a node component" in stranger["nats"]["error"]
    who["tok"] = None
    invalid = _claims(await callout.answer(_request(server)))
    assert "not valid for the audience alnair-bus" in invalid["nats"]["error"]
    assert decisions == ["admitted", "refused", "refused", "refused"]
    with pytest.raises(ConfigError):
        NodeCallout(nkeys.KeyPair.create(nkeys.USER), review, {})


def test_the_server_config_hands_every_other_connection_to_the_callout() -> None:
    conf = server_config({"scheduler": "pw1", "bus-auth": "pw2"}, callout_issuer="$ISSUER")
    assert "auth_callout {\n    issuer: $ISSUER\n" in conf
    assert 'auth_users: ["bus-auth", "scheduler"]' in conf
    assert "auth_callout" not in server_config({"scheduler": "pw"})
