"""Who may say what on the bus: one NATS user per service, limited to the subjects of its events.

Without this, any pod that reaches NATS can publish a GPU-unhealthy event (the device plugin
then withdraws the GPU) or a fake job completion. The table below is DESIGN.md's event table
turned into permissions; `server_config` renders it as the `authorization` block of a
nats-server configuration (used by `localstack.NatsServer(users=...)` and by the deploy
manifests), and `NatsCredentials` is what a service presents when it connects (from
`ALNAIR_NATS_USER`/`ALNAIR_NATS_PASSWORD`, a `.creds` file, and TLS settings).

What the permissions can and cannot express:
- Publishing an event is limited exactly: only the profiler agent may publish
  `alnair.health.>`, only the job-event owners `alnair.jobs.>`, and so on.
- JetStream consumers read through the JetStream API (`$JS.API.CONSUMER...` with replies to
  the client's `_INBOX`), not by subscribing to the event subject, so reading a stream cannot
  be narrowed per user with subject permissions alone; every service may use the JetStream
  API except its destructive verbs (deleting or purging streams, deleting messages or
  consumers), which stay with the operator's admin user.
- Request-reply servers (the predictor) answer through `allow_responses`, which permits a
  publish only to the reply subject of a request just received.
"""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alnair.common.errors import ConfigError

INBOX = "_INBOX.>"
JS_API = "$JS.API.>"
JS_DESTRUCTIVE = (
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.CONSUMER.DELETE.>",
)
# Every bus client: the JetStream API (streams ensured at start, consumers, KV reads), acks
# and flow control of its consumers, the idempotence bucket, the dead-letter subjects.
_BUS_PUBLISH = (JS_API, "$JS.ACK.>", "$JS.FC.>", "$KV.alnair-handled.>", "alnair.dlq.>")

METRICS = "alnair.metrics.pod.>"
SUMMARIES = "alnair.summaries.pod.>"
HEALTH = "alnair.health.>"
JOBS = "alnair.jobs.>"
SCALE = "alnair.scale.>"
PREDICT = "alnair.predict"
PREDICT_ALL = ("alnair.predict", "alnair.predict.>")
INVENTORY_WRITE = "$KV.gpu-inventory.>"
COLOCATION_WRITE = "$KV.alnair-colocation.>"
CALLOUT = "$SYS.REQ.USER.AUTH"


@dataclass(frozen=True)
class Permissions:
    """Subjects one user may publish to and subscribe to, beyond what every bus client needs."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    respond: bool = False
    """May answer requests it received (`allow_responses`): request-reply servers."""
    bus: bool = True
    """Uses the bus's streams (the JetStream API, acks, idempotence keys, dead letters)."""

    def render(self) -> dict[str, object]:
        publish = [*_BUS_PUBLISH, *self.publish] if self.bus else list(self.publish)
        doc: dict[str, object] = {
            "publish": {"allow": publish, "deny": list(JS_DESTRUCTIVE)},
            "subscribe": {"allow": [INBOX, *self.subscribe]},
        }
        if self.respond:
            doc["allow_responses"] = True
        return doc


SERVICE_PERMISSIONS: dict[str, Permissions] = {
    # node agent: samples, pod summaries (JetStream), health and the node's inventory
    "profiler-agent": Permissions(publish=(METRICS, SUMMARIES, HEALTH, INVENTORY_WRITE)),
    # aggregator: folds samples (core NATS queue group) and pod summaries (a JetStream
    # consumer: read through the JetStream API, no subject right), publishes job completions
    "aggregator": Permissions(publish=(JOBS,), subscribe=(METRICS,)),
    # binder: samples and health in, job and scale events out, asks the predictor; job events
    # in too, plainly subscribed, for the console's live updates
    "scheduler": Permissions(publish=(JOBS, SCALE, *PREDICT_ALL), subscribe=(METRICS, JOBS)),
    # dispatcher: job lifecycle out, asks the predictor, asks elastic jobs to give back the
    # borrowed surplus (scale requests)
    "dispatcher": Permissions(publish=(JOBS, SCALE, *PREDICT_ALL)),
    # the bus's auth callout (busauth): answers nats-server's authorization requests only
    "bus-auth": Permissions(subscribe=(CALLOUT,), respond=True, bus=False),
    # predictor: consumes job events, answers predictions, writes the co-location table;
    # publishes no event
    "predictor": Permissions(publish=(COLOCATION_WRITE,), subscribe=PREDICT_ALL, respond=True),
    # elastic controller: scale requests in, scale outcomes out
    "elastic": Permissions(publish=(SCALE,)),
    # device plugin: health (JetStream) and its containers' utilisation samples in
    "deviceplugin": Permissions(subscribe=(METRICS,)),
}
"""DESIGN.md's event table as permissions, one user per service (the user name is the key)."""


