"""Kueue's own `Workload` objects admitted by Alnair's dispatcher, with Kueue's controller absent
(issue 28): written in their status as Kueue writes them, so whatever reads Kueue's API (its
performance runner, `kubectl get workloads`) sees what it would see under Kueue.

Kueue's CRDs come from `sigs.k8s.io/kueue` at the version hack/build-peers.sh caches; the
dispatcher runs under its shipped ServiceAccount with `queue_api: kueue`. The test plays what
runs a Workload (as Kueue's job integrations and its performance runner do): it finishes an
admitted one by its `Finished` condition and, when one is evicted, takes its reservation back.
"""

from __future__ import annotations

import asyncio
import csv
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from alnair.common import resources as r
from alnair.common.kube import KubeClient, Obj
from alnair.common.tasks import within
from alnair.dev.builders import shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import apply_crds
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher import kueue_queues as kq
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.kueue_workload import WORKLOADS
from dispatcher_support import POOL, dispatcher_settings, events, explain, scheduler
from peers_support import kueue_folder

pytestmark = pytest.mark.e2e

RESOURCES = {"ResourceFlavor": kq.RESOURCEFLAVORS, "ClusterQueue": kq.CLUSTERQUEUES}


def kueue(kind: str, name: str, spec: dict[str, Any]) -> Obj:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def workload(
    name: str, ns: str, queue: str, *, cpu: str = "1", gpus: int = 0, count: int = 1,
    priority: int | None = None,
) -> Obj:  # fmt: skip
    requests: dict[str, str] = {"cpu": cpu}
    if gpus:
        requests[r.GPU] = str(gpus)
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": "main", "count": count, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": requests}}],
        }}}],
    }  # fmt: skip
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip


def cond(obj: Obj, kind: str) -> Obj | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None
    )


async def _admitted(kube: KubeClient, ns: str, name: str) -> Obj | None:
    wl = await kube.get(WORKLOADS, name, ns)
    c = cond(wl, "Admitted")
    return wl if c is not None and c["status"] == "True" else None


async def _finish(kube: KubeClient, ns: str, name: str) -> None:
    """What runs the Workload says it finished (the runner's `Finished` condition)."""
    wl = await kube.get(WORKLOADS, name, ns)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conds = [c for c in wl["status"]["conditions"] if c["type"] != "Finished"]
    conds.append({"type": "Finished", "status": "True", "reason": "ByTest",
                  "message": "By test", "lastTransitionTime": now})  # fmt: skip
    patch = {"metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
             "status": {"conditions": conds}}  # fmt: skip
    await kube.patch(WORKLOADS, name, patch, ns, sub="status")


async def _release(kube: KubeClient, ns: str, name: str) -> None:
    """What runs an evicted Workload does once it stopped: its reservation goes."""
    wl = await kube.get(WORKLOADS, name, ns)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conds = [
        c for c in wl["status"]["conditions"] if c["type"] not in ("QuotaReserved", "Admitted")
    ]
    conds += [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": "Evicted by the test", "lastTransitionTime": now},
        {"type": "Admitted", "status": "False", "reason": "NoReservation",
         "message": "Evicted by the test", "lastTransitionTime": now},
    ]  # fmt: skip
    patch = {"metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
             "status": {"conditions": conds, "admission": None}}  # fmt: skip
    await kube.patch(WORKLOADS, name, patch, ns, sub="status")


