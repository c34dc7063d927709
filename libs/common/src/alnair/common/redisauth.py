"""Redis ACL users: each service touches only its own keys, with only the commands it uses.

Without this, anyone who reaches Redis can rewrite execution records (and so the predictor's
training data), swap the serving model pointer, or FLUSHALL. Two services use Redis:
- the aggregator (profiler) owns its per-pod working keys and writes execution records;
- the predictor reads execution records and owns its model store (`alnair:predictor:*`).

`acl_file` renders the users as a Redis ACL file (`redis-server --aclfile`), with the default
user switched off so a client without credentials can run nothing. Record keys are read-only
for the predictor through Redis 7's `%R~` key selectors; Redis 6.2 has no per-command key
selectors, so there the predictor's access to record keys includes writes (the deploy manifests
ship Redis 7; the local test server is 6.2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from alnair.common.errors import ConfigError

_COMMANDS = "-@all +@read +@write +@transaction +@connection +@scripting -@dangerous"
"""What a service may run: data reads and writes, MULTI/EXEC, scripts, its connection; never
the administrative or dangerous ones (FLUSHALL, CONFIG, KEYS, DEBUG, ACL, SHUTDOWN...)."""


@dataclass(frozen=True)
class RedisUser:
    """The keys one service may read and write, and those it may only read."""

    keys: tuple[str, ...]
    read_only_keys: tuple[str, ...] = ()

    def rules(self, redis_major: int = 7) -> str:
        keys = [f"~{k}" for k in self.keys]
        prefix = "%R~" if redis_major >= 7 else "~"
        keys += [f"{prefix}{k}" for k in self.read_only_keys]
        return f"{' '.join(keys)} {_COMMANDS}"


RECORD_KEYS = ("alnair:record:*", "alnair:records")

SERVICE_USERS: dict[str, RedisUser] = {
    "aggregator": RedisUser(
        keys=(
            "alnair:pod:*",
            "alnair:owner:*",
            "alnair:owner-by-name:*",
            "alnair:done:*",
            *RECORD_KEYS,
        )
    ),
    "predictor": RedisUser(keys=("alnair:predictor:*",), read_only_keys=RECORD_KEYS),
}
"""One Redis user per service that uses Redis (the user name is the key)."""

ADMIN_USER = "alnair-admin"
"""The operator's user: every key and command (backups, tools, tests)."""

REPLICATION_USER = "alnair-replication"
"""What a replica authenticates to its primary as (its `masteruser`): replication only."""

SENTINEL_USER = "alnair-sentinel"
"""What the Sentinels authenticate to the primary and replicas as (their `auth-user`): the
commands Redis documents for monitoring and failover, no keys."""

INFRA_USERS: dict[str, str] = {
    REPLICATION_USER: "+psync +replconf +ping",
    SENTINEL_USER: (
        "allchannels +multi +slaveof +ping +exec +subscribe +config|rewrite +role +publish "
        "+info +client|setname +client|kill +script|kill"
    ),
}
"""The users of Redis's own replication and failover (no keys), with their rules. Every server
of a replicated Redis loads the same ACL file: a promoted replica must know every user."""


def acl_file(users: Mapping[str, str], *, redis_major: int = 7) -> str:
    """A Redis ACL file holding `users` (name -> password) and no usable default user."""
    lines = ["user default off nopass -@all"]
    for user, password in sorted(users.items()):
        if not password or any(c.isspace() for c in password):
            raise ConfigError(f"Redis user {user!r}: password empty or with spaces", user=user)
        if user == ADMIN_USER:
            lines.append(f"user {user} on >{password} ~* &* +@all")
            continue
        if user in INFRA_USERS:
            lines.append(f"user {user} on >{password} -@all {INFRA_USERS[user]}")
            continue
        spec = SERVICE_USERS.get(user)
        if spec is None:
            known = ", ".join(sorted([*SERVICE_USERS, ADMIN_USER, *INFRA_USERS]))
            raise ConfigError(f"unknown Redis user {user!r}; known: {known}", user=user)
        lines.append(f"user {user} on >{password} {spec.rules(redis_major)}")
    return "\n".join(lines) + "\n"
