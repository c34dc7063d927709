"""A NATS store wiped under the whole running stack (issue 26, "a bus that survives loss"):
`make up`'s services as their own processes, nats-server stopped, its JetStream folder
deleted, started again on its port. Every service reports not ready while its bus is not,
every one is ready again without a restart, every durable consumer the services had is on
the server again, and a job submitted after the wipe goes through the dispatcher, the
scheduler and the aggregator to its record and its completion event.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import defaultdict
from pathlib import Path

import nats
import pytest

from alnair.common.kube import CLUSTERQUEUES, JOBS, LOCALQUEUES, NAMESPACES, KubeClient
from alnair.common.natsauth import ADMIN_USER
from alnair.dev import devstack
from alnair.dev.chaos import (
    NAMESPACE,
    QUEUE,
    Chaos,
    ChaosConfig,
    job_body,
    job_complete,
    queue_bodies,
)
from alnair.dev.localstack import NatsServer
from alnair.dev.supervise import RESTART_MARK
from alnair.dev.waiting import wait_for

pytestmark = pytest.mark.e2e

NODES = "2x V100M32:4"
SERVICES = ("profiler-agent", "aggregator", "predictor", "scheduler", "dispatcher", "elastic")


async def _durables(state: devstack.State) -> set[tuple[str, str]]:
    """(stream, durable) of every consumer on the server."""
    password = state.credentials["nats"][ADMIN_USER]
    nc = await nats.connect(state.nats_url, user=ADMIN_USER, password=password)
    try:
        js = nc.jetstream()
        found = set()
        for stream in await js.streams_info():
            name = stream.config.name
            assert name is not None
            for consumer in await js.consumers_info(name):
                if consumer.config.durable_name:
                    found.add((name, consumer.config.durable_name))
        return found
    finally:
        await nc.close()


def _ready(state: devstack.State) -> dict[str, bool]:
    return {name: devstack.probe(p.port)[0] for name, p in state.services.items() if p.port}


# `make up` leaves its processes running on purpose (`devstack.down` stops them by pid): the
# Popen objects that started them are dropped while they run.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
@pytest.mark.timeout(480)
def test_a_wiped_nats_store_is_made_again_under_the_running_stack(tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    opts = devstack.UpOptions(nodes=NODES, free_ports=True, only=SERVICES, ready_timeout_s=180)
    state = devstack.up(directory, opts)
    try:
        before = asyncio.run(_durables(state))
        assert {stream for stream, _ in before} >= {"JOBS"}, before
        # nats-server goes, with its store; it comes back empty on the same port.
        (proc,) = [p for p in state.infra if p.name == "nats-server"]
        proc.stop(timeout_s=5.0)
        shutil.rmtree(directory / "nats" / "jetstream")
        seen_down: dict[str, bool] = defaultdict(bool)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(seen_down[n] for n in state.services):
            for name, ready in _ready(state).items():
                seen_down[name] |= not ready
            time.sleep(0.2)
        assert all(seen_down[n] for n in state.services), dict(seen_down)
        port = int(state.nats_url.rsplit(":", 1)[1])
        users = state.credentials["nats"]
        nats_server = NatsServer(directory / "nats", port=port, users=users).start()
        state.infra = [
            devstack.Proc.of(nats_server.process) if p.name == "nats-server" else p
            for p in state.infra
        ]
        state.save()
        asyncio.run(wait_for(lambda: all(_ready(state).values()), 90, 0.5, what="all ready"))
        after = asyncio.run(_durables(state))
        assert before <= after, sorted(before - after)
        asyncio.run(_a_job_goes_through(state))
        restarts = [
            line
            for log in (directory / "logs").glob("*.log")
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(RESTART_MARK)
        ]
        assert not restarts, restarts  # every service rode the loss without a restart
    finally:
        devstack.down(directory)


async def _a_job_goes_through(state: devstack.State) -> None:
    async with KubeClient.from_config(state.kubeconfig) as kube:
        await kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        cluster_queue, local_queue = queue_bodies(NODES)
        await kube.create(CLUSTERQUEUES, cluster_queue)
        await kube.create(LOCALQUEUES, local_queue, NAMESPACE)
        await kube.create(JOBS, job_body("after-wipe", 1, 3.0, queue=QUEUE), NAMESPACE)

        async def complete() -> bool:
            return job_complete(await kube.get(JOBS, "after-wipe", NAMESPACE))

        await wait_for(complete, 90, 0.5, what="the job admitted, bound and complete")
    # Its completion went through the recreated JOBS stream to the aggregator's record.
    checker = Chaos(state.dir, ChaosConfig(nodes=NODES))

    async def recorded() -> list[bool] | None:
        return (await checker.records()).get("after-wipe") or None

    records = await wait_for(recorded, 120, 1.0, what="the job's execution record")
    assert len(records) == 1, records
    completions = await checker.completions()
    assert completions["after-wipe"] == 1, completions
