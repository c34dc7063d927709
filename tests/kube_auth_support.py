"""What the kube-auth tests share: an exec credential plugin they write and a kubeconfig for it.

The plugin is a real program (a Python script run by the real `exec` path). A JSON plan file
tells it what to answer on each run; it counts its runs in a file and keeps the last
KUBERNETES_EXEC_INFO it got, so a test can check what the client asked and how often.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

PLUGIN = """\
import datetime, json, os, pathlib, sys
here = pathlib.Path(sys.argv[1])
runs = here / "runs"
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
info = os.environ.get("KUBERNETES_EXEC_INFO", "")
(here / "exec-info.json").write_text(info)
(here / "env.json").write_text(json.dumps({"PLUGIN_FLAVOUR": os.environ.get("PLUGIN_FLAVOUR")}))
steps = json.loads((here / "plan.json").read_text())
step = steps[min(n, len(steps)) - 1]
if "stderr" in step:
    sys.stderr.write(step["stderr"])
if "exit" in step:
    sys.exit(step["exit"])
if "raw" in step:
    sys.stdout.write(step["raw"])
    sys.exit(0)
status = dict(step.get("status", {}))
if "ttl_s" in step:
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=step["ttl_s"])
    status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
api = json.loads(info)["apiVersion"] if info else "client.authentication.k8s.io/v1"
print(json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status}))
"""


class Plugin:
    """An exec plugin in `directory`; `plan(...)` sets its answers, one per run (last repeats)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.script = directory / "plugin.py"
        self.script.write_text(PLUGIN)

    def plan(self, *steps: dict[str, Any]) -> Plugin:
        (self.dir / "plan.json").write_text(json.dumps(list(steps)))
        return self

    @property
    def runs(self) -> int:
        path = self.dir / "runs"
        return int(path.read_text()) if path.exists() else 0

    def exec_info(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.dir / "exec-info.json").read_text())
        return doc

    def env_seen(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.dir / "env.json").read_text())
        return doc

    def exec_section(self, api_version: str = "client.authentication.k8s.io/v1") -> dict[str, Any]:
        return {
            "apiVersion": api_version,
            "command": sys.executable,
            "args": [str(self.script), str(self.dir)],
            "env": [{"name": "PLUGIN_FLAVOUR", "value": "vanilla"}],
            "provideClusterInfo": True,
            "interactiveMode": "Never",
        }


def write_kubeconfig(
    path: Path, server: str, ca_file: Path | None, user: dict[str, Any], **cluster: Any
) -> Path:
    """A one-context kubeconfig whose user section is `user`."""
    section: dict[str, Any] = {"server": server, **cluster}
    if ca_file is not None:
        section["certificate-authority"] = str(ca_file)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": section}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path
