"""One queue over three clusters: the hub dispatches Jobs to worker control planes (issue 15).

Four real control planes: the session's is the hub; three more (each its own etcd, API server,
controller manager and KWOK, one GPU node each) are the workers, registered as kubeconfig
Secrets. Each worker runs the Alnair binder in this process; KWOK completes pods after their
`alnair.io/duration`. The real predictor answers over real NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from alnair.common import resources as r
from alnair.common.bus import Bus
from alnair.common.events import JobEvent, JobPhase
from alnair.common.kube import (
    CLUSTERQUEUES,
    EVENTS,
    JOBS,
    LOCALQUEUES,
    PODS,
    KubeClient,
    NotFound,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.procs import free_port
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.hub import (
    ANN_ABANDONED,
    ANN_DATA_SIZE_MB,
    ANN_DATASET,
    ANN_IMAGE_SIZE,
    ANN_PLACED_CLUSTER,
    MANAGED_BY,
)
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE
from alnair.scheduler.dispatcher.worker_clusters import (
    ANN_BANDWIDTH,
    LABEL_ORIGIN,
    SECRETS,
)
from alnair.scheduler.live.scheduler import Scheduler
from dispatcher_support import flattened, hub_settings, scheduler, worker_secret

pytestmark = pytest.mark.e2e
WORKERS = {  # name: (node spec, link Mbit/s)
    "east": ("1x V100M32:4", 100.0),
    "west": ("1x P100:4", 10_000.0),
    "central": ("1x K80:4", 10_000.0),
}
RESNET = {"model_name": "resnet50", "batch_size": "64", "data_size": "20000", "epoch": "1"}


def hub_job(
    name: str, ns: str, gpus: int, duration_s: float, *, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {LABEL_QUEUE: "ml"},
            "annotations": {**RESNET, **(annotations or {})},
        },
        "spec": {
            "managedBy": MANAGED_BY,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {r.ANN_DURATION: f"{duration_s}s"}},
                "spec": {
                    "schedulerName": r.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/resnet:1",
                            "resources": {"limits": {r.GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


async def test_one_queue_over_three_clusters(
    control_plane: ControlPlane,
    kube: KubeClient,
    namespace: str,
    nats_url: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    from alnair.predictor.app import start as start_predictor
    from alnair.predictor.settings import PredictorSettings

    ns = namespace
    t0 = time.monotonic()
    planes = {name: ControlPlane(tmp_path / name) for name in WORKERS}
    await asyncio.gather(*(asyncio.to_thread(cp.start) for cp in planes.values()))
    clients = {name: cp.client() for name, cp in planes.items()}
    binders: dict[str, contextlib.AbstractAsyncContextManager[Scheduler]] = {}
    predictor = await start_predictor(
        PredictorSettings(nats_url=nats_url, redis_url=redis_url, http_port=0,
                          http_host="127.0.0.1"),
        CollectorRegistry(),
    )  # fmt: skip
    bus = await Bus.connect(nats_url, name="mc-observer")
    seen: list[JobEvent] = []

    async def observe(event: JobEvent, _env: Any) -> None:
        seen.append(event)

    await bus.subscribe(JobEvent, observe, durable="mc-observer")
    hub = None
    try:
        for name, (nodes, _) in WORKERS.items():
            await planes[name].create_gpu_nodes(nodes, kube=clients[name], prefix=name)
            binders[name] = scheduler(clients[name], f"mc-{name}")
            await binders[name].__aenter__()
        for name, (_, mbps) in WORKERS.items():
            text = flattened(planes[name].kubeconfig)
            await kube.create(SECRETS, worker_secret(name, ns, text, mbps), ns)
        # Bad input: a Secret without a bandwidth, and a cluster that refuses our credentials.
        await kube.create(SECRETS, worker_secret("nobw", ns, flattened(planes["east"].kubeconfig),
                                          None), ns)  # fmt: skip
        # ... and one whose kubeconfig would run a command in the dispatcher (refused unrun).
        marker = tmp_path / "exec-ran"
        hostile = yaml.safe_load(flattened(planes["east"].kubeconfig))
        hostile["users"][0]["user"] = {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
            "args": ["-c", f"touch {marker}"], "interactiveMode": "Never"}}  # fmt: skip
        await kube.create(SECRETS, worker_secret("exec", ns, yaml.safe_dump(hostile), 1000.0), ns)
        bogus = yaml.safe_load(flattened(control_plane.kubeconfig))
        bogus["users"][0]["user"] = {"token": "not-a-valid-token"}
        await kube.create(SECRETS, worker_secret("denied", ns, yaml.safe_dump(bogus), 1000.0), ns)
        cq = {
            "apiVersion": "alnair.io/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": f"mc-{ns}"},
            "spec": {"resourceGroups": [{"coveredResources": [r.GPU], "flavors": [
                {"name": m, "resources": [{"name": r.GPU, "nominalQuota": 16}]}
                for m in ("V100M32", "P100", "K80")]}]},
        }  # fmt: skip
        await kube.create(CLUSTERQUEUES, cq)
        lq = {"apiVersion": "alnair.io/v1alpha1", "kind": "LocalQueue",
              "metadata": {"name": "ml", "namespace": ns}, "spec": {"clusterQueue": f"mc-{ns}"}}  # fmt: skip
        await kube.create(LOCALQUEUES, lq, ns)
        hub = await start_dispatcher(hub_settings(control_plane, ns, nats_url))
        api = httpx.AsyncClient(base_url=hub.url)

        async def clusters() -> dict[str, Any]:
            return (await api.get("/v1/clusters")).json()

        async def all_synced() -> bool:
            doc = await clusters()
            up = {c["name"] for c in doc["clusters"] if c["reachable"]}
            return set(WORKERS) <= up and any(c["problem"] for c in doc["clusters"])

        doc = await wait_for(all_synced, 30) and await clusters()
        by_name = {c["name"]: c for c in doc["clusters"]}
        assert by_name["east"]["gpus"] == {"V100M32": 4}
        assert by_name["denied"]["reachable"] is False
        assert by_name["denied"]["problem"].startswith("unauthorized")
        assert [i["secret"] for i in doc["invalid"]] == ["worker-exec", "worker-nobw"]
        assert "users[0].user.exec" in doc["invalid"][0]["problem"]
        assert ANN_BANDWIDTH in doc["invalid"][1]["problem"]
        assert not marker.exists()  # nothing was run

        async def placed(name: str) -> str | None:
            j = await kube.get(JOBS, name, ns)
            return (j["metadata"].get("annotations") or {}).get(ANN_PLACED_CLUSTER)

        async def explain(name: str) -> dict[str, Any]:
            return (await api.get(f"/v1/jobs/{ns}/{name}")).json()

        # 1. Nothing to move: the V100s (east) finish first. 20 GB of ImageNet behind east's
        #    100 Mbit/s link (1600 s) sends the second job elsewhere: the lowest predicted
        #    completion, by the hub's own numbers.
        await kube.create(JOBS, hub_job("small", ns, 1, 3), ns)
        await kube.create(JOBS, hub_job("bigdata", ns, 1, 3, annotations={
            ANN_DATASET: "imagenet", ANN_DATA_SIZE_MB: "20000", ANN_IMAGE_SIZE: "2000"}), ns)  # fmt: skip
        for name in ("small", "bigdata"):
            cluster = await wait_for(lambda name=name: placed(name), 30)
            options = (await explain(name))["options"]
            assert options, name
            best = min(options, key=lambda o: o["completion_s"])
            assert cluster == best["cluster"], (name, options)
        assert await placed("small") == "east"
        assert await placed("bigdata") != "east"
        bigdata = {o["cluster"]: o for o in (await explain("bigdata"))["options"]}
        assert bigdata["east"]["transfer_s"] == pytest.approx((20000 + 2000) * 8 / 100)

        # Status and completion come back to the hub Job; the completion event is published.
        async def complete(name: str) -> bool:
            conds = (await kube.get(JOBS, name, ns)).get("status", {}).get("conditions") or []
            return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)

        for name in ("small", "bigdata"):
            await wait_for(lambda name=name: complete(name), 30)
            await wait_for(lambda name=name: _has(seen, name, JobPhase.COMPLETED), 10)
        done = next(e for e in seen if e.name == "small" and e.phase == JobPhase.COMPLETED)
        assert done.cluster == "east" and done.detail["gpu_model"] == "V100M32"

        # Bad input: too large for every cluster.
        await kube.create(JOBS, hub_job("huge", ns, 16, 3), ns)

        async def too_large() -> bool:
            items = await kube.list(EVENTS, ns, field_selector="involvedObject.name=huge")
            return any(e["reason"] == "TooLarge" for e in items["items"])

        await wait_for(too_large, 20)

        # 2. A worker dies. Fill east and west for a while; a long job runs on central; central's
        #    binder stops, so the next job's mirror there stays Pending; then central goes.
        #    The fillers are predicted to run 200 epochs (they end after 12 s), so waiting for
        #    them is predicted to be worse than the K80s now.
        for name in ("fill-east", "fill-west"):
            await kube.create(JOBS, hub_job(name, ns, 4, 12, annotations={"epoch": "200"}), ns)
        await wait_for(lambda: placed("fill-east"), 20)
        await wait_for(lambda: placed("fill-west"), 20)
        assert {await placed("fill-east"), await placed("fill-west")} == {"east", "west"}
        await kube.create(JOBS, hub_job("running", ns, 1, 600), ns)
        assert await wait_for(lambda: placed("running"), 20) == "central"

        async def mirror_ready(name: str) -> bool:
            try:
                j = await clients["central"].get(JOBS, name, ns)
            except NotFound:
                return False
            return bool((j.get("status") or {}).get("ready"))

        await wait_for(lambda: mirror_ready("running"), 20)
        await binders["central"].__aexit__(None, None, None)
        del binders["central"]
        await kube.create(JOBS, hub_job("queued", ns, 1, 3), ns)
        assert await wait_for(lambda: placed("queued"), 20) == "central"
        await wait_for(lambda: _mirror_exists(clients["central"], ns, "queued"), 10)
        await clients["central"].close()
        planes["central"].stop()
        killed = time.monotonic()

        async def moved() -> bool:
            j = await kube.get(JOBS, "queued", ns)
            ann = j["metadata"].get("annotations") or {}
            return ann.get(ANN_ABANDONED) == "central" and ann.get(ANN_PLACED_CLUSTER) in (
                "east", "west")  # fmt: skip

        await wait_for(moved, 40)
        moved_after = time.monotonic() - killed
        await wait_for(lambda: complete("queued"), 30)

        async def lost_contact() -> bool:
            conds = (await kube.get(JOBS, "running", ns)).get("status", {}).get("conditions")
            return any(c["type"] == "alnair.io/LostContact" and c["status"] == "True"
                       for c in conds or [])  # fmt: skip

        await wait_for(lost_contact, 10)
        assert await placed("running") == "central"
        assert (await explain("running"))["status"] == "lost-contact"
        for name in ("east", "west"):  # never started a second time
            mirrors = (await clients[name].list(JOBS, ns, label_selector=LABEL_ORIGIN))["items"]
            assert "running" not in {m["metadata"]["name"] for m in mirrors}
        doc = await clusters()
        central = next(c for c in doc["clusters"] if c["name"] == "central")
        assert central["reachable"] is False and central["problem"].startswith("unreachable")
        metrics = (await api.get("/metrics")).text
        assert 'alnair_dispatcher_worker_up{cluster="central"} 0.0' in metrics
        assert 'alnair_dispatcher_worker_problems{kind="unauthorized"} 1.0' in metrics
        assert 'alnair_dispatcher_redispatched_total{cluster="central"} 1.0' in metrics

        # 3. Central comes back (new certificates, so its Secret is rotated too): the mirror the
        #    hub took back is deleted there, the running one reports to the hub again.
        plane = planes["central"]
        # Fresh ports: another process may have taken the old ones meanwhile (etcd keeps its
        # data, the new API server address reaches the hub in the rotated Secret).
        plane.etcd_port, plane.etcd_peer_port, plane.api_port = (
            free_port(),
            free_port(),
            free_port(),
        )
        await asyncio.to_thread(plane.start)
        clients["central"] = planes["central"].client()
        rotated = worker_secret("central", ns, flattened(planes["central"].kubeconfig), 10_000.0)
        rotated["metadata"]["annotations"]["example.com/rotated"] = "1"
        await kube.replace(SECRETS, rotated)

        async def central_back() -> bool:
            doc = await clusters()
            return any(c["name"] == "central" and c["reachable"] for c in doc["clusters"])

        await wait_for(central_back, 30)
        await wait_for(lambda: _gone(clients["central"], ns, "queued"), 20)

        async def contact_restored() -> bool:
            conds = (await kube.get(JOBS, "running", ns)).get("status", {}).get("conditions")
            return any(c["type"] == "alnair.io/LostContact" and c["status"] == "False"
                       for c in conds or [])  # fmt: skip

        await wait_for(contact_restored, 20)
        assert await _mirror_exists(clients["central"], ns, "running")
        everywhere = [
            m["metadata"]["name"]
            for name in WORKERS
            for m in (await clients[name].list(JOBS, ns, label_selector=LABEL_ORIGIN))["items"]
        ]
        assert everywhere.count("running") == 1 and everywhere.count("queued") == 1
        # managedBy: the hub's own Job controller made no pods for any of these Jobs.
        assert (await kube.list(PODS, ns))["items"] == []
        took = time.monotonic() - t0
        print(f"queued job moved {moved_after:.1f} s after the kill; test body {took:.0f} s")
        await api.aclose()
    finally:
        if hub is not None:
            await hub.stop()
        for cm in binders.values():
            await cm.__aexit__(None, None, None)
        for client in clients.values():
            await client.close()
        for cp in planes.values():
            cp.stop()
        await bus.close()
        await predictor.stop()


async def _has(seen: list[JobEvent], name: str, phase: JobPhase) -> bool:
    return any(e.name == name and e.phase == phase for e in seen)


async def _gone(kube: KubeClient, ns: str, name: str) -> bool:
    return not await _mirror_exists(kube, ns, name)


async def _mirror_exists(kube: KubeClient, ns: str, name: str) -> bool:
    try:
        await kube.get(JOBS, name, ns)
    except NotFound:
        return False
    return True
