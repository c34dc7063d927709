"""The dispatcher's aggregated query API and `kubectl alnair`, through the real API server
(issue 29): registered as an APIService, reached with kubectl's own credentials, RBAC checked
by the API server and again by the dispatcher, and each refusal shown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alnair.common import resources as r
from alnair.common.aggregated import SCHEDULER_GROUP
from alnair.common.kube import APISERVICES, JOBS, PODS, KubeClient, NotFound, Resource
from alnair.common.tls import issue, write_folder
from alnair.dev.builders import make_pod, shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import register_api_service
from alnair.dev.waiting import wait_for
from alnair.scheduler.app import start_query
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.query_api import GROUP, VERSION
from dispatcher_support import (
    POOL,
    admitted_type,
    cohort_queues,
    dispatcher_settings,
    explain,
    gpu_job,
)
from scheduler_support import Running, pool, seen_ready

pytestmark = pytest.mark.e2e

ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
BIN = Path(sys.executable).parent
SERVICE = "alnair-dispatcher-query"
SCHEDULER_SERVICE = "alnair-scheduler-query"


async def sh(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """kubectl (the real one; `kubectl alnair` is found on PATH as a user's would be), run
    beside the event loop the dispatcher under test serves on."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(cp.kubeconfig)}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "kubectl"), *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    done = subprocess.CompletedProcess(list(args), proc.returncode or 0, out.decode(), err.decode())
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.returncode}: {done.stderr}")
    return done


async def _available(kube: KubeClient, group: str = GROUP) -> bool:
    api = await kube.get(APISERVICES, f"{VERSION}.{group}")
    conds = (api.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conds)


