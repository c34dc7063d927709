"""Per-node identity on the bus (issue 25): node components connect with their pod's
ServiceAccount token, and the auth callout (`alnair.common.busauth`, run as the profiler's
`bus-auth` process) admits each as its node only. Real nats-server (auth callout on, the shipped static users bypassing it), real
kube-apiserver (TokenReview, tokens bound to pods on KWOK nodes, audience alnair-bus).

Connected as node A's agent:
- its own health and inventory go through and are handled (node A's device plugin, through
  its own durable and a watch on its own inventory key, sees them);
- publishing health, samples or inventory for node B, pulling or acking the predictor's
  durable, putting an alnair-handled key of another consumer, and updating the JOBS stream are
  each refused by nats-server;
- the predictor's events, published meanwhile, are still all handled.
A token of another account, one bound to no node, or no token at all is not admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from alnair.common import nkeys
from alnair.common.bus import Bus
from alnair.common.busauth import AUDIENCE, deviceplugin_durable, node_inbox
from alnair.common.events import (
    Envelope,
    GpuDevice,
    GpuHealthChanged,
    GpuInventory,
    JobEvent,
    JobPhase,
    encode,
    subject_token,
    wrap,
)
from alnair.common.kube import KubeClient
from alnair.common.natsauth import ADMIN_USER, NatsCredentials, new_password
from alnair.dev.builders import pod_bound_token, shipped_account
from alnair.dev.localstack import ControlPlane, NatsServer
from alnair.dev.waiting import wait_for
from alnair.profiler.busauth import BusAuthRunning, start_bus_auth
from profiler_support import profiler_settings

pytestmark = pytest.mark.e2e

SYSTEM_NS = "alnair-system"


@contextlib.asynccontextmanager
async def callout_bus(
    cp: ControlPlane, tmp_path: Path
) -> AsyncIterator[tuple[NatsServer, BusAuthRunning]]:
    """nats-server with the static users and the callout on, and the profiler's bus-auth
    process answering it (as it runs in the deploy: its own static user, the issuer seed)."""
    issuer = nkeys.KeyPair.create(nkeys.ACCOUNT)
    users = {u: new_password() for u in (ADMIN_USER, "bus-auth", "predictor", "scheduler")}
    (tmp_path / "nats").mkdir()
    server = NatsServer(workdir=tmp_path / "nats", users=users,
                        callout_issuer=issuer.public_key).start()  # fmt: skip
    settings = profiler_settings(
        cp.kubeconfig, server.url, "redis://unused", "none", role="bus-auth",
        nats_user="bus-auth", nats_password=users["bus-auth"],
        bus_auth_issuer_seed=issuer.seed,
    )  # fmt: skip
    auth = await start_bus_auth(settings)
    try:
        yield server, auth
    finally:
        await auth.stop()
        server.stop()


def _as_node(tmp_path: Path, token: str, node: str) -> NatsCredentials:
    path = tmp_path / f"token-{uuid.uuid4().hex[:6]}"
    path.write_text(token)
    return NatsCredentials(token_file=path, inbox_prefix=node_inbox(node))


async def _refusals(url: str, creds: NatsCredentials, attempts: list[Any]) -> list[str]:
    """Connect raw as `creds`, try each (subject, payload) publish or request, and return what
    nats-server said (its permission errors, in order)."""
    said: list[str] = []

    async def on_error(exc: Exception) -> None:
        said.append(str(exc))

    nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False,
                            **creds.connect_options())  # fmt: skip
    try:
        for subject, payload in attempts:
            await nc.publish(subject, payload)
        await nc.flush()
        # The server answers each refused publish with its own error, in order.
        await wait_for(lambda: len(said) >= len(attempts), 10, 0.05, what="one refusal each")
    finally:
        await nc.close()
    return said


async def test_a_node_agent_speaks_only_for_its_node_on_the_bus(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    await shipped_account(cp, kube, "alnair-profiler-agent", "profiler/agent-rbac/rbac.yaml")
    await shipped_account(cp, kube, "alnair-deviceplugin", "deviceplugin/rbac.yaml")
    node_a, node_b = await cp.create_gpu_nodes("2x V100M32:8", kube=kube, prefix=namespace)
    a, b = subject_token(node_a), subject_token(node_b)
    bus_token = {"audiences": (AUDIENCE,)}
    agent_token, _ = await pod_bound_token(kube, "alnair-profiler-agent", node_a, **bus_token)
    plugin_token, _ = await pod_bound_token(kube, "alnair-deviceplugin", node_a, **bus_token)
    agent_a = _as_node(tmp_path, agent_token, node_a)
    plugin_a = _as_node(tmp_path, plugin_token, node_a)

    async with callout_bus(cp, tmp_path) as (server, auth):
        callout = auth.callout
        # (the static users' services make the streams and buckets: node components may not)
        admin = await Bus.connect(server.url, name="admin",
                                  credentials=server.credentials(ADMIN_USER))  # fmt: skip
        predictor = await Bus.connect(server.url, name="predictor",
                                      credentials=server.credentials("predictor"))  # fmt: skip
        jobs: list[str] = []

        async def on_job(ev: JobEvent, env: Envelope[JobEvent]) -> None:
            jobs.append(ev.name)

        await predictor.subscribe(JobEvent, on_job, durable="predictor")

        # Node A's device plugin: its durable on its node's health, a watch on its key.
        plugin = await Bus.connect(server.url, name="plugin-a", credentials=plugin_a,
                                   ensure_streams=False)  # fmt: skip
        health: list[str] = []

        async def on_health(ev: GpuHealthChanged, env: Envelope[GpuHealthChanged]) -> None:
            health.append(ev.node)

        await plugin.subscribe(GpuHealthChanged, on_health, durable=deviceplugin_durable(node_a),
                               subject=f"alnair.health.{a}.>", max_in_flight=1)  # fmt: skip
        watcher = await (await plugin.kv(GpuInventory.BUCKET)).watch(a)

        # Node A's agent: its node's health and inventory go through.
        agent = await Bus.connect(server.url, name="agent-a", credentials=agent_a,
                                  ensure_streams=False)  # fmt: skip
        await agent.publish(GpuHealthChanged(node=node_a, gpu_index=0, gpu_uuid="GPU-a0",
                                             healthy=False), source="agent-a")  # fmt: skip
        gpu = GpuDevice(index=0, uuid="GPU-a0", model="V100M32", memory_mib=32768)
        inventory = GpuInventory(node=node_a, gpus=[gpu])
        await (await agent.kv(GpuInventory.BUCKET)).put(a, inventory.model_dump_json().encode())
        async with asyncio.timeout(10):
            while not health:
                await asyncio.sleep(0.05)
            async for entry in watcher:
                if entry is not None and entry.value:
                    assert GpuInventory.read(entry.key, entry.value) == inventory
                    break
        assert health == [node_a]

        # Everything else node A's agent tries, nats-server refuses.
        forged = encode(wrap(GpuHealthChanged(node=node_b, gpu_index=0, gpu_uuid="GPU-b0",
                                              healthy=False), source="agent-a"))  # fmt: skip
        attempts = [
            (f"alnair.health.{b}.0", forged),
            (f"alnair.metrics.pod.{b}", b"{}"),
            (f"$KV.gpu-inventory.{b}", b"{}"),
            ("$JS.API.CONSUMER.MSG.NEXT.JOBS.predictor", b'{"batch":1}'),
            ("$JS.ACK.JOBS.predictor.1.1.1.1.1", b"+ACK"),
            ("$KV.alnair-handled.predictor.some-event", b"1"),
            ("$JS.API.STREAM.UPDATE.JOBS", b'{"name":"JOBS","max_age":1000000000}'),
        ]
        said = await _refusals(server.url, agent_a, attempts)
        for subject, _ in attempts:
            assert any(f"permissions violation for publish to \"{subject.lower()}\"" in s.lower()
                       for s in said), (
                subject, said,
            )  # fmt: skip

        # The predictor's events published meanwhile are all handled, once.
        for i in range(5):
            await admin.publish(JobEvent(phase=JobPhase.COMPLETED, namespace="ns", kind="Job",
                                         name=f"j{i}", uid=f"u{i}"), source="t")  # fmt: skip
        async with asyncio.timeout(10):
            while len(jobs) < 5:
                await asyncio.sleep(0.05)
        assert sorted(jobs) == [f"j{i}" for i in range(5)]
        assert callout.admitted == 2 + 1  # the agent, the plugin, and the refusal probe

        # Not admitted: another account's token, a token bound to no node, no token.
        other = await kube.service_account_token(namespace, "default", audiences=[AUDIENCE])
        unbound = await kube.service_account_token(
            SYSTEM_NS, "alnair-profiler-agent", audiences=[AUDIENCE]
        )  # (bound to no pod, so to no node)
        for creds in (_as_node(tmp_path, other, node_a), _as_node(tmp_path, unbound, node_a),
                      NatsCredentials()):  # fmt: skip
            refused = NatsClient()
            with pytest.raises(nats.errors.Error):
                await refused.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                                      connect_timeout=5, **creds.connect_options())  # fmt: skip
            # (nats-py leaves a refused connection's socket open: closed here, not by the GC)
            await refused.close()
        assert callout.refused >= 2
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{auth.http_port}/metrics")).text
            ready = await http.get(f"http://127.0.0.1:{auth.http_port}/readyz")
        assert 'alnair_profiler_bus_auth_decisions_total{outcome="admitted"} 3.0' in text
        assert ready.status_code == 200
        for bus in (agent, plugin, predictor, admin):
            await bus.close()
