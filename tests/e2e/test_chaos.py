"""`make chaos` in a reduced form (issue 16): the whole local system under job arrivals while
every service is killed with SIGKILL and restarted, nats-server is down for a while and the
API server restarts, and the scheduler holding the Lease is SIGSTOPped past its lease (the
standby replica takes over) and resumed; afterwards no job is lost, none ran twice, no GPU was given twice, and
every completed job has exactly one execution record and one completion event on the bus, and
every second job, and an ElasticJob, went through the dispatcher's queue and was admitted
once. Runs
`bench/chaos.py` (what
`make chaos` runs) in its own process, with fewer jobs and kills.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_reduced_chaos_keeps_every_invariant(tmp_path: Path) -> None:
    argv = [
        sys.executable, str(REPO / "bench" / "chaos.py"),
        "--jobs", "12", "--kills-per-service", "1", "--arrival-interval-s", "1.5",
        "--run-s", "6", "10", "--nats-down-s", "3", "--settle-s", "180", "--leader-stop-s", "20",
        "--nodes", "2x V100M32:4", "--dir", str(tmp_path / "stack"),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kills"] == len(report["services"]) >= 7  # each service once
    assert "scheduler-standby" in report["services"]
    assert len(report["leader_stops"]) == 1  # the scheduler holding the Lease, SIGSTOPped
    assert report["nats_restarts"] == 1 and report["apiserver_restarts"] == 1
    assert report["pod_samples"] > 0
    # every second job went through the dispatcher's queue, and the ElasticJob (job 5) too
    assert report["queued"] == 7 and report["elastic"] == 1
    assert report["elastic_problems"] == [], report
    assert report["fractions"] == 3  # and every fifth asked a fraction of a GPU
    assert report["gangs"] == 2  # jobs 3 and 7: two pods each, all or none
    # each kill, nats-server's outage and the leader's stop
    assert report["fault_windows"] == report["kills"] + 2
    assert report["fault_windows_unsampled"] == 0, report
    for key in ("lost", "double_bound", "gpu_overcommitted", "records_duplicated",
                "admissions_duplicated", "completions_duplicated", "completions_missing"):  # fmt: skip
        assert report[key] == 0, report
    assert report["records_missing"] == 0, report
    assert done.returncode == 0, report