async def test_queues_and_jobs_through_the_api_server_with_rbac(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    # Two teams of 4 GPUs in one cohort: ml borrows what lab does not use.
    await cohort_queues(kube, ns, "c", {"ml": (4, None), "lab": (4, None)})
    # The serving certificate names what the aggregator checks: <service>.<namespace>.svc.
    issued = issue([f"{SERVICE}.default.svc", "127.0.0.1"])
    write_folder(tmp_path / "tls", issued.secret_data())
    # The dispatcher under its own account, with the RBAC it ships (the APIService is
    # registered by URL below, as the local stack does).
    account = await shipped_account(
        cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml", "dispatcher/query-api.yaml",
        skip={"APIService"},
    )  # fmt: skip
    as_dispatcher = KubeClient(account)
    running = await start_dispatcher(
        dispatcher_settings(cp, ns, webhook_cert_dir=str(tmp_path / "tls"), webhook_port=0),
        kube=as_dispatcher,
    )
    try:
        assert running.webhook is not None
        port = int(running.webhook.url.rsplit(":", 1)[1])
        await register_api_service(kube, GROUP, VERSION, port, issued.ca_pem, service=SERVICE)
        await wait_for(lambda: _available(kube), 60, what="APIService Available")

        # small fits ml's own quota, extra borrows 2 of lab's, large waits (quota).
        for name, gpus in (("small", 4), ("extra", 2)):
            await kube.create(JOBS, gpu_job(name, ns, "ml", gpus), ns)
            await wait_for(lambda n=name: admitted_type(kube, ns, n), 20)
        await kube.create(JOBS, gpu_job("large", ns, "ml", 8), ns)
        await wait_for(lambda: explain(running, ns, "large", lambda d: d["reason"]), 20)
        await wait_for(lambda: _counted(running, f"ml-{ns}", pending=1, admitted=2), 20)

        # kubectl's own credentials (an administrator here): raw reads of each resource.
        raw = await sh(
            cp, "get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/queuedworkloads"
        )
        doc = json.loads(raw.stdout)
        assert doc["kind"] == "QueuedWorkloadList"
        assert [(i["job"], i["status"]) for i in doc["items"]] == [
            (f"{ns}/large", "waiting"), (f"{ns}/extra", "admitted"), (f"{ns}/small", "admitted"),
        ]  # fmt: skip

        # `kubectl alnair`, table and JSON, against the state made above.
        queues = (await sh(cp, "alnair", "queues")).stdout.splitlines()
        assert queues[0].split() == [
            "NAME", "COHORT", "ACTIVE", "PENDING", "ADMITTED", "NOMINAL", "USED", "BORROWED",
            "LENT",
        ]  # fmt: skip
        rows = {line.split()[0]: line.split() for line in queues[1:]}
        assert rows[f"ml-{ns}"] == [f"ml-{ns}", f"c-{ns}", "True", "1", "2", "V100M32=4",
                                    "V100M32=6", "2", "0"]  # fmt: skip
        assert rows[f"lab-{ns}"] == [f"lab-{ns}", f"c-{ns}", "True", "0", "0", "V100M32=4",
                                     "<none>", "0", "2"]  # fmt: skip
        as_json = json.loads((await sh(cp, "alnair", "queues", "-o", "json")).stdout)
        ours = next(q for q in as_json["items"] if q["name"] == f"ml-{ns}")
        assert ours == {
            "name": f"ml-{ns}", "cohort": f"c-{ns}", "active": True, "problem": None,
            "nominal": {"V100M32": 4}, "borrowingLimit": {}, "used": {"V100M32": 6},
            "borrowed": 2, "lent": 0, "pending": 1, "admitted": 2,
        }  # fmt: skip
        jobs = (await sh(cp, "alnair", "jobs", "-n", ns)).stdout
        assert [line.split()[:6] for line in jobs.splitlines()] == [
            ["NAME", "KIND", "QUEUE", "STATUS", "POSITION", "GPU-MODEL"],
            ["large", "Job", "ml", "waiting", "1", "<none>"],
            ["extra", "Job", "ml", "admitted", "<none>", "V100M32"],
            ["small", "Job", "ml", "admitted", "<none>", "V100M32"],
        ]
        assert jobs.splitlines()[1].split()[-1] == "quota", jobs
        jobs_yaml = yaml.safe_load((await sh(cp, "alnair", "jobs", "-n", ns, "-o", "yaml")).stdout)
        assert [i["status"] for i in jobs_yaml["items"]] == ["waiting", "admitted", "admitted"]
        why = (await sh(cp, "alnair", "why", "job/large", "-n", ns)).stdout
        fields = dict(line.split(":", 1) for line in why.splitlines())
        assert fields["Workload"].strip() == f"Job {ns}/large"
        assert fields["Status"].strip() == "waiting"
        assert fields["Queue"].strip() == f"ml (ClusterQueue ml-{ns})"
        assert fields["Waits for"].strip() == "quota"
        why_json = json.loads(
            (await sh(cp, "alnair", "why", "job/large", "-n", ns, "-o", "json")).stdout
        )
        assert why_json["kind"] == "WorkloadExplanation"
        assert why_json["workload"]["position"] == 1
        unknown = await sh(cp, "alnair", "why", "job/nothing", "-n", ns, check=False)
        assert unknown.returncode == 1 and "no queued Job" in unknown.stderr, unknown.stderr

        # A user without RBAC: the API server refuses before the dispatcher is asked.
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/queuedworkloads"
        refused = await sh(cp, "get", "--raw", path, "--as", f"alice-{ns}", check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
        # Granted in this namespace only: read here, refused elsewhere.
        await _grant(kube, ns, f"alice-{ns}")
        allowed = await sh(cp, "get", "--raw", path, "--as", f"alice-{ns}")
        assert len(json.loads(allowed.stdout)["items"]) == 3
        other = await sh(cp, "get", "--raw", path.replace(f"/{ns}/", "/default/"), "--as",
                   f"alice-{ns}", check=False)  # fmt: skip
        assert other.returncode != 0 and "forbidden" in other.stderr.lower()

        await _direct_calls(cp, port, issued.ca_pem, ns)
    finally:
        await running.stop()
        await as_dispatcher.close()
    # Registered, nobody answering: one line naming the dispatcher.
    down = await sh(cp, "alnair", "queues", check=False)
    assert down.returncode == 1 and down.stderr.count("\n") == 1, down.stderr
    assert "dispatcher" in down.stderr and "not answering" in down.stderr, down.stderr
    # Not registered at all.
    await kube.delete(APISERVICES, f"{VERSION}.{GROUP}")
    await wait_for(lambda: _unserved(cp), 30, what="discovery forgets the group")
    gone = await sh(cp, "alnair", "jobs", "-n", ns, check=False)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1, gone.stderr
    assert "dispatcher is not deployed" in gone.stderr and f"{VERSION}.{GROUP}" in gone.stderr


async def _unserved(cp: ControlPlane) -> bool:
    done = await sh(cp, "get", "--raw", f"/apis/{GROUP}/{VERSION}", check=False)
    said = (done.stderr + done.stdout).lower()
    return done.returncode != 0 and ("notfound" in said or "not found" in said)


async def _counted(running: Any, queue: str, *, pending: int, admitted: int) -> bool:
    report = running.dispatcher.queue_report.get(queue) or {}
    return report.get("pendingWorkloads") == pending and report.get("admittedWorkloads") == admitted


async def _grant(kube: KubeClient, ns: str, user: str) -> None:
    await kube.create(ROLES, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "query-view", "namespace": ns},
        "rules": [{"apiGroups": [GROUP], "resources": ["*"], "verbs": ["get", "list"]}],
    }, ns)  # fmt: skip
    await kube.create(ROLEBINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "query-view", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "query-view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }, ns)  # fmt: skip
    # RBAC's cache: the binding applies within a moment.
    await asyncio.sleep(0.5)


async def _direct_calls(cp: ControlPlane, port: int, ca_pem: bytes, ns: str) -> None:
    """The dispatcher trusts the identity headers only from the front proxy's certificate,
    and authorizes that identity itself."""
    assert cp.pki is not None
    url = f"https://127.0.0.1:{port}/apis/{GROUP}/{VERSION}/namespaces/{ns}/queuedworkloads"
    plain = ssl.create_default_context(cadata=ca_pem.decode())
    forged = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}
    async with httpx.AsyncClient(verify=plain) as http:
        resp = await http.get(url, headers=forged)
    assert resp.status_code == 401, resp.text
    assert resp.json()["kind"] == "Status"
    # The front proxy's own certificate, naming a user RBAC knows nothing of: refused by the
    # dispatcher's own SubjectAccessReview.
    proxy = ssl.create_default_context(cadata=ca_pem.decode())
    proxy.load_cert_chain(str(cp.pki.front_proxy_cert), str(cp.pki.front_proxy_key))
    async with httpx.AsyncClient(verify=proxy) as http:
        resp = await http.get(url, headers={"X-Remote-User": "mallory"})
        assert resp.status_code == 403, resp.text
        assert "mallory" in resp.json()["message"]
        resp = await http.get(url, headers={"X-Remote-User": f"alice-{ns}"})
        assert resp.status_code == 200, resp.text
    # A client certificate from another CA (the cluster's own admin): the handshake fails.
    other = ssl.create_default_context(cadata=ca_pem.decode())
    other.load_cert_chain(str(cp.pki.admin_cert), str(cp.pki.admin_key))
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient(verify=other) as http:
            await http.get(url, headers=forged)