def new_password() -> str:
    """A random password nats-server reads back as a string. It substitutes `$VAR` from its
    environment and parses the value as a token: one starting with a digit or `-` (which
    `secrets.token_urlsafe` gives about one time in six) is read as a number and refused, so
    every password starts with letters."""
    return "pw" + secrets.token_hex(24)


ADMIN_USER = "alnair-admin"
"""The operator's user: every subject, destructive JetStream verbs included (tools, tests)."""


def server_config(
    users: Mapping[str, str],
    *,
    listen: str | None = None,
    store_dir: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    callout_issuer: str | None = None,
) -> str:
    """A nats-server configuration whose `authorization` block holds `users` (name -> password).

    Every name must be a service of `SERVICE_PERMISSIONS` or `ADMIN_USER`. A password of the
    form `$NAME` is left for nats-server to read from its environment (a Kubernetes Secret),
    so the rendered file itself may live in a ConfigMap.
    """
    entries: list[dict[str, object]] = []
    for user, password in sorted(users.items()):
        if user != ADMIN_USER and user not in SERVICE_PERMISSIONS:
            known = ", ".join(sorted([*SERVICE_PERMISSIONS, ADMIN_USER]))
            raise ConfigError(f"unknown NATS user {user!r}; known: {known}", user=user)
        if not password:
            raise ConfigError(f"NATS user {user!r} has an empty password", user=user)
        entry: dict[str, object] = {"user": user, "password": password}
        if user != ADMIN_USER:
            entry["permissions"] = SERVICE_PERMISSIONS[user].render()
        entries.append(entry)
    lines = []
    if listen is not None:
        lines.append(f"listen: {json.dumps(listen)}")
    if store_dir is not None:
        lines.append(f"jetstream {{ store_dir: {json.dumps(str(store_dir))} }}")
    if tls_cert is not None and tls_key is not None:
        cert, key = json.dumps(str(tls_cert)), json.dumps(str(tls_key))
        lines.append(f"tls {{ cert_file: {cert}, key_file: {key} }}")
    body = json.dumps(entries, indent=2)
    # `$NAME` must stay unquoted for nats-server to substitute it from the environment.
    for password in users.values():
        if password.startswith("$"):
            body = body.replace(json.dumps(password), password)
    callout = ""
    if callout_issuer is not None:
        # Every static user bypasses the callout; any other connection (a node component's
        # token) is handed to it, and admitted only as the user it signs.
        bypass = json.dumps(sorted(users))
        callout = (
            f"\n  auth_callout {{\n    issuer: {callout_issuer}\n    auth_users: {bypass}\n  }}"
        )
    lines.append(f"authorization {{\n  users = {body}{callout}\n}}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class NatsCredentials:
    """What a client presents when it connects (all optional: an open server needs none)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    creds_file: Path | None = None
    """A `.creds` file (JWT + nkey seed) for operator-mode servers."""
    tls_ca_file: Path | None = None
    """CA that signed the server's certificate; set: the connection uses TLS."""
    tls_hostname: str | None = None
    """The name every server's certificate is checked against, whatever address the client
    dials: a cluster's servers advertise their peers by IP address, which certificates for
    Service names do not carry."""
    token_file: Path | None = None
    """A token read at each (re)connect (a projected ServiceAccount token rotates): what a
    node component presents to the bus's auth callout (`alnair.common.busauth`)."""
    inbox_prefix: str | None = None
    """Where replies to this connection's requests go (a node component's own prefix)."""

    def connect_options(self) -> dict[str, object]:
        """Keyword arguments for `nats.connect`."""
        opts: dict[str, object] = {}
        if self.user is not None:
            if self.password is None:
                raise ConfigError("ALNAIR_NATS_USER is set without ALNAIR_NATS_PASSWORD")
            opts["user"] = self.user
            opts["password"] = self.password
        if self.creds_file is not None:
            if not self.creds_file.is_file():
                raise ConfigError(
                    f"NATS credentials file {str(self.creds_file)!r} does not exist",
                    path=str(self.creds_file),
                )
            opts["user_credentials"] = str(self.creds_file)
        if self.tls_ca_file is not None:
            opts["tls"] = ssl.create_default_context(cafile=str(self.tls_ca_file))
            if self.tls_hostname:
                opts["tls_hostname"] = self.tls_hostname
        if self.token_file is not None:
            path = self.token_file
            if not path.is_file():
                raise ConfigError(f"NATS token file {str(path)!r} does not exist", path=str(path))
            opts["token"] = lambda: path.read_text().strip()
        if self.inbox_prefix is not None:
            opts["inbox_prefix"] = self.inbox_prefix
        return opts
