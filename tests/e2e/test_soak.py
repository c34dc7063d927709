"""`make soak` in a short form (issue 16): a minute of job churn on a few KWOK nodes with the
scheduler, profiler, predictor and dispatcher running; the JSON has every service's RSS and
every queue, nothing grew absurdly, no service died. Runs `bench/soak.py` (what `make soak`
runs) in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_short_soak_reports_flat_memory_and_queues(tmp_path: Path) -> None:
    argv = [
        sys.executable, str(REPO / "bench" / "soak.py"),
        "--minutes", "1", "--nodes", "20x V100M32:4", "--sample-interval-s", "10",
        "--arrival-interval-s", "0.5", "--run-s", "5", "15", "--dir", str(tmp_path / "stack"),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 20 and report["samples"] >= 6
    assert set(report["rss_mib"]) == {*report["services"], "nats-server", "redis-server"}
    assert set(report["services"]) >= {
        "profiler-agent", "aggregator", "predictor", "scheduler",
    }  # fmt: skip
    for name, rss in report["rss_mib"].items():
        assert 0 < rss["start"] <= rss["max"] < 2048, (name, rss)
        assert rss["end"] - rss["start"] < 64 + 0.25 * rss["start"], (name, rss)
    assert set(report["queues"]) == {"scheduler_pending", "pods_unbound", "nats_consumer_pending"}
    for name, queue in report["queues"].items():
        assert 0 <= queue["end"] <= 50, (name, queue)
    assert report["jobs_submitted"] >= 60 and report["jobs_completed_seen"] >= 30, report
    assert report["failures"] == [] and report["ok"], report
    assert done.returncode == 0, report
