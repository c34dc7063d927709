"""Start a service again when it exits, as the kubelet does for a pod's container
(`restartPolicy: Always`): the local stack's services are crash-only, and a service that exits
on purpose (a leader that lost its Lease exits so that a follower takes over) relies on being
started again. Without this, `make up` and the demo lost the elastic controller for good the
first time a Lease renewal timed out under load.

    python -m alnair.dev.supervise --name elastic -- python -m alnair.elastic

The back-off is the kubelet's: 10 s after an exit, doubling to at most 5 minutes, back to
10 s once the service has run for 10 minutes. SIGTERM or SIGINT is passed to the service and
ends supervision: it is not started again. Each exit and restart is one line on stdout (the
service's log), `RESTART_MARK` first, so tools can count them.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

RESTART_MARK = "[supervise]"
FIRST_BACKOFF_S = 10.0
MAX_BACKOFF_S = 300.0
RESET_AFTER_S = 600.0


def next_backoff(current: float, ran_s: float, first: float = FIRST_BACKOFF_S) -> float:
    """The wait before the next start, given the last wait (0: none yet) and how long the
    service ran."""
    if ran_s >= RESET_AFTER_S or current <= 0:
        return first
    return min(current * 2, MAX_BACKOFF_S)


class Supervisor:
    def __init__(self, name: str, argv: Sequence[str], first_backoff_s: float) -> None:
        self.name = name
        self.argv = list(argv)
        self.first_backoff_s = first_backoff_s
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def _say(self, text: str) -> None:
        print(f"{RESTART_MARK} {self.name} {text}", flush=True)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        backoff = 0.0
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
            code = self.child.wait()
            if self.stopping.is_set():
                return code
            ran = time.monotonic() - started
            backoff = next_backoff(backoff, ran, self.first_backoff_s)
            self.restarts += 1
            self._say(
                f"exited with {code} after {ran:.1f} s; restart {self.restarts} in {backoff:.0f} s"
            )
            if self.stopping.wait(backoff):
                return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alnair.dev.supervise")
    parser.add_argument("--name", required=True, help="the service's name, for its log lines")
    parser.add_argument(
        "--first-backoff-s",
        type=float,
        default=FIRST_BACKOFF_S,
        help="wait before the first restart (doubles up to 300 s)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the service's argv")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise: give it after --")
    return Supervisor(args.name, command, args.first_backoff_s).run()


if __name__ == "__main__":
    raise SystemExit(main())
