"""Per-node identity on the bus: a NATS auth callout that admits a node component (the profiler
agent, the device plugin) as that node only.

The node components connect with their pod's ServiceAccount token (projected by the kubelet,
bound to the pod and so to its node) instead of a shared password. nats-server hands each such
connection to this service (`$SYS.REQ.USER.AUTH`); it asks the API server who the token is
(TokenReview, for the audience `alnair-bus`), and admits it only when it is one of the node
components' accounts and the token names its node (`authentication.kubernetes.io/node-name`).
The user it issues (a signed JWT, `natsjwt`) may publish and subscribe only that node's
subjects: its samples, summaries, health and inventory key, its own durable consumer and
handled-event keys, and inboxes under a prefix of its own. Node A's agent can no longer speak
for node B, read node B's inventory watch or pull another service's durable: nats-server
refuses each.

Services with a static user (everything that is not per node) bypass the callout
(`auth_users`); only the issuer's seed signs users, and it never leaves this service.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from alnair.common import nkeys
from alnair.common.errors import ConfigError, PermanentError
from alnair.common.events import (
    GpuHealthChanged,
    GpuInventory,
    PodMetric,
    PodSummary,
    subject_token,
)
from alnair.common.httpauth import Identity
from alnair.common.kube import Unavailable
from alnair.common.natsauth import NatsCredentials
from alnair.common.natsjwt import CALLOUT_SUBJECT, AuthRequest, Grant, decode_request, response

log = logging.getLogger(__name__)

AUDIENCE = "alnair-bus"
"""The audience a node component's bus token is minted for (not the API server's: a token
the bus receives cannot be replayed against the cluster)."""
HANDLED = "alnair-handled"
DLQ = "alnair.dlq"


def node_inbox(node: str) -> str:
    """The inbox prefix a node component's connection uses (replies to it land there only)."""
    return f"_INBOX_{subject_token(node)}"


def for_node(credentials: NatsCredentials, node: str) -> NatsCredentials:
    """A node component's credentials: with a token (its node's identity), replies to it go
    to its node's inbox prefix, the only one it may subscribe to."""
    if credentials.token_file is None:
        return credentials
    return replace(credentials, inbox_prefix=node_inbox(node))


def deviceplugin_durable(node: str) -> str:
    return f"deviceplugin-{subject_token(node)}"


def node_grant(component: str, node: str, ttl_s: int) -> Grant:
    """What a node component on `node` may do on the bus, and nothing of another node's."""
    t = subject_token(node)
    inbox = node_inbox(node)
    inventory = f"$KV.{GpuInventory.BUCKET}.{t}"
    publish: tuple[str, ...]
    # Finding streams and buckets (never creating or changing them: the services with a
    # static user do that), and answers to its own requests.
    common = ("$JS.API.INFO", "$JS.API.STREAM.INFO.*")
    if component == "profiler-agent":
        publish = (
            *common,
            f"{PodMetric.SUBJECT_PREFIX}.{t}",
            f"{PodSummary.SUBJECT_PREFIX}.{t}",
            f"{GpuHealthChanged.SUBJECT_PREFIX}.{t}.>",
            inventory,
        )
        return Grant(f"profiler-agent@{node}", publish, (f"{inbox}.>",), ttl_s)
    if component == "deviceplugin":
        durable = deviceplugin_durable(node)
        health = GpuHealthChanged.STREAM
        kv_stream = f"KV_{GpuInventory.BUCKET}"
        publish = (
            *common,
            # its durable consumer on the HEALTH stream, and nobody else's
            f"$JS.API.CONSUMER.CREATE.{health}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{health}.{durable}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{health}.{durable}",
            f"$JS.API.CONSUMER.INFO.{health}.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{health}.{durable}",
            f"$JS.ACK.{health}.{durable}.>",
            # its handled-event keys, and its dead letters
            # (writes only its own keys; the read names the key in its body, not the subject)
            f"$KV.{HANDLED}.{durable}.>",
            f"$JS.API.STREAM.MSG.GET.KV_{HANDLED}",
            f"{DLQ}.{durable}",
            # a watch of the inventory (an unnamed consumer, whose filter is in the request's
            # body: the subject cannot name the key; what it reads is no secret, and what it
            # applies is only its own node's, `GpuInventory.read`)
            f"$JS.API.CONSUMER.CREATE.{kv_stream}",
            f"$JS.API.CONSUMER.INFO.{kv_stream}.*",
            f"$JS.FC.{kv_stream}.>",
        )
        subscribe = (f"{inbox}.>", f"{PodMetric.SUBJECT_PREFIX}.{t}")
        return Grant(f"deviceplugin@{node}", publish, subscribe, ttl_s)
    raise ConfigError(f"no node permissions for {component!r}", component=component)