async def test_gpus_top_and_why_pod_through_the_api_server(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    (node,) = await pool(cp, kube, "1x T4:4", ns)
    issued = issue([f"{SCHEDULER_SERVICE}.default.svc", "127.0.0.1"])
    write_folder(tmp_path / "tls", issued.secret_data())
    # The scheduler under its own account, with the RBAC it ships.
    account = await shipped_account(
        cp, kube, "alnair-scheduler", "scheduler/rbac.yaml", "scheduler/query-api.yaml",
        skip={"APIService"},
    )  # fmt: skip
    as_scheduler = KubeClient(account)
    running = Running(
        as_scheduler, query_cert_dir=str(tmp_path / "tls"), query_port=0, http_host="127.0.0.1"
    )
    sched = await running.start()
    secure = await start_query(sched.settings, as_scheduler, sched)
    assert secure is not None
    try:
        await register_api_service(
            kube, SCHEDULER_GROUP, VERSION, secure.port, issued.ca_pem, service=SCHEDULER_SERVICE
        )
        await wait_for(lambda: _available(kube, SCHEDULER_GROUP), 60, what="APIService Available")
        await seen_ready(sched, [node])
        await kube.create(PODS, make_pod("whole", ns).pool(ns).gpus(2).obj(), ns)
        await kube.create(PODS, make_pod("half", ns).pool(ns).fraction(50, 2000).obj(), ns)
        await kube.create(PODS, make_pod("huge", ns).pool(ns).gpus(8).obj(), ns)
        whole = await wait_for(lambda: _bound(kube, ns, "whole"), 30)
        half = await wait_for(lambda: _bound(kube, ns, "half"), 30)
        held = [int(g) for g in whole["metadata"]["annotations"][r.ANN_GPU_INDICES].split(",")]
        shared = int(half["metadata"]["annotations"][r.ANN_GPU_INDICES])
        # What the profiler reports on the bus: a GPU gone bad, the half pod's measured use.
        idle = next(g for g in range(4) if g not in held and g != shared)
        sched.on_gpu_health(node, idle, False)
        sched.on_gpu_util(node, shared, 40.0, half["metadata"]["uid"], 1024.0)

        table = (await sh(cp, "alnair", "gpus")).stdout.splitlines()
        assert table[0].split() == [
            "NODE", "MODEL", "GPU", "HEALTHY", "UTIL", "USED", "HOLDERS", "NODE-FRAGMENTATION",
        ]  # fmt: skip
        rows = {int(line.split()[2]): line.split() for line in table if line.startswith(node)}
        # The one healthy free GPU's half is all that is free, and it is stranded in a GPU a
        # pod already holds (the unhealthy GPU counts as no free capacity).
        frag = "1"
        for g in held:
            assert rows[g] == [node, "T4", str(g), "True", "0%", "1", f"{ns}/whole=1", frag]
        assert rows[shared] == [node, "T4", str(shared), "True", "40%", "0.5", f"{ns}/half=0.5",
                                frag]  # fmt: skip
        assert rows[idle] == [node, "T4", str(idle), "False", "0%", "0", "<none>", frag]
        as_json = json.loads((await sh(cp, "alnair", "gpus", "-o", "json")).stdout)
        ours = next(n for n in as_json["items"] if n["node"] == node)
        assert ours["freeMilli"] == 500 and ours["strandedMilli"] == 500

        top = (await sh(cp, "alnair", "top", "-n", ns)).stdout.splitlines()
        assert top[0].split() == ["POD", "NODE", "GPU", "SHARE", "UTIL", "MEMORY"]
        assert sorted(line.split() for line in top[1:]) == sorted(
            [["half", node, str(shared), "0.5", "40%", "1024Mi"]]
            + [["whole", node, str(g), "1", "<none>", "<none>"] for g in held]
        )
        why = (await sh(cp, "alnair", "why", "pod/huge", "-n", ns)).stdout
        lines = why.splitlines()
        fields = {k: v.strip() for k, v in (line.split(":", 1) for line in lines if line[0] != " ")}
        assert fields["Pod"] == f"{ns}/huge" and fields["Node"] == "<none>"
        assert fields["Request"] == "8 GPU, 1000m CPU, 1024Mi", fields
        # Every filter's verdict, by reason: our node lacks whole GPUs.
        filtered = [fields["Filtered"]] + [line.strip() for line in lines if line[0] == " "]
        assert f"Insufficient whole GPUs (1 node): {node}" in filtered, why
        missing = await sh(cp, "alnair", "why", "pod/nothing", "-n", ns, check=False)
        assert missing.returncode == 1 and "not found" in missing.stderr, missing.stderr
    finally:
        await secure.stop()
        await running.stop()
        await as_scheduler.close()
        with contextlib.suppress(NotFound):
            await kube.delete(APISERVICES, f"{VERSION}.{SCHEDULER_GROUP}")


async def _bound(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    pod = await kube.get(PODS, name, ns)
    return pod if pod["spec"].get("nodeName") else None
