"""`make bench-scheduler` in a tiny configuration: the JSON has the promised shape, every
pod of every trial (Alnair, kube-scheduler and the no-op binder that measures the harness's
ceiling) was bound with no GPU over-committed and the workload's constraint held (the
harness checks each placement after each trial; this test requires that it found nothing),
and the warm standby took over within the lease plus one second of the leader's death."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_tiny_bench_scheduler_binds_every_pod_validly() -> None:
    argv = [
        sys.executable, str(REPO / "bench" / "scheduler.py"),
        "--nodes", "20", "--pods", "96", "--steady-pods", "16", "--rate", "40",
        "--repeats", "1", "--workloads", "basic,gang", "--keep-trials",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=220, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["workloads"]) == {"basic", "gang"}
    assert report["harness_ceiling_pods_per_s"] > 0
    for name, w in report["workloads"].items():
        for key in ("alnair_pods_per_s", "kube_scheduler_pods_per_s", "ratio"):
            assert isinstance(w[key], float) and w[key] > 0, (name, key, w)
        for key in ("alnair_p99_s", "kube_scheduler_p99_s"):
            assert isinstance(w[key], float) and 0 < w[key] < 30, (name, key, w)
        assert (w["nodes"], w["pods"], w["runs"]) == (20, 96, 1)
        assert w["ratio"] == pytest.approx(
            w["alnair_pods_per_s"] / w["kube_scheduler_pods_per_s"], abs=1e-3
        )
        assert w["valid"], w.get("violations")
        trials = w["trials"]
        assert sorted(t["scheduler"] for t in trials) == ["alnair", "kube_scheduler"]
        for t in trials:
            assert t["bound"] == 96 and t["steady_bound"] == 16, t
            assert t["violations"] == [], t
    # The take-over trial (leader SIGKILLed, lease 15 s): the warm standby bound every pod
    # created after the kill, within the lease duration plus one second of the kill.
    takeover = report["takeover"]
    assert takeover["lease_duration_s"] == 15.0
    (trial,) = takeover["trials"]
    assert trial["bound"] == trial["pods"] == 20, trial
    assert 0 < trial["takeover_s"] <= 16.0 and trial["within_lease_plus_1s"], trial
    assert takeover["within_lease_plus_1s"]