Review = Callable[[str], Awaitable[Identity | None]]
"""Ask who a token is (`TokenReviewer.review`): None for a token the API server does not
authenticate; raises `Unavailable` when it cannot be asked."""


class NodeCallout:
    """Answers nats-server's authorization requests for node components."""

    def __init__(
        self,
        issuer: nkeys.KeyPair,
        review: Review,
        accounts: dict[str, str],
        ttl_s: int = 3600,
        on_decision: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        if issuer.role != nkeys.ACCOUNT:
            raise ConfigError("the callout issuer must be an account nkey")
        self.issuer = issuer
        self.review = review
        self.accounts = accounts
        """ServiceAccount username -> node component (`node_grant`)."""
        self.ttl_s = ttl_s
        self.on_decision = on_decision
        """Told `admitted` or `refused` once per connection (metrics)."""
        self.admitted = 0
        self.refused = 0

    async def answer(self, token: str) -> str:
        """The signed response to the authorization request `token` (never raises for a bad
        client: a refusal is a response carrying the reason)."""
        request = decode_request(token)
        grant, why = await self._decide(request)
        if grant is None:
            self.refused += 1
            self.on_decision("refused")
            where = {"client": request.client_name, "host": request.client_host}
            log.warning("bus connection refused", extra={**where, "reason": why})
        else:
            self.admitted += 1
            self.on_decision("admitted")
            log.info(
                "bus connection admitted", extra={"as": grant.name, "host": request.client_host}
            )
        return response(request, self.issuer, grant, why)

    async def _decide(self, request: AuthRequest) -> tuple[Grant | None, str]:
        if not request.token:
            return None, "no token: node components connect with their ServiceAccount token"
        try:
            who = await self.review(request.token)
        except Unavailable as exc:
            return None, f"the API server could not review the token: {exc}"
        if who is None:
            return None, f"the token is not valid for the audience {AUDIENCE}"
        component = self.accounts.get(who.username)
        if component is None:
            return None, f"{who.username} is not a node component"
        if not who.node:
            return None, f"{who.username}'s token is bound to no node"
        return node_grant(component, who.node, self.ttl_s), ""

    async def serve(self, nc: NatsClient, queue: str = "alnair-bus-auth") -> None:
        """Answer every request on the callout subject until cancelled (replicas share them
        through a queue group)."""

        async def on_request(msg: Msg) -> None:
            try:
                answer = await self.answer(msg.data.decode())
            except PermanentError as exc:
                log.error("unreadable authorization request", extra={"error": str(exc)})
                return  # nats-server times the connection out: nothing to sign for it
            await msg.respond(answer.encode())

        sub = await nc.subscribe(CALLOUT_SUBJECT, queue=queue, cb=on_request)
        try:
            await asyncio.Event().wait()
        finally:
            await sub.unsubscribe()


NODE_ACCOUNTS = {
    "system:serviceaccount:alnair-system:alnair-profiler-agent": "profiler-agent",
    "system:serviceaccount:alnair-system:alnair-deviceplugin": "deviceplugin",
}
"""The shipped node components' accounts (deploy/kustomize/base)."""


def issuer_from_env(var: str = "ALNAIR_BUS_AUTH_ISSUER_SEED") -> nkeys.KeyPair:
    seed = os.environ.get(var, "")
    if not seed:
        raise ConfigError(f"{var} is not set: the callout needs its account seed to sign users")
    return nkeys.KeyPair.from_seed(seed)
