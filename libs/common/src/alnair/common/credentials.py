"""The Secrets a deployment needs, generated with fresh random values, and what refers to them.

`python -m alnair.common.credentials [--namespace alnair-system] | kubectl apply -f -` once,
before applying an overlay with the `credentials` component. It prints four Secrets:
- `alnair-nats-users`: one password per NATS user (`NATS_PW_<USER>`), read by nats-server
  from its environment (the component's `nats.conf` names them as `$NATS_PW_<USER>`) and by
  each service as `ALNAIR_NATS_PASSWORD`;
- `alnair-redis-users`: the Redis ACL file (`users.acl`, `alnair.common.redisauth`) and each
  user's password (`REDIS_PW_<USER>`, the services' `ALNAIR_REDIS_PASSWORD`);
- `alnair-predictor`: the key that signs stored model blobs (`model-key`);
- `alnair-nats-callout`: the nkey of the account that signs node components' bus users
  (`issuer-seed`, read by the profiler's bus-auth alone) and its public key
  (`NATS_CALLOUT_ISSUER`, which nats-server's `auth_callout` names).
Nothing secret is in the repository; rotating means running this again and restarting.

`nats_auth_conf` renders the component's NATS configuration and `WORKLOAD_USERS` says which
workload connects as which user; the manifests are tested against both, so the deploy files
cannot drift from the permission tables.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

import yaml

from alnair.common import nkeys
from alnair.common.natsauth import ADMIN_USER as NATS_ADMIN
from alnair.common.natsauth import SERVICE_PERMISSIONS, new_password, server_config
from alnair.common.redisauth import ADMIN_USER as REDIS_ADMIN
from alnair.common.redisauth import INFRA_USERS, SERVICE_USERS, acl_file

# Names of Secret objects, not secrets.
NATS_SECRET = "alnair-nats-users"  # noqa: S105
REDIS_SECRET = "alnair-redis-users"  # noqa: S105
PREDICTOR_SECRET = "alnair-predictor"  # noqa: S105
CALLOUT_SECRET = "alnair-nats-callout"  # noqa: S105
MODEL_KEY = "model-key"
SENTINEL_PASSWORD_KEY = "SENTINEL_PASSWORD"  # noqa: S105 (a key of the Secret, not a secret)
NATS_BASE_CONF = "../nats/nats.conf"
"""The infra component's nats.conf, as seen from where the credentials component mounts its own
(`/etc/nats-auth` beside `/etc/nats`): nats-server resolves includes relative to the file."""

WORKLOAD_USERS: dict[str, tuple[str | None, str | None]] = {
    "alnair-scheduler": ("scheduler", None),
    "alnair-dispatcher": ("dispatcher", None),
    "alnair-elastic": ("elastic", None),
    "alnair-predictor": ("predictor", "predictor"),
    "alnair-profiler-aggregator": ("aggregator", "aggregator"),
    "alnair-profiler-agent": (None, None),
    "alnair-profiler-agent-sim": ("profiler-agent", None),
    "alnair-deviceplugin": (None, None),
    "alnair-bus-auth": ("bus-auth", None),
}
"""Workload name -> (its NATS user, or None for a node component, which connects with its
pod's token as its node (`alnair.common.busauth`); its Redis user or None)."""


def env_key(prefix: str, user: str) -> str:
    """`NATS_PW_PROFILER_AGENT` for ("NATS_PW", "profiler-agent"): a valid variable name."""
    return f"{prefix}_{user.upper().replace('-', '_')}"


def nats_users() -> list[str]:
    return [*SERVICE_PERMISSIONS, NATS_ADMIN]


def redis_users() -> list[str]:
    return [*SERVICE_USERS, REDIS_ADMIN, *INFRA_USERS]


def nats_auth_conf() -> str:
    """The credentials component's nats.conf: the infra one plus every user, passwords read
    from nats-server's environment (the `alnair-nats-users` Secret)."""
    refs = {user: f"${env_key('NATS_PW', user)}" for user in nats_users()}
    return f"include {NATS_BASE_CONF}\n" + server_config(
        refs, callout_issuer="$NATS_CALLOUT_ISSUER"
    )


def _secret(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "alnair"},
        },
        "type": "Opaque",
        "stringData": data,
    }


def generate(namespace: str = "alnair-system", redis_major: int = 7) -> list[dict[str, Any]]:
    """The three Secrets, with fresh random passwords and key; the ACL file in the syntax of
    Redis `redis_major` (the infra component ships 7)."""
    nats = {env_key("NATS_PW", u): new_password() for u in nats_users()}
    redis_pw = {u: new_password() for u in redis_users()}
    redis = {env_key("REDIS_PW", u): pw for u, pw in redis_pw.items()}
    redis["users.acl"] = acl_file(redis_pw, redis_major=redis_major)
    # The Sentinels' own password (the infra-ha component): asked of clients and each other.
    redis[SENTINEL_PASSWORD_KEY] = new_password()
    issuer = nkeys.KeyPair.create(nkeys.ACCOUNT)
    return [
        _secret(NATS_SECRET, namespace, nats),
        _secret(REDIS_SECRET, namespace, redis),
        _secret(PREDICTOR_SECRET, namespace, {MODEL_KEY: secrets.token_hex(32)}),
        _secret(
            CALLOUT_SECRET,
            namespace,
            {"issuer-seed": issuer.seed, "NATS_CALLOUT_ISSUER": issuer.public_key},
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m alnair.common.credentials",
        description="Print the Secrets of an Alnair deployment, with fresh random values.",
    )
    parser.add_argument("--namespace", default="alnair-system")
    parser.add_argument(
        "--redis-major",
        type=int,
        default=7,
        help="major version of your Redis (6: no read-only key selectors in the ACL)",
    )
    args = parser.parse_args(argv)
    yaml.safe_dump_all(generate(args.namespace, args.redis_major), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
