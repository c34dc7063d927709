"""The local stack's restarter: a service that exits is started again, with the kubelet's
back-off; a stop signal reaches the service and ends supervision."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from alnair.dev.supervise import MAX_BACKOFF_S, RESET_AFTER_S, RESTART_MARK, next_backoff


def test_the_backoff_is_the_kubelets() -> None:
    assert next_backoff(0.0, 1.0) == 10.0
    assert next_backoff(10.0, 1.0) == 20.0
    assert next_backoff(160.0, 1.0) == MAX_BACKOFF_S
    assert next_backoff(MAX_BACKOFF_S, 1.0) == MAX_BACKOFF_S
    assert next_backoff(MAX_BACKOFF_S, RESET_AFTER_S) == 10.0  # it ran long: back to the start
    assert next_backoff(0.0, 1.0, first=0.1) == 0.1


def _supervise(tmp_path: Path, code: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "svc.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "alnair.dev.supervise", "--name", "svc",
             "--first-backoff-s", "0.05", "--", sys.executable, "-c", code],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, log


def _until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_service_that_exits_is_started_again_and_each_exit_is_logged(tmp_path: Path) -> None:
    proc, log = _supervise(tmp_path, "print('started', flush=True); raise SystemExit(3)")
    try:
        _until(lambda: log.read_text().count("started") >= 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    marks = [line for line in log.read_text().splitlines() if line.startswith(RESTART_MARK)]
    assert marks and marks[0].startswith(f"{RESTART_MARK} svc exited with 3 after ")
    assert "restart 1 in 0 s" in marks[0]
    assert "restart 2 in 0 s" in marks[1]  # 0.05 then 0.1: doubling


def test_a_stop_signal_reaches_the_service_and_ends_supervision(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('got TERM', flush=True), sys.exit(0)))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc, log = _supervise(tmp_path, code)
    _until(lambda: "started" in log.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    text = log.read_text()
    assert "got TERM" in text and RESTART_MARK not in text
    assert text.count("started") == 1