async def test_kueue_workloads_are_admitted_wait_and_are_preempted_in_their_status(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    assert (kueue_folder() / "crds").is_dir()
    await apply_crds(kube, kueue_folder() / "crds")
    config = await shipped_account(control_plane, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    await control_plane.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns})
    every = {"namespaceSelector": {}}
    objects = [
        kueue("ResourceFlavor", f"cpu-{ns}", {}),
        kueue("ResourceFlavor", f"v100-{ns}", {"nodeLabels": {r.LABEL_GPU_MODEL: "V100M32"}}),
        # CPU quota of 4, lower priorities preempted within the queue (the runner's shape)
        kueue("ClusterQueue", f"cpu-{ns}", {**every, "cohortName": f"co-{ns}",
              "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
              "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": f"cpu-{ns}",
              "resources": [{"name": "cpu", "nominalQuota": 4}]}]}]}),
        # GPUs and CPU: a Workload asking both is counted in both flavors
        kueue("ClusterQueue", f"gpu-{ns}", {**every, "resourceGroups": [
            {"coveredResources": [r.GPU], "flavors": [{"name": f"v100-{ns}",
             "resources": [{"name": r.GPU, "nominalQuota": 4}]}]},
            {"coveredResources": ["cpu"], "flavors": [{"name": f"cpu-{ns}",
             "resources": [{"name": "cpu", "nominalQuota": 8}]}]}]}),
    ]  # fmt: skip
    for doc in objects:
        await kube.create(RESOURCES[doc["kind"]], doc)
    for queue in ("cpu", "gpu"):
        await kube.create(
            kq.LOCALQUEUES, kueue("LocalQueue", queue, {"clusterQueue": f"{queue}-{ns}"}), ns
        )

    async with scheduler(kube), KubeClient(config) as as_dispatcher:
        running = await start_dispatcher(
            dispatcher_settings(control_plane, ns, queue_api="kueue"), as_dispatcher
        )
        try:
            # Two fit the queue's 4 CPUs; the third waits, said in its QuotaReserved condition.
            for name, cpu in (("w1", "2"), ("w2", "2"), ("w3", "2")):
                await kube.create(WORKLOADS, workload(name, ns, "cpu", cpu=cpu, priority=10), ns)
            w1 = await wait_for(lambda: _admitted(kube, ns, "w1"), 20)
            assert await wait_for(lambda: _admitted(kube, ns, "w2"), 20)
            assert w1["status"]["admission"] == {
                "clusterQueue": f"cpu-{ns}",
                "podSetAssignments": [{"name": "main", "count": 1,
                                       "flavors": {"cpu": f"cpu-{ns}"},
                                       "resourceUsage": {"cpu": "2"}}],
            }  # fmt: skip
            assert cond(w1, "QuotaReserved")["status"] == "True"

            async def pending(name: str) -> Obj | None:
                c = cond(await kube.get(WORKLOADS, name, ns), "QuotaReserved")
                return c if c is not None and c["status"] == "False" else None

            waiting = await wait_for(lambda: pending("w3"), 20)
            assert waiting["reason"] == "Pending"
            assert "cpu" in waiting["message"] and f"cpu-{ns}" in waiting["message"], waiting
            assert await wait_for(lambda: events(kube, ns, "w3", "Waiting"), 10)

            # The ClusterQueue's status as Kueue keeps it (what Kueue's runner reads).
            async def status() -> Obj | None:
                st = (await kube.get(kq.CLUSTERQUEUES, f"cpu-{ns}")).get("status") or {}
                return st if st.get("reservingWorkloads") == 2 else None

            st = await wait_for(status, 20)
            assert st["pendingWorkloads"] == 1 and st["admittedWorkloads"] == 2
            assert st["flavorsReservation"] == [{"name": f"cpu-{ns}", "resources": [
                {"name": "cpu", "total": "4", "borrowed": "0"}]}]  # fmt: skip
            assert any(c["type"] == "Active" and c["status"] == "True" for c in st["conditions"])

            # Finished: its quota goes back and the waiting one is admitted.
            await _finish(kube, ns, "w1")
            assert await wait_for(lambda: _admitted(kube, ns, "w3"), 20)

            # A higher priority takes quota back (withinClusterQueue: LowerPriority): one of
            # the lower ones (both 2 CPUs, priority 10) is evicted, and keeps its reservation
            # until what runs it gives it back; then the higher one is admitted.
            await kube.create(WORKLOADS, workload("hi", ns, "cpu", cpu="2", priority=100), ns)

            async def evicted() -> list[tuple[str, Obj]]:
                out = []
                for name in ("w2", "w3"):
                    c = cond(await kube.get(WORKLOADS, name, ns), "Evicted")
                    if c is not None and c["status"] == "True":
                        out.append((name, c))
                return out

            ((victim, ev),) = await wait_for(evicted, 20)  # one was enough
            assert ev["reason"] == "Preempted" and "hi" in ev["message"], ev
            assert cond(await kube.get(WORKLOADS, victim, ns), "Preempted")["status"] == "True"
            assert await _admitted(kube, ns, "hi") is None  # not before the victim gives it back
            await _release(kube, ns, victim)
            assert await wait_for(lambda: _admitted(kube, ns, "hi"), 20)
            assert await wait_for(lambda: events(kube, ns, victim, "Preempted"), 10)
            assert len(await evicted()) == 1

            # A GPU Workload: its model's flavor, and its CPU in the CPU flavor.
            await kube.create(WORKLOADS, workload("g1", ns, "gpu", cpu="1", gpus=2, count=2), ns)
            g1 = await wait_for(lambda: _admitted(kube, ns, "g1"), 20)
            (psa,) = g1["status"]["admission"]["podSetAssignments"]
            assert psa["flavors"] == {"cpu": f"cpu-{ns}", r.GPU: f"v100-{ns}"}
            assert psa["resourceUsage"] == {"cpu": "2", r.GPU: "4"} and psa["count"] == 2
            explained = await wait_for(lambda: explain(
                running, ns, "g1", lambda d: d.get("gpu_model"), kind="workloads"), 10)  # fmt: skip
            assert explained["gpu_model"] == "V100M32", explained
        finally:
            await running.stop()


