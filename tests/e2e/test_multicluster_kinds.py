"""The hub places more than Jobs: a JobSet (`sigs.k8s.io/jobset`, its CRD and, on the worker,
its controller manager with its webhooks, built by hack/build-peers.sh) goes through the hub's
queue to a worker that serves JobSets, and only to one.

The session's control plane is the hub; two more are workers. `plain` has no JobSet CRD, so no
JobSet can run there: while it is the only worker, a JobSet waits and says why. Once `jobsets`
(JobSet CRD and controller) is registered, the JobSet is placed there: the hub creates its
copy through the worker's API with the GPU model in every replicated Job's pod template,
JobSet's controller makes the Jobs, the worker's Alnair binder binds the pods, KWOK completes
them, and the copy's status, `Completed` included, comes back to the hub's JobSet.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    CLUSTERQUEUES,
    EVENTS,
    JOBSETS,
    LOCALQUEUES,
    KubeClient,
    NotFound,
)
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.hub import ANN_PLACED_CLUSTER, ANN_PLACED_TYPE, MANAGED_BY
from alnair.scheduler.dispatcher.worker_clusters import LABEL_ORIGIN, SECRETS
from dispatcher_support import POOL, flattened, hub_settings, jobset, scheduler, worker_secret
from peers_support import JOBSET, install_crds, peer_controller

pytestmark = pytest.mark.e2e


def hub_jobset(ns: str) -> dict[str, Any]:
    """Two one-GPU workers and a driver without GPUs, handed to the hub."""
    doc = jobset("js", ns, "ml", 2, 3)
    doc["spec"]["managedBy"] = MANAGED_BY
    return doc


async def test_a_jobset_goes_only_to_a_worker_that_serves_jobsets_and_completes_there(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, tmp_path: Path
) -> None:
    ns = namespace
    await install_crds(kube, JOBSET)  # the hub serves JobSets; its controller does not run
    planes = {name: ControlPlane(tmp_path / name) for name in ("plain", "jobsets")}
    await asyncio.gather(*(asyncio.to_thread(cp.start) for cp in planes.values()))
    clients = {name: cp.client() for name, cp in planes.items()}
    await install_crds(clients["jobsets"], JOBSET)
    cq = {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": f"mck-{ns}"},
        "spec": {"resourceGroups": [{"coveredResources": [r.GPU], "flavors": [
            {"name": m, "resources": [{"name": r.GPU, "nominalQuota": 8}]}
            for m in ("V100M32", "P100")]}]},
    }  # fmt: skip
    await kube.create(CLUSTERQUEUES, cq)
    lq = {"apiVersion": "alnair.io/v1alpha1", "kind": "LocalQueue",
          "metadata": {"name": "ml", "namespace": ns}, "spec": {"clusterQueue": f"mck-{ns}"}}  # fmt: skip
    await kube.create(LOCALQUEUES, lq, ns)
    hub = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            for name, nodes in (("plain", "1x V100M32:8"), ("jobsets", "1x P100:4")):
                await planes[name].create_gpu_nodes(
                    nodes, kube=clients[name], prefix=name, labels={POOL: ns}
                )
                await stack.enter_async_context(scheduler(clients[name], f"mck-{name}"))
            await stack.enter_async_context(
                peer_controller(JOBSET, planes["jobsets"], clients["jobsets"], tmp_path, ns)
            )
            text = flattened(planes["plain"].kubeconfig)
            await kube.create(SECRETS, worker_secret("plain", ns, text, 10_000.0), ns)
            hub = await start_dispatcher(hub_settings(control_plane, ns, nats_url))
            api = await stack.enter_async_context(httpx.AsyncClient(base_url=hub.url))

            async def cluster(name: str) -> dict[str, Any] | None:
                doc = (await api.get("/v1/clusters")).json()
                found = [c for c in doc["clusters"] if c["name"] == name and c["synced"]]
                return found[0] if found else None

            plain = await wait_for(lambda: cluster("plain"), 30)
            assert "Job" in plain["kinds"] and "JobSet" not in plain["kinds"]

            # Only `plain` (no JobSets there): the JobSet waits, and says why.
            await kube.create(JOBSETS, hub_jobset(ns), ns)

            async def explained() -> dict[str, Any] | None:
                doc = (await api.get(f"/v1/jobsets/{ns}/js")).json()
                return doc if doc.get("reason") else None

            why = await wait_for(explained, 30)
            assert why["kind"] == "JobSet" and why["status"] == "waiting"
            assert "serves its kind" in why["reason"]["message"], why

            # The reason is on the state as the hub writes the Event: wait for the Event.
            async def evented() -> bool:
                listed = await kube.list(EVENTS, ns, field_selector="involvedObject.name=js")
                return any(e["involvedObject"]["kind"] == "JobSet" for e in listed["items"])

            assert await wait_for(evented, 10)

            # A worker that serves JobSets: the JobSet goes there, and only there.
            text = flattened(planes["jobsets"].kubeconfig)
            await kube.create(SECRETS, worker_secret("jobsets", ns, text, 10_000.0), ns)

            async def placed() -> dict[str, Any] | None:
                js = await kube.get(JOBSETS, "js", ns)
                annotations = js["metadata"].get("annotations") or {}
                return js if annotations.get(ANN_PLACED_CLUSTER) else None

            js = await wait_for(placed, 30)
            assert js["metadata"]["annotations"][ANN_PLACED_CLUSTER] == "jobsets"
            assert js["metadata"]["annotations"][ANN_PLACED_TYPE] == "P100"
            worker = clients["jobsets"]

            async def copied() -> dict[str, Any] | None:
                try:
                    return await worker.get(JOBSETS, "js", ns)
                except NotFound:
                    return None

            copy = await wait_for(copied, 30)
            assert copy["metadata"]["labels"][LABEL_ORIGIN] == js["metadata"]["uid"]
            assert not copy["spec"].get("managedBy") and copy["spec"]["suspend"] is False
            for rj in copy["spec"]["replicatedJobs"]:
                selector = rj["template"]["spec"]["template"]["spec"]["nodeSelector"]
                assert selector[r.LABEL_GPU_MODEL] == "P100", rj["name"]
            with pytest.raises(NotFound):  # no JobSets there at all
                await clients["plain"].get(JOBSETS, "js", ns)

            # JobSet's controller runs it on the worker; its status comes back to the hub's.
            async def completed() -> bool:
                conds = ((await kube.get(JOBSETS, "js", ns)).get("status") or {}).get(
                    "conditions"
                ) or []
                return any(c["type"] == "Completed" and c["status"] == "True" for c in conds)

            await wait_for(completed, 90, 0.2)

            # The hub explains what it wrote; the write and its answer are a moment apart.
            async def explained_done() -> dict[str, Any] | None:
                doc = (await api.get(f"/v1/jobsets/{ns}/js")).json()
                return doc if doc["status"] != "placed" else None

            final = await wait_for(explained_done, 5, 0.1)
            assert final["status"] == "completed" and final["cluster"] == "jobsets", final
            await hub.stop()
            hub = None
    finally:
        if hub is not None:
            await hub.stop()
        await kube.delete(CLUSTERQUEUES, f"mck-{ns}")
        for name, cp in planes.items():
            await clients[name].close()
            await asyncio.to_thread(cp.stop)
