"""The credentials component matches the permission tables, and what it refers to exists
(issue 16): the shipped nats.conf is exactly `nats_auth_conf()`, every Alnair workload of
every overlay connects as its own NATS (and Redis) user, and every Secret key a workload
reads is one `python -m alnair.common.credentials` creates.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alnair.common import nkeys
from alnair.common.busauth import AUDIENCE
from alnair.common.credentials import (
    CALLOUT_SECRET,
    NATS_SECRET,
    PREDICTOR_SECRET,
    REDIS_SECRET,
    WORKLOAD_USERS,
    env_key,
    generate,
    main,
    nats_auth_conf,
)
from alnair.common.natsauth import SERVICE_PERMISSIONS
from alnair.common.redisauth import SERVICE_USERS

REPO = Path(__file__).resolve().parents[3]
COMPONENT = REPO / "deploy" / "kustomize" / "components" / "credentials"
OVERLAYS = sorted(
    p.parent.name for p in (REPO / "deploy/kustomize/overlays").glob("*/kustomization.yaml")
)


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = Path(sys.executable).parent / "kubectl"
    done = subprocess.run(
        [str(kubectl), "kustomize", str(REPO / "deploy/kustomize/overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def secret_keys() -> dict[str, set[str]]:
    return {s["metadata"]["name"]: set(s["stringData"]) for s in generate()}


def test_shipped_nats_conf_is_the_permission_table() -> None:
    (doc,) = yaml.safe_load_all((COMPONENT / "nats-auth.yaml").read_text())
    assert doc["data"]["nats.conf"] == nats_auth_conf()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_connects_as_its_own_user(overlay: str) -> None:
    keys = secret_keys()
    seen = set()
    for obj in render(overlay):
        if obj["kind"] not in {"Deployment", "DaemonSet"}:
            continue
        name = obj["metadata"]["name"]
        assert name in WORKLOAD_USERS, f"{name} has no credentials in WORKLOAD_USERS"
        seen.add(name)
        nats_user, redis_user = WORKLOAD_USERS[name]
        pod = obj["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container.get("env", [])}
        if nats_user is None:
            # A node component: its pod's token for the bus's audience, no shared password.
            assert "ALNAIR_NATS_USER" not in env and "ALNAIR_NATS_PASSWORD" not in env
            path = Path(env["ALNAIR_NATS_TOKEN_FILE"]["value"])
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            (source,) = volume["projected"]["sources"]
            assert source["serviceAccountToken"]["audience"] == AUDIENCE
            assert source["serviceAccountToken"]["path"] == path.name
        else:
            assert env["ALNAIR_NATS_USER"]["value"] == nats_user
            assert nats_user in SERVICE_PERMISSIONS
            ref = env["ALNAIR_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == (NATS_SECRET, env_key("NATS_PW", nats_user))
        if redis_user is None:
            assert "ALNAIR_REDIS_USER" not in env
        else:
            assert redis_user in SERVICE_USERS
            assert env["ALNAIR_REDIS_USER"]["value"] == redis_user
        for var in env.values():
            secret = (var.get("valueFrom") or {}).get("secretKeyRef")
            if secret:
                assert secret["key"] in keys[secret["name"]], secret
    assert seen, overlay
    stateful = {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == "StatefulSet"}
    nats = stateful["nats"]["spec"]["template"]["spec"]
    command = nats["containers"][0]["command"]
    assert command[command.index("--config") + 1] == "/etc/nats-auth/nats.conf"
    assert {"secretRef": {"name": NATS_SECRET}} in nats["containers"][0]["envFrom"]
    # Redis loads the users' ACL file wherever the server starts from: the one server's
    # command line, or the infra-ha start script (a primary and its replica load the same).
    redis = stateful["redis"]["spec"]["template"]["spec"]["containers"][0]
    redis_env = {e["name"]: e for e in redis.get("env") or []}
    acl = redis_env["REDIS_ACL_FILE"]["value"]
    (users,) = [m for m in redis["volumeMounts"] if m["name"] == "users"]
    assert acl.startswith(users["mountPath"] + "/")
    maps = {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == "ConfigMap"}
    if "redis-sentinel" in stateful:
        script = maps["redis-ha-scripts"]["data"]["start-redis.sh"]
        assert (
            redis["command"][-1].endswith("start-redis.sh") and "aclfile $REDIS_ACL_FILE" in script
        )
        sentinel = stateful["redis-sentinel"]["spec"]["template"]["spec"]["containers"][0]
        names = {e["name"] for e in sentinel.get("env") or []}
        assert {"REDIS_PW_ALNAIR_SENTINEL", "SENTINEL_PASSWORD"} <= names
    else:
        assert "--aclfile" in redis["command"][-1] and "$REDIS_ACL_FILE" in redis["command"][-1]


def test_predictor_gets_its_model_key() -> None:
    (predictor,) = [
        o
        for o in render("production")
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "alnair-predictor"
    ]
    env = {e["name"]: e for e in predictor["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["ALNAIR_PREDICTOR_MODEL_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == PREDICTOR_SECRET


def test_generated_secrets_are_fresh_and_complete(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = generate(), generate()
    nats = first[0]["stringData"]
    assert set(nats) == {env_key("NATS_PW", u) for u in [*SERVICE_PERMISSIONS, "alnair-admin"]}
    assert first[0]["stringData"] != second[0]["stringData"]
    assert len(set(nats.values())) == len(nats)
    acl = first[1]["stringData"]["users.acl"]
    assert "user default off" in acl
    for user in SERVICE_USERS:
        assert f">{first[1]['stringData'][env_key('REDIS_PW', user)]} " in acl
    assert main(["--namespace", "ml-platform"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {s["metadata"]["name"] for s in printed} == {
        NATS_SECRET, REDIS_SECRET, PREDICTOR_SECRET, CALLOUT_SECRET,
    }  # fmt: skip
    # The callout's seed signs and its public key is what nats-server trusts: one pair.
    callout = first[3]["stringData"]
    issuer = nkeys.KeyPair.from_seed(callout["issuer-seed"])
    assert issuer.role == nkeys.ACCOUNT
    assert issuer.public_key == callout["NATS_CALLOUT_ISSUER"]
    assert all(s["metadata"]["namespace"] == "ml-platform" for s in printed)


def test_generated_passwords_are_strings_to_nats_server() -> None:
    # nats-server reads `$VAR` values as tokens: a leading digit or `-` makes it parse a number.
    from alnair.common.natsauth import new_password

    for _ in range(200):
        pw = new_password()
        assert pw[0].isalpha() and pw.isalnum() and len(pw) >= 32