# --- Kueue's own scheduler performance runner, unchanged ----------------------------------------

GENERATOR = {
    "cohorts": [{"className": "cohort", "count": 1, "queuesSets": [{
        # no preemption here (the hand-made test above has it): what is checked is that
        # Kueue's runner, recorder and checker read what the dispatcher writes
        "className": "cq", "count": 2, "nominalQuota": 20, "borrowingLimit": 100,
        "reclaimWithinCohort": "Never", "withinClusterQueue": "Never",
        "workloadsSets": [
            {"count": 20, "creationIntervalMs": 100, "workloads": [
                {"className": "small", "runtimeMs": 200, "priority": 50, "request": 1}]},
            {"count": 6, "creationIntervalMs": 300, "workloads": [
                {"className": "medium", "runtimeMs": 500, "priority": 100, "request": 5}]},
            {"count": 3, "creationIntervalMs": 600, "workloads": [
                {"className": "large", "runtimeMs": 1000, "priority": 200, "request": 20}]},
        ]}]}],
}  # fmt: skip
RANGE = {
    # generous bounds for a loaded two-core machine: the point is Kueue's checker accepting
    # what the dispatcher wrote, read by Kueue's own recorder
    "cmd": {"maxWallMs": 180_000},
    "clusterQueueClassesMinUsage": {"cq": 1},
    "wlClassesMaxAvgTimeToAdmissionMs": {"small": 60_000, "medium": 60_000, "large": 60_000},
}


async def test_kueue_performance_runner_and_checker_accept_the_dispatcher(tmp_path: Path) -> None:
    """Kueue's runner creates its cohorts, ClusterQueues, LocalQueues and Workloads, finishes
    what is admitted and records from the ClusterQueues' status; the dispatcher (its shipped
    RBAC) admits them. Every Workload is admitted and finished, and Kueue's checker passes.
    A control plane of its own: the runner records every ClusterQueue and Workload there is."""
    perf = kueue_folder() / "perf"
    assert (perf / "runner").exists(), "run hack/build-peers.sh"
    plane = ControlPlane(tmp_path / "k8s", kwok=False)
    await asyncio.to_thread(plane.start)
    try:
        await _run_kueue_runner(plane, perf, tmp_path)
    finally:
        await asyncio.to_thread(plane.cleanup)


async def _run_kueue_runner(plane: ControlPlane, perf: Path, tmp_path: Path) -> None:
    async with plane.client() as kube:
        await apply_crds(kube, kueue_folder() / "crds")
        config = await shipped_account(plane, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    (tmp_path / "generator.yaml").write_text(yaml.safe_dump(GENERATOR))
    (tmp_path / "rangespec.yaml").write_text(yaml.safe_dump(RANGE))
    out = tmp_path / "out"
    out.mkdir()
    async with KubeClient(config) as as_dispatcher:
        running = await start_dispatcher(
            dispatcher_settings(plane, "none", queue_api="kueue"), as_dispatcher
        )
        started = time.monotonic()
        try:
            runner = await asyncio.create_subprocess_exec(
                str(perf / "runner"), "-o", str(out),
                f"--generatorConfig={tmp_path / 'generator.yaml'}", "--timeout=150s",
                "--qps=200", "--burst=400", "--zap-log-level=error",
                env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            output, _ = await within(runner.communicate(), 240)
            wall = time.monotonic() - started
        finally:
            await running.stop()
    assert runner.returncode == 0, output.decode(errors="replace")[-3000:]
    rows = list(csv.DictReader((out / "wlStates.csv").read_text().splitlines()))
    assert len(rows) == 2 * (20 + 6 + 3)
    assert all(int(r["ms to finish"]) > 0 for r in rows), [
        r for r in rows if r["ms to finish"] == "0"
    ]
    stats = out / "alnair.stats.yaml"
    stats.write_text(yaml.safe_dump({"wallMs": int(wall * 1000), "userMs": 0, "sysMs": 0,
                                     "maxrss": 0}))  # fmt: skip
    checker = await asyncio.create_subprocess_exec(
        str(perf / "checker.test"), "-test.run", "TestScalability", "-test.v",
        f"-summary={out / 'summary.yaml'}", f"-cmdStats={stats}",
        f"-range={tmp_path / 'rangespec.yaml'}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    verdict, _ = await within(checker.communicate(), 120)
    assert checker.returncode == 0, verdict.decode(errors="replace")[-3000:]
    summary = yaml.safe_load((out / "summary.yaml").read_text())
    assert set(summary["workloadClasses"]) == {"small", "medium", "large"}
