"""The README walkthrough, command for command: `make up`, a GPU Job through kubectl, the
scheduler's explanation, the profiler's gauges and the aggregator's profile, the Job's
annotations and execution record, the predictor retrained on it and predicting, `make down`.

The stack lives in a temporary folder on free ports (`ALNAIR_DEV_DIR`, `FREE_PORTS=1`), so it
never meets a developer's own `make up`; the commands get the environment `source <dir>/env`
would give them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alnair.dev.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
JOB = "docs/walkthrough/train-job.yaml"


class Shell:
    """Runs the README's commands in the repository with the stack's environment."""

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir
        self.env = {**os.environ, "ALNAIR_DEV_DIR": str(dev_dir)}

    def __call__(self, *argv: str, check: bool = True, timeout: float = 300) -> str:
        done = subprocess.run(
            argv,
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done.stdout + done.stderr

    def source_env(self) -> None:
        """What `source .dev/env` and `export PATH=$PWD/.venv/bin:$PATH` do for the commands
        that follow."""
        for line in (self.dev_dir / "env").read_text().splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                self.env[name] = value
        self.env["PATH"] = f"{BIN}:{self.env['PATH']}"

    def url(self, service: str) -> str:
        return self.env[f"ALNAIR_{service.upper().replace('-', '_')}_URL"]

    def curl_json(self, *args: str) -> Any:
        return json.loads(self("curl", "-sf", *args))


def eventually(probe: Callable[[], Any], what: str, timeout_s: float = 90) -> Any:
    """`waiting.wait_for` for this test's blocking shell probes (outside views of asynchronous
    work): the first truthy answer of `probe`."""
    return asyncio.run(wait_for(probe, timeout_s, 0.5, what=what))


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    shell = Shell(tmp_path / "dev")
    try:
        yield shell
    finally:
        shell("make", "down", check=False, timeout=120)


def test_readme_walkthrough(sh: Shell) -> None:
    up = sh("make", "up", "FREE_PORTS=1", "NODES=2x V100M32:4, 1x T4:4", timeout=420)
    assert "Alnair is up" in up, up
    for service in ("scheduler", "predictor", "profiler-agent", "aggregator"):
        assert f"{service}:" in up
    assert "/docs" in up and "/metrics" in up and "export KUBECONFIG=" in up
    # idempotent: a second `make up` finds everything running and starts nothing new
    again = sh("make", "up", "FREE_PORTS=1")
    assert "already up" in again
    status = sh("make", "status")
    assert "all up" in status and status.count(" ready ") >= 4, status

    sh.source_env()
    nodes = sh("kubectl", "get", "nodes", "-L", "alnair.io/gpu-model,alnair.io/gpu-count")
    assert nodes.count("V100M32") == 2 and "T4" in nodes, nodes

    # Submit.
    assert "job.batch/resnet50 created" in sh("kubectl", "apply", "-f", JOB)

    # Bound, and explained.
    def pod_and_node() -> tuple[str, str] | None:
        out = sh(
            "kubectl", "get", "pod", "-l", "job-name=resnet50", "-o",
            "jsonpath={.items[0].metadata.name} {.items[0].spec.nodeName}",
            check=False,
        )  # fmt: skip
        parts = out.split()
        return (parts[0], parts[1]) if len(parts) == 2 else None

    pod, node = eventually(pod_and_node, "the Job's pod bound")
    wide = sh("kubectl", "get", "pod", "-l", "job-name=resnet50", "-o", "wide")
    assert pod in wide and node in wide
    explain = sh.curl_json(f"{sh.url('scheduler')}/v1/pods/default/{pod}/explain")
    assert explain["node"] == node
    assert explain["message"] == f"bound to {node}"
    assert explain["request"]["num_gpu"] == 2
    assert len(explain["annotations"]["alnair.io/gpu-indices"].split(",")) == 2

    # Profiled while it runs: per-pod gauges on the agent, the folded profile on the aggregator.
    def gauges() -> list[str]:
        text = sh("curl", "-sf", f"{sh.url('profiler-agent')}/metrics", check=False)
        return [
            line
            for line in text.splitlines()
            if line.startswith("alnair_profiler_pod_gpu_util_pct{") and f'pod="{pod}"' in line
        ]

    assert len(eventually(gauges, "per-pod GPU gauges")) == 2

    def profile() -> dict[str, Any] | None:
        doc = json.loads(
            sh("curl", "-s", f"{sh.url('aggregator')}/v1/jobs/default/resnet50/profile")
        )
        return doc if doc.get("series", {}).get("gpu_util_pct", {}).get("count") else None

    series = eventually(profile, "the job's profile")["series"]
    assert 0 < series["gpu_util_pct"]["mean"] <= 100
    assert series["gpu_mem_used_mib"]["max"] > 0

    # Recorded once it completes.
    sh("kubectl", "wait", "--for=condition=complete", "job/resnet50", "--timeout=120s")

    def annotations() -> dict[str, str] | None:
        raw = sh("kubectl", "get", "job", "resnet50", "-o", "jsonpath={.metadata.annotations}")
        ann: dict[str, str] = json.loads(raw)
        return ann if "alnair.io/profile-gpu-util-max-pct" in ann else None

    ann = eventually(annotations, "the Job's profile annotations")
    assert float(ann["alnair.io/profile-gpu-util-max-pct"]) > 0
    assert int(ann["alnair.io/profile-samples"]) > 0
    records = eventually(
        lambda: sh.curl_json(f"{sh.url('aggregator')}/v1/records?model=ResNet-50"),
        "the execution record",
    )
    assert len(records) == 1
    (record,) = records
    assert record["job_name"] == "resnet50" and record["outcome"] == "succeeded"
    assert record["gpu_count"] == 2 and record["gpu_model"] in ("V100M32", "T4")
    assert record["throughput_steps_per_s"] > 0 and record["peak_gpu_mem_mib"] > 0

    # Predicted: the completion made the predictor retrain with the record.
    models = eventually(
        lambda: (
            (m := sh.curl_json(f"{sh.url('predictor')}/v1/models"))["training_size"]["records"] >= 1
            and not m["retraining"]
            and m
        ),
        "the predictor retrained on the record",
        timeout_s=120,
    )
    assert models["version"] >= 2
    body = json.dumps(
        {
            "job": {"model_name": "ResNet-50", "batch_size": 64, "data_size": 1281167, "epoch": 3},
            "gpu_types": ["V100M32", "T4"],
            "gpu_counts": [2],
        }
    )
    reply = sh.curl_json(
        "-X", "POST", f"{sh.url('predictor')}/v1/predict",
        "-H", "content-type: application/json", "-d", body,
    )  # fmt: skip
    assert reply["model_version"] == models["version"]
    assert reply["memory_basis"] == "records"
    by_type = {p["gpu_type"]: p for p in reply["predictions"]}
    measured = by_type["V100" if record["gpu_model"] == "V100M32" else "T4"]
    assert measured["basis"] == "measured"
    assert measured["throughput_steps_per_s"] == pytest.approx(
        record["throughput_steps_per_s"], rel=0.01
    )
    assert measured["peak_gpu_mem_mib"] == pytest.approx(record["peak_gpu_mem_mib"])

    # Queued: written without `suspend`, held by the webhook, admitted by the dispatcher.
    applied = sh("kubectl", "apply", "-f", "docs/walkthrough/queued-job.yaml")
    assert "job.batch/queued created" in applied, applied
    admitted = eventually(
        lambda: sh(
            "kubectl", "get", "job", "queued", "-o",
            "jsonpath={.metadata.annotations.alnair\\.io/admitted-gpu-model}",
        ),
        "the queued Job admitted",
    )  # fmt: skip
    assert admitted == "V100M32"
    explained = sh.curl_json(f"{sh.url('dispatcher')}/v1/jobs/default/queued")
    assert explained["status"] == "admitted" and explained["gpu_model"] == "V100M32"
    held = sh("kubectl", "get", "events", "--field-selector", "involvedObject.name=queued")
    assert "Admitted" in held, held
    # The same, as a user asks it: `kubectl alnair` through the API server (the dispatcher's
    # aggregated API, registered by `make up`).
    jobs = sh("kubectl", "alnair", "jobs").splitlines()
    assert jobs[0].split()[:4] == ["NAME", "KIND", "QUEUE", "STATUS"], jobs
    row = next(line.split() for line in jobs[1:] if line.startswith("queued "))
    assert row[1] == "Job" and row[3] == "admitted" and row[5] == "V100M32", jobs
    why = sh("kubectl", "alnair", "why", "job/queued")
    assert "Status:" in why and "admitted" in why, why
    gpus = sh("kubectl", "alnair", "gpus").splitlines()
    assert gpus[0].split()[:3] == ["NODE", "MODEL", "GPU"], gpus
    assert any(line.split()[1] == "V100M32" for line in gpus[1:]), gpus

    # Down: everything stops, and status says so.
    state = json.loads((sh.dev_dir / "state.json").read_text())
    pids = [p["pid"] for p in state["infra"]] + [p["pid"] for p in state["services"].values()]
    assert "stopped" in sh("make", "down")
    assert "nothing is up" in sh("make", "status", check=False)
    assert not [pid for pid in pids if running(pid)]


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"
