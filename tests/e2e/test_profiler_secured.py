"""The profiler's agent and aggregator run as their own NATS and Redis users with nothing more
(issue 16): against servers that admit only the service users, the agent publishes the
node's inventory and its pods' samples, the aggregator folds them, writes the execution
record and announces the completion, which a scheduler-user consumer receives.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.events import Envelope, GpuInventory, JobEvent, JobPhase
from alnair.common.kube import JOBS, KubeClient
from alnair.common.natsauth import ADMIN_USER, SERVICE_PERMISSIONS
from alnair.common.records import record_key
from alnair.common.redisauth import ADMIN_USER as REDIS_ADMIN
from alnair.common.redisauth import SERVICE_USERS
from alnair.common.tasks import within
from alnair.dev.localstack import ControlPlane, NatsServer, RedisServer
from alnair.profiler.app import start_agent, start_aggregator
from profiler_support import profiler_settings

pytestmark = pytest.mark.e2e


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    users = {u: secrets.token_urlsafe(12) for u in [*SERVICE_PERMISSIONS, ADMIN_USER]}
    (tmp_path / "nats").mkdir()
    srv = NatsServer(tmp_path / "nats", users=users).start()
    yield srv
    srv.stop()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    users = {u: secrets.token_urlsafe(12) for u in [*SERVICE_USERS, REDIS_ADMIN]}
    (tmp_path / "redis").mkdir()
    srv = RedisServer(tmp_path / "redis", users=users).start()
    yield srv
    srv.stop()


def job(namespace: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "annotations": {res.ANN_MODEL_NAME: "ResNet-50"}},
        "spec": {
            "template": {
                "metadata": {
                    "annotations": {
                        res.ANN_DURATION: res.duration_value(6),
                        res.ANN_GPU_INDICES: "0",
                    }
                },
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.invalid/train:1",
                            "resources": {"limits": {res.GPU: "1"}, "requests": {"cpu": "1"}},
                        }
                    ],
                },
            }
        },
    }


async def test_agent_and_aggregator_with_only_their_permissions(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats: NatsServer,
    redis: RedisServer,
) -> None:
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:2", kube=kube, prefix=f"sec-{namespace}"
    )

    def settings(user: str, **over: object) -> object:
        return profiler_settings(
            control_plane.kubeconfig,
            nats.url,
            redis.url,
            node,
            nats_user=user,
            nats_password=nats.users[user],
            **over,
        )

    agent = await start_agent(settings("profiler-agent"))  # type: ignore[arg-type]
    aggregator = await start_aggregator(
        settings(  # type: ignore[arg-type]
            "aggregator",
            role="aggregator",
            redis_user="aggregator",
            redis_password=redis.users["aggregator"],
            trialjobs=False,
        )
    )
    scheduler = await Bus.connect(
        nats.url, name="scheduler", credentials=nats.credentials("scheduler")
    )
    completed: asyncio.Queue[JobEvent] = asyncio.Queue()

    async def on_job(event: JobEvent, _env: Envelope[JobEvent]) -> None:
        if event.namespace == namespace:
            await completed.put(event)

    admin = aioredis.from_url(redis.url, **redis.credentials(REDIS_ADMIN))
    try:
        inventory = await (await scheduler.kv(GpuInventory.BUCKET)).get(node)
        assert inventory.value is not None  # written by the agent's user, read by the scheduler's
        await scheduler.subscribe(JobEvent, on_job, durable=f"sched-{namespace}")
        created = await kube.create(JOBS, job(namespace, node), namespace)
        event = await within(completed.get(), 90)
        assert event.phase is JobPhase.COMPLETED and event.name == "train"
        key = record_key(namespace, "train", created["metadata"]["uid"])
        assert await admin.hget(key, "model_name") == b"ResNet-50"
    finally:
        await admin.aclose()
        await scheduler.close()
        await aggregator.stop()
        await agent.stop()
