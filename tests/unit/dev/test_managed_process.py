"""A supervised child process (how the local control plane keeps KWOK up) is started again when
it exits by itself, a bounded number of times, and never after `stop()`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from alnair.dev.localstack.procs import ManagedProcess


def _until(check, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_process_that_exits_is_restarted_up_to_its_bound(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = f"open({str(runs)!r}, 'a').write('x'); raise SystemExit(3)"
    proc = ManagedProcess("crasher", [sys.executable, "-c", script], tmp_path, restarts=2)
    proc.start()
    assert _until(lambda: "not restarted again" in proc.log_path.read_text())
    assert proc.restarted == 2
    assert runs.read_text() == "xxx"  # the first run and two restarts, no more
    log = proc.log_path.read_text()
    assert "crasher exited with 3; restart 1" in log and "restart 2" in log
    assert not proc.alive()


def test_stop_is_never_followed_by_a_restart(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, restarts=3
    )
    proc.start()
    assert proc.alive()
    proc.stop()
    time.sleep(0.6)  # longer than the supervisor's pause before a restart
    assert not proc.alive() and proc.restarted == 0
    assert "[localstack]" not in proc.log_path.read_text()
    # Started again (what restart_component does), it is supervised afresh.
    proc.start()
    first = proc.proc
    assert first is not None
    first.kill()
    assert _until(lambda: proc.proc is not first and proc.alive())
    assert proc.restarted == 1
    proc.stop()


def test_an_unsupervised_process_is_left_down(tmp_path: Path) -> None:
    proc = ManagedProcess("once", [sys.executable, "-c", "raise SystemExit(1)"], tmp_path)
    proc.start()
    assert proc.proc is not None and proc.proc.wait(10) == 1
    time.sleep(0.4)
    assert not proc.alive() and proc.restarted == 0
