"""Running the ElasticJob controller and the scheduler in-process on the local control plane
(the e2e tests and `bench/elastic.py` share this)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import PODS, KubeClient
from alnair.dev.localstack import ControlPlane
from alnair.elastic.app import Running as ElasticRunning
from alnair.elastic.app import start as start_elastic
from alnair.elastic.settings import ElasticSettings
from alnair.elastic.spec import JOB_LABEL, ROLE_LABEL
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings


class InProcessScheduler:
    def __init__(self, kube: KubeClient) -> None:
        settings = SchedulerSettings(
            leader_elect=False,
            nats_enabled=False,
            seed=7,
            initial_backoff_s=0.2,
            max_backoff_s=1.0,
            identity=f"test-{uuid.uuid4().hex[:6]}",
        )
        self.scheduler = Scheduler(kube, settings)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> Scheduler:
        await self.scheduler.start_watching()
        self.task = asyncio.create_task(self.scheduler.run())
        return self.scheduler

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.scheduler.stop()


async def start_controller(
    cp: ControlPlane,
    namespace: str,
    nats_url: str | None = None,
    *,
    kube: KubeClient | None = None,
    **kw: Any,
) -> ElasticRunning:
    """The elastic controller on `namespace`, with the control plane's admin client unless
    `kube` is given (a ServiceAccount's, say)."""
    settings = ElasticSettings(
        **{
            "namespace": namespace,
            "http_port": 0,
            "http_host": "127.0.0.1",
            "nats_enabled": nats_url is not None,
            "nats_url": nats_url or "nats://127.0.0.1:1",
            "leader_elect": False,  # (its own tests elect; one Lease would serialise the others)
            **kw,
        }
    )
    return await start_elastic(settings, kube=kube or cp.client())


def elastic_job(
    name: str,
    namespace: str,
    *,
    lo: int,
    hi: int,
    gpus: int = 1,
    pool: str | None = None,
    priority_class: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "trainer",
                "image": "example.com/train:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi", r.GPU: str(gpus)},
                    "limits": {r.GPU: str(gpus)} if gpus else {},
                },
            }
        ],
    }
    if not gpus:
        del pod["containers"][0]["resources"]["requests"][r.GPU]
    if pool:
        pod["nodeSelector"] = {"alnair.io/test-pool": pool}
    if priority_class:
        pod["priorityClassName"] = priority_class
    body: dict[str, Any] = {"minReplicas": lo, "maxReplicas": hi, "template": {"spec": pod}}
    body.update(spec)
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


async def workers(kube: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    items = (
        await kube.list(PODS, namespace, label_selector=f"{JOB_LABEL}={job},{ROLE_LABEL}=worker")
    )["items"]
    return sorted(items, key=lambda p: int(p["metadata"]["name"].rpartition("-")[2]))


def bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    ]
