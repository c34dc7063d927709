"""A "scheduler" that decides nothing: the harness's own ceiling for `bench/scheduler.py`.

It lists the nodes once, then watches pending pods with its scheduler name and binds each to
the next node round-robin (no filter, no score, no GPU accounting) with up to `--in-flight`
Binding requests at once. Run on the same pods as the real schedulers, its bind rate is what
the API server, the watch the harness measures from, and a Python client together allow; a
scheduler measured well below it is measured, not the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools

from alnair.common.kube import NODES, PODS, Conflict, KubeClient, NotFound


async def run(kubeconfig: str, scheduler_name: str, in_flight: int) -> None:
    async with KubeClient.from_config(kubeconfig, max_connections=in_flight + 8) as kube:
        nodes = [n["metadata"]["name"] for n in (await kube.list(NODES))["items"]]
        ring = itertools.cycle(sorted(nodes))
        sem = asyncio.Semaphore(in_flight)
        seen: set[str] = set()
        tasks: set[asyncio.Task[None]] = set()
        selector = f"spec.schedulerName={scheduler_name},spec.nodeName="

        async def bind(ns: str, name: str, uid: str) -> None:
            async with sem:
                with contextlib.suppress(Conflict, NotFound):
                    await kube.bind(ns, name, next(ring), uid=uid)

        def take(pod: dict[str, object]) -> None:
            meta = pod["metadata"]
            assert isinstance(meta, dict)
            if meta["uid"] in seen:
                return
            seen.add(meta["uid"])
            task = asyncio.create_task(bind(meta["namespace"], meta["name"], meta["uid"]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        listing = await kube.list(PODS, field_selector=selector)
        for pod in listing["items"]:
            take(pod)
        rv = listing["metadata"]["resourceVersion"]
        while True:
            async for kind, pod in kube.watch(PODS, resource_version=rv, field_selector=selector):
                rv = pod["metadata"]["resourceVersion"]
                if kind == "ADDED":
                    take(pod)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--scheduler-name", default="noop")
    parser.add_argument("--in-flight", type=int, default=256)
    args = parser.parse_args()
    asyncio.run(run(args.kubeconfig, args.scheduler_name, args.in_flight))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
