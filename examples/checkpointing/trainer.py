"""A tiny trainer that keeps its progress across preemptions: checkpoint on SIGTERM, resume.

It stands for any training loop (it fits y = 3x + 1 by gradient descent on CPU, one small step
at a time) and shows the three things Alnair asks of a job that may be moved
(`alnair.common.progress`):

1. **Report progress.** Each step it prints `step N/TOTAL`, serves the Prometheus gauges
   `alnair_train_step`, `alnair_train_total_steps` and `alnair_train_checkpoint_step` on
   `--metrics-port` (annotate the pod `alnair.io/progress-metrics: "<port>"`), and, given a
   token that may patch its own pod (its ServiceAccount's, or `--token-file`),
   keeps `alnair.io/progress-step`, `alnair.io/total-steps` and `alnair.io/checkpoint-step`
   on its pod (`--pod NAMESPACE/NAME`, from the Downward API).
2. **Checkpoint when told.** A preemption or a move deletes the pod: the kubelet sends SIGTERM
   and waits `terminationGracePeriodSeconds`. The trainer finishes its step, writes a
   checkpoint (atomically: a temporary file renamed), says so, and exits 143.
3. **Resume.** On start it loads the checkpoint in `--checkpoint-dir` (a volume that outlives
   the pod) and goes on from that step.

    python examples/checkpointing/trainer.py --checkpoint-dir /tmp/ckpt --total-steps 200

Standard library only, so it runs in any Python image.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHECKPOINT = "checkpoint.json"


class State:
    def __init__(self, total: int) -> None:
        self.step = 0
        self.total = total
        self.checkpoint = 0
        self.w, self.b = 0.0, 0.0
        self.stop = threading.Event()

    def load(self, folder: Path) -> bool:
        path = folder / CHECKPOINT
        if not path.exists():
            return False
        doc = json.loads(path.read_text())
        self.step = self.checkpoint = int(doc["step"])
        self.w, self.b = float(doc["w"]), float(doc["b"])
        return True

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{CHECKPOINT}.tmp"
        tmp.write_text(json.dumps({"step": self.step, "w": self.w, "b": self.b}))
        os.replace(tmp, folder / CHECKPOINT)
        self.checkpoint = self.step

    def train_step(self) -> float:
        """One step of gradient descent on 32 points of y = 3x + 1."""
        grad_w = grad_b = loss = 0.0
        for i in range(32):
            x = i / 32
            err = self.w * x + self.b - (3 * x + 1)
            grad_w += 2 * err * x / 32
            grad_b += 2 * err / 32
            loss += err * err / 32
        self.w -= 0.5 * grad_w
        self.b -= 0.5 * grad_b
        self.step += 1
        return loss


def serve_metrics(state: State, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                "# TYPE alnair_train_step gauge\n"
                f"alnair_train_step {state.step}\n"
                "# TYPE alnair_train_total_steps gauge\n"
                f"alnair_train_total_steps {state.total}\n"
                "# TYPE alnair_train_checkpoint_step gauge\n"
                f"alnair_train_checkpoint_step {state.checkpoint}\n"
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class PodAnnotator:
    """Keeps the progress annotations on the trainer's own pod (a JSON merge patch)."""

    def __init__(
        self, pod: str, server: str | None, token_file: str | None, ca_file: str | None
    ) -> None:
        self.namespace, _, self.name = pod.partition("/")
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        if server is None:  # in a pod: its ServiceAccount
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            server = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        if not server.startswith("https://"):
            raise SystemExit(f"--api-server {server!r}: the API server is reached over https")
        self.server = server
        self.token = Path(token_file or account / "token").read_text().strip()
        self.context = ssl.create_default_context(cafile=ca_file or str(account / "ca.crt"))

    def put(self, state: State) -> None:
        body = json.dumps({"metadata": {"annotations": {
            "alnair.io/progress-step": str(state.step),
            "alnair.io/total-steps": str(state.total),
            "alnair.io/checkpoint-step": str(state.checkpoint),
        }}}).encode()  # fmt: skip
        request = urllib.request.Request(  # noqa: S310 (https only, checked above)
            f"{self.server}/api/v1/namespaces/{self.namespace}/pods/{self.name}",
            data=body,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=5):  # noqa: S310
                pass
        except OSError as exc:  # the pod may be gone already (a move): the checkpoint stays
            print(f"progress annotation not written: {exc}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--total-steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="time one step takes")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between saves")
    parser.add_argument("--report-every", type=int, default=5, help="steps between reports")
    parser.add_argument("--metrics-port", type=int, default=0, help="0: no metrics endpoint")
    parser.add_argument("--pod", help="NAMESPACE/NAME of its own pod, to annotate")
    parser.add_argument("--api-server", help="API server URL (default: the in-cluster one)")
    parser.add_argument("--token-file", help="bearer token (default: the pod's ServiceAccount)")
    parser.add_argument("--ca-file", help="API server CA (default: the pod's ServiceAccount)")
    args = parser.parse_args(argv)

    state = State(args.total_steps)
    if state.load(args.checkpoint_dir):
        print(f"resumed from checkpoint at step {state.step}/{state.total}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: state.stop.set())
    server = serve_metrics(state, args.metrics_port) if args.metrics_port else None
    annotator = (
        PodAnnotator(args.pod, args.api_server, args.token_file, args.ca_file) if args.pod else None
    )
    if annotator:
        annotator.put(state)
    try:
        while state.step < state.total:
            if state.stop.is_set():
                state.save(args.checkpoint_dir)
                print(f"SIGTERM: checkpoint saved at step {state.step}", flush=True)
                if annotator:
                    annotator.put(state)
                return 143
            loss = state.train_step()
            time.sleep(args.step_seconds)
            if state.step % args.checkpoint_every == 0:
                state.save(args.checkpoint_dir)
                print(f"checkpoint saved at step {state.step}", flush=True)
            if state.step % args.report_every == 0 or state.step == state.total:
                print(f"step {state.step}/{state.total} loss {loss:.6f}", flush=True)
                if annotator:
                    annotator.put(state)
        state.save(args.checkpoint_dir)
        print(f"done: w={state.w:.3f} b={state.b:.3f}", flush=True)
        return 0
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
