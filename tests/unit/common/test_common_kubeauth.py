"""Credentials that change: exec plugins (a real plugin process) and token files."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from alnair.common import kubeconfig
from alnair.common.errors import ConfigError
from alnair.common.kube import KubeClient
from alnair.common.kubeauth import ExecAuth, ExecPlugin, TokenFileAuth, parse_exec_credential
from alnair.common.kubeconfig import KubeConfig
from kube_auth_support import Plugin, write_kubeconfig

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def plugin_for(tmp_path: Path, api_version: str = V1) -> tuple[Plugin, ExecPlugin]:
    plugin = Plugin(tmp_path / "plugin")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        "https://127.0.0.1:6443",
        ca,
        {"exec": plugin.exec_section(api_version)},
    )
    config = KubeConfig.load(str(path))
    assert config.exec_plugin is not None
    return plugin, config.exec_plugin


# --- kubeconfig -------------------------------------------------------------------------------


def test_exec_section_is_read_with_cluster_info_for_the_plugin(tmp_path: Path) -> None:
    _, exec_plugin = plugin_for(tmp_path)
    assert exec_plugin.command == sys.executable
    assert exec_plugin.env == (("PLUGIN_FLAVOUR", "vanilla"),)
    info = json.loads(exec_plugin.exec_info())
    assert info["apiVersion"] == V1
    assert info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    cluster = info["spec"]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    ca = base64.b64decode(cluster["certificate-authority-data"])
    assert ca == (tmp_path / "ca.crt").read_bytes()


def test_relative_command_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    section = {"apiVersion": V1BETA1, "command": "./bin/get-token"}
    plugin = ExecPlugin.from_kubeconfig(section, {}, base=tmp_path, where="here")
    assert plugin.command == str(tmp_path / "bin/get-token")
    bare = ExecPlugin.from_kubeconfig({**section, "command": "aws"}, {}, base=tmp_path, where="x")
    assert bare.command == "aws"
    assert "cluster" not in json.loads(bare.exec_info())["spec"]


def test_every_bad_exec_field_is_named_at_once(tmp_path: Path) -> None:
    section = {
        "apiVersion": "client.authentication.k8s.io/v1alpha1",
        "command": "",
        "args": "--region eu",
        "env": [{"name": "A"}],
        "interactiveMode": "Always",
    }
    with pytest.raises(ConfigError) as info:
        ExecPlugin.from_kubeconfig(section, {}, base=tmp_path, where="kubeconfig k user 'u'")
    message = str(info.value)
    for part in (
        "kubeconfig k user 'u'",
        "exec.command=''",
        "exec.args='--region eu'",
        "exec.env[0]",
        "exec.apiVersion='client.authentication.k8s.io/v1alpha1'",
        "exec.interactiveMode='Always'",
    ):
        assert part in message


def test_exec_with_a_static_token_is_refused(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path / "plugin")
    path = write_kubeconfig(
        tmp_path / "kc", "https://h:1", None, {"exec": plugin.exec_section(), "token": "t"}
    )
    with pytest.raises(ConfigError, match="sets exec together with token"):
        KubeConfig.load(str(path))


def test_token_file_is_resolved_and_read(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    path = write_kubeconfig(
        tmp_path / "kc", "https://h:1", None, {"tokenFile": "token", "token": "stale"}
    )
    config = KubeConfig.load(str(path))
    assert config.token_file == str(tmp_path / "token")
    client = KubeClient(config)
    # The file wins over the inline token, and is sent per request, not by the session.
    assert "Authorization" not in client.headers
    assert isinstance(client.auth, TokenFileAuth)


def test_in_cluster_config_rereads_the_projected_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("projected-1")
    monkeypatch.setattr(kubeconfig, "SA_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = KubeConfig.load()
    assert (config.server, config.token, config.token_file) == (
        "https://10.0.0.1:443",
        None,
        str(tmp_path / "token"),
    )


def test_static_credentials_need_no_authenticator(tmp_path: Path) -> None:
    client = KubeClient(KubeConfig(server="https://h:1", token="static", insecure=True))
    assert client.auth is None
    assert client.headers["Authorization"] == "Bearer static"


# --- the plugin's answer ----------------------------------------------------------------------


def test_answer_with_token_and_expiry(tmp_path: Path) -> None:
    _, exec_plugin = plugin_for(tmp_path)
    out = json.dumps(
        {
            "apiVersion": V1,
            "kind": "ExecCredential",
            "status": {"token": "tok", "expirationTimestamp": "2030-01-02T03:04:05Z"},
        }
    ).encode()
    cred = parse_exec_credential(out, exec_plugin)
    assert cred.headers == {"Authorization": "Bearer tok"}
    assert cred.expires_at == 1893553445.0
    assert cred.ssl is None


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"apiVersion": V1BETA1, "kind": "ExecCredential", "status": {"token": "t"}}, "apiVersion"),
        ({"apiVersion": V1, "kind": "Other", "status": {"token": "t"}}, "kind='Other'"),
        ({"apiVersion": V1, "kind": "ExecCredential"}, "status is missing"),
        ({"apiVersion": V1, "kind": "ExecCredential", "status": {"x": 1}}, "neither token"),
        (
            {"apiVersion": V1, "kind": "ExecCredential", "status": {"clientCertificateData": "c"}},
            "come together",
        ),
        (
            {
                "apiVersion": V1,
                "kind": "ExecCredential",
                "status": {"token": "t", "expirationTimestamp": "tomorrow"},
            },
            "expirationTimestamp='tomorrow'",
        ),
        ({"apiVersion": V1, "kind": "ExecCredential", "status": {"token": 7}}, "status.token"),
    ],
)
def test_a_bad_answer_is_named(tmp_path: Path, doc: object, named: str) -> None:
    _, exec_plugin = plugin_for(tmp_path)
    with pytest.raises(ConfigError, match="bad ExecCredential") as info:
        parse_exec_credential(json.dumps(doc).encode(), exec_plugin)
    assert named in str(info.value)
    assert sys.executable in str(info.value)


def test_malformed_json_is_named_without_echoing_the_output(tmp_path: Path) -> None:
    _, exec_plugin = plugin_for(tmp_path)
    with pytest.raises(ConfigError, match="no valid ExecCredential JSON") as info:
        parse_exec_credential(b'{"status": {"token": "s3cr3t"', exec_plugin)
    assert "s3cr3t" not in str(info.value)


# --- running the plugin -----------------------------------------------------------------------


async def test_credential_is_cached_until_it_expires(tmp_path: Path) -> None:
    plugin, exec_plugin = plugin_for(tmp_path)
    plugin.plan({"status": {"token": "one"}, "ttl_s": 120}, {"status": {"token": "two"}})
    clock = Clock()
    auth = ExecAuth(exec_plugin, clock=clock)
    clock.now = time.time()
    first = await auth.credential()
    assert first.headers["Authorization"] == "Bearer one"
    assert await auth.credential() is first
    assert plugin.runs == 1
    assert plugin.env_seen() == {"PLUGIN_FLAVOUR": "vanilla"}
    assert plugin.exec_info()["spec"]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert first.expires_at is not None
    clock.now = first.expires_at
    second = await auth.credential()
    assert second.headers["Authorization"] == "Bearer two"
    assert plugin.runs == 2


async def test_a_rejected_credential_is_renewed_once(tmp_path: Path) -> None:
    plugin, exec_plugin = plugin_for(tmp_path, V1BETA1)
    plugin.plan({"status": {"token": "one"}}, {"status": {"token": "two"}})
    auth = ExecAuth(exec_plugin)
    first = await auth.credential()
    assert await auth.renew(first)
    renewed = await auth.credential()
    # A second request that failed with the same old credential does not run it again.
    assert await auth.renew(first)
    assert await auth.credential() is renewed
    assert (renewed.headers["Authorization"], plugin.runs) == ("Bearer two", 2)


async def test_a_failing_plugin_is_named_with_its_status_and_stderr(tmp_path: Path) -> None:
    plugin, exec_plugin = plugin_for(tmp_path)
    plugin.plan({"exit": 3, "stderr": "error: SSO session expired; run aws sso login\n"})
    with pytest.raises(ConfigError) as info:
        await ExecAuth(exec_plugin).credential()
    message = str(info.value)
    assert sys.executable in message
    assert "exited with status 3" in message
    assert "SSO session expired" in message
    assert info.value.fields["exit_code"] == 3


async def test_a_missing_plugin_shows_its_install_hint(tmp_path: Path) -> None:
    section = {
        "apiVersion": V1,
        "command": str(tmp_path / "no-such-plugin"),
        "installHint": "install it with: brew install no-such-plugin",
    }
    exec_plugin = ExecPlugin.from_kubeconfig(section, {}, base=tmp_path, where="w")
    with pytest.raises(ConfigError, match="could not be started") as info:
        await ExecAuth(exec_plugin).credential()
    assert "brew install no-such-plugin" in str(info.value)


async def test_a_hanging_plugin_is_stopped(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time; time.sleep(60)\n")
    section = {"apiVersion": V1, "command": sys.executable, "args": [str(script)]}
    exec_plugin = ExecPlugin.from_kubeconfig(section, {}, base=tmp_path, where="w")
    auth = ExecAuth(dataclasses.replace(exec_plugin, timeout_s=0.5))
    with pytest.raises(ConfigError, match=r"no credential within 0\.5s"):
        await auth.credential()


# --- token files ------------------------------------------------------------------------------


async def test_token_file_is_looked_at_again_only_after_recheck(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    clock = Clock()
    auth = TokenFileAuth(path, recheck_s=60, clock=clock)
    first = await auth.credential()
    assert first.headers == {"Authorization": "Bearer one"}
    # Replaced as the kubelet does (a new file renamed over the old one).
    (tmp_path / "token.new").write_text("two\n")
    os.replace(tmp_path / "token.new", path)
    clock.now += 59
    assert await auth.credential() is first
    clock.now += 1
    second = await auth.credential()
    assert second.headers == {"Authorization": "Bearer two"}
    reads = auth.reads
    clock.now += 60
    assert await auth.credential() is second
    assert auth.reads == reads  # unchanged file: one stat, no read


async def test_a_rejected_token_rereads_the_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    auth = TokenFileAuth(path, recheck_s=3600, clock=Clock())
    first = await auth.credential()
    # Unchanged file: retrying cannot help.
    assert not await auth.renew(first)
    path.write_text("two-longer")
    assert await auth.renew(first)
    assert (await auth.credential()).headers == {"Authorization": "Bearer two-longer"}


async def test_a_briefly_missing_token_file_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    clock = Clock()
    auth = TokenFileAuth(path, recheck_s=1, clock=clock)
    first = await auth.credential()
    path.unlink()
    clock.now += 2
    assert await auth.credential() is first


def test_an_unreadable_or_empty_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read token file .*nope"):
        TokenFileAuth(tmp_path / "nope")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="token file .*empty is empty"):
        TokenFileAuth(tmp_path / "empty")
