"""What the dispatcher's e2e tests share: queue-labelled Jobs, ClusterQueues and LocalQueues,
the dispatcher's settings on a test's own node pool, and how to read what it decided."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from alnair.common import resources as r
from alnair.common.kube import (
    CLUSTERQUEUES,
    COHORTS,
    EVENTS,
    JOBS,
    LOCALQUEUES,
    MUTATING_WEBHOOKS,
    ApiError,
    KubeClient,
    NotFound,
    Unavailable,
)
from alnair.common.tls import issue, write_folder
from alnair.dev.builders import BASE, shipped_account
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.controlplane import load_manifests
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import Running as RunningDispatcher
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE, LABEL_QUEUE
from alnair.scheduler.dispatcher.settings import DispatcherSettings
from alnair.scheduler.dispatcher.worker_clusters import (
    ANN_BANDWIDTH,
    ANN_CLUSTER_NAME,
    ANN_REGION,
    LABEL_WORKER,
)
from alnair.scheduler.live.scheduler import Scheduler
from alnair.scheduler.settings import SchedulerSettings

POOL = "alnair.io/test-pool"
WEBHOOK_CONFIG = "alnair-dispatcher"
"""The shipped MutatingWebhookConfiguration's name (deploy/kustomize/base/dispatcher)."""


def gpu_job(
    name: str, ns: str, queue: str, gpus: int, *, duration_s: float = 600,
    model: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {LABEL_QUEUE: queue},
            "annotations": dict(model or {}),
        },
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {r.ANN_DURATION: f"{duration_s}s"}},
                "spec": {
                    "schedulerName": r.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "nodeSelector": {POOL: ns},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer",
                            "resources": {"limits": {r.GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def cluster_queue(
    name: str, cohort: str | None, quota: dict[str, int], borrowing: int | None = None
) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    flavors = []
    for model, nominal in quota.items():
        resources = [{"name": r.GPU, "nominalQuota": nominal}]
        if borrowing is not None:
            resources[0]["borrowingLimit"] = borrowing
        flavors.append({"name": model, "resources": resources})
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": [r.GPU], "flavors": flavors}]}
    if cohort:
        spec["cohort"] = cohort
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


async def cohort_queues(
    kube: KubeClient, ns: str, cohort: str, queues: dict[str, tuple[int, int | None]],
    model: str = "V100M32",
) -> None:  # fmt: skip
    """A Cohort `<cohort>-<ns>`; per LocalQueue name in `queues`, a ClusterQueue
    `<name>-<ns>` in that cohort with (nominal quota, borrowing limit) GPUs of `model`, and the
    LocalQueue in `ns` that points at it."""
    await kube.create(COHORTS, {"apiVersion": "alnair.io/v1alpha1", "kind": "Cohort",
                                "metadata": {"name": f"{cohort}-{ns}"}})  # fmt: skip
    for name, (nominal, borrowing) in queues.items():
        cq = f"{name}-{ns}"
        await kube.create(
            CLUSTERQUEUES, cluster_queue(cq, f"{cohort}-{ns}", {model: nominal}, borrowing)
        )
        await kube.create(LOCALQUEUES, local_queue(name, ns, cq), ns)


def local_queue(name: str, ns: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterQueue": cq},
    }


async def job(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.get(JOBS, name, ns)


async def admitted_type(kube: KubeClient, ns: str, name: str) -> str | None:
    j = await job(kube, ns, name)
    if j["spec"].get("suspend"):
        return None
    return (j["metadata"].get("annotations") or {}).get(ANN_ADMITTED_TYPE)


def dispatcher_settings(cp: ControlPlane, ns: str, **kw: Any) -> DispatcherSettings:
    base: dict[str, Any] = {
        "kubeconfig": str(cp.kubeconfig),
        "http_port": 0,
        "http_host": "127.0.0.1",
        "nats_enabled": False,
        "leader_elect": False,  # (its own tests elect; one Lease would serialise the others)
        "node_selector": f"{POOL}={ns}",
        "policy": "alnair",
    }
    base.update(kw)
    return DispatcherSettings(**base)


def hub_settings(cp: ControlPlane, ns: str, nats_url: str) -> DispatcherSettings:
    """A hub on `cp` over the worker Secrets in `ns` (a short grace period: tests lose
    workers on purpose)."""
    return DispatcherSettings(
        kubeconfig=str(cp.kubeconfig), http_port=0, http_host="127.0.0.1", nats_url=nats_url,
        mode="hub", hub_namespace=ns, worker_grace_s=2.0, cluster="hub", leader_elect=False,
    )  # fmt: skip


async def explain(
    running: RunningDispatcher, ns: str, name: str, ok: Any, *, kind: str = "jobs"
) -> Any:
    """The dispatcher's explanation of a workload (`kind`: the API's plural), if `ok(it)`."""
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{running.url}/v1/{kind}/{ns}/{name}")
    if resp.status_code != 200:
        return None
    doc = resp.json()
    return doc if ok(doc) else None


@contextlib.asynccontextmanager
async def scheduler(kube: KubeClient, identity: str = "disp-e2e") -> AsyncIterator[Scheduler]:
    """Alnair's scheduler in this process (no leader election, no bus), until exit."""
    sched = Scheduler(
        kube,
        SchedulerSettings(leader_elect=False, nats_enabled=False, seed=3, identity=identity),
    )
    await sched.start_watching()
    task = asyncio.create_task(sched.run())
    try:
        yield sched
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sched.stop()


def url_webhook_config(url: str, namespace: str) -> dict[str, Any]:
    """The shipped configuration, pointed at `url` and limited to the test's namespace (so no
    other test's Jobs depend on this dispatcher)."""
    (config,) = [
        d
        for d in load_manifests(BASE / "dispatcher" / "webhook.yaml")
        if d["kind"] == "MutatingWebhookConfiguration"
    ]
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Fail"
        hook["clientConfig"] = {"url": f"{url}/mutate"}
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return config


def url_validating_config(url: str) -> dict[str, Any]:
    """The shipped ClusterQueue validation, pointed at `url` (cluster-scoped objects: it sees
    every ClusterQueue created while it is registered)."""
    (config,) = [
        d
        for d in load_manifests(BASE / "dispatcher" / "webhook.yaml")
        if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        hook["clientConfig"] = {"url": f"{url}{hook['clientConfig']['service']['path']}"}
    return config


def running_job(name: str, ns: str, queue: str, gpus: int, **annotations: str) -> dict[str, Any]:
    """A queue-labelled Job as a Kueue user writes it: no `suspend`."""
    job = gpu_job(name, ns, queue, gpus)
    del job["spec"]["suspend"]
    job["metadata"]["annotations"].update(annotations)
    return job


async def held_on_dry_run(kube: KubeClient, ns: str) -> bool:
    """Whether the API server calls the webhook yet (it loads configurations asynchronously):
    a dry-run create, which calls webhooks without side effects and stores nothing."""
    probe = running_job("probe", ns, "jobs", 1)
    try:
        made = await kube.request("POST", JOBS.path(ns), body=probe, params={"dryRun": "All"})
    except (ApiError, Unavailable):
        return False  # registered, its CA not yet loaded
    return made["spec"].get("suspend") is True


@contextlib.asynccontextmanager
async def webhooked_dispatcher(
    cp: ControlPlane, kube: KubeClient, ns: str, workdir: Path, client: KubeClient
) -> AsyncIterator[RunningDispatcher]:
    """The dispatcher on `ns`'s pool with `client`'s identity, serving its webhook with a
    certificate for 127.0.0.1; the shipped webhook configuration registered by URL for `ns`,
    answering before this yields; both gone on exit."""
    made = issue(["127.0.0.1"])
    write_folder(workdir / "tls", made.secret_data())
    settings = dispatcher_settings(cp, ns, webhook_cert_dir=str(workdir / "tls"), webhook_port=0)
    running = await start_dispatcher(settings, kube=client)
    try:
        assert running.webhook is not None
        config = url_webhook_config(running.webhook.url, ns)
        for hook in config["webhooks"]:
            hook["clientConfig"]["caBundle"] = base64.b64encode(made.ca_pem).decode()
        with contextlib.suppress(NotFound):
            await kube.delete(MUTATING_WEBHOOKS, WEBHOOK_CONFIG)
        await kube.create(MUTATING_WEBHOOKS, config)
        await wait_for(lambda: held_on_dry_run(kube, ns), 30, 0.2)
        yield running
    finally:
        await running.stop()
        with contextlib.suppress(NotFound):
            await kube.delete(MUTATING_WEBHOOKS, WEBHOOK_CONFIG)


@contextlib.asynccontextmanager
async def queued_pool(
    cp: ControlPlane,
    kube: KubeClient,
    ns: str,
    workdir: Path,
    *,
    cohort: str,
    queues: dict[str, tuple[int, int | None]],
    peers: Sequence[contextlib.AbstractAsyncContextManager[Any]] = (),
    gpus: str = "1x V100M32:4",
) -> AsyncIterator[RunningDispatcher]:
    """What the kinds' tests stand on: a pool of `gpus` for `ns`, `queues` in `cohort` (see
    `cohort_queues`), Alnair's scheduler, the other projects' controllers in `peers`, and the
    dispatcher under its shipped account behind its webhook (see `webhooked_dispatcher`),
    which this yields. Everything stops on exit, and the ClusterQueues are deleted."""
    # The query API's RBAC too (the webhook's port serves it, and reads the front-proxy
    # ConfigMap in kube-system); not its APIService, which would name a Service not here.
    account = await shipped_account(
        cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml", "dispatcher/query-api.yaml",
        skip={"APIService"},
    )  # fmt: skip
    await cp.create_gpu_nodes(gpus, kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, cohort, queues)
    try:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(KubeClient(account))
            await stack.enter_async_context(scheduler(kube))
            for peer in peers:
                await stack.enter_async_context(peer)
            yield await stack.enter_async_context(
                webhooked_dispatcher(cp, kube, ns, workdir, client)
            )
    finally:
        for name in queues:
            with contextlib.suppress(NotFound):
                await kube.delete(CLUSTERQUEUES, f"{name}-{ns}")


async def queue_used(kube: KubeClient, cq: str) -> int:
    """The GPUs a ClusterQueue's status says are in use."""
    return int(((await kube.get(CLUSTERQUEUES, cq)).get("status") or {}).get("usedGPUs") or 0)


async def events(kube: KubeClient, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events of `reason` about the object `name` in `ns`."""
    items = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={name}"))["items"]
    return [e for e in items if e["reason"] == reason]


def jobset(name: str, ns: str, queue: str, workers: int, seconds: float) -> dict[str, Any]:
    """`workers` one-GPU workers and a driver that asks for no GPU, as a user writes it."""

    def replicated(rj: str, replicas: int, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": rj, "image": "example.invalid/train:1"}
        if gpus:
            container["resources"] = {"limits": {r.GPU: str(gpus)}}
        return {
            "name": rj,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": 1,
                    "completions": 1,
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"annotations": {r.ANN_DURATION: f"{seconds}s"}},
                        "spec": {
                            "schedulerName": r.SCHEDULER_NAME,
                            "restartPolicy": "Never",
                            "nodeSelector": {POOL: ns},
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [container],
                        },
                    },
                }
            },
        }

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {"replicatedJobs": [replicated("workers", workers, 1), replicated("driver", 1, 0)]},
    }


def flattened(kubeconfig: Path) -> str:
    """The kubeconfig as an operator puts it into a worker Secret: self-contained, with the
    real kubectl (`kubectl config view --flatten --minify`)."""
    kubectl = Path(sys.executable).parent / "kubectl"
    return subprocess.run(
        [str(kubectl), "config", "view", "--flatten", "--minify", f"--kubeconfig={kubeconfig}"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def worker_secret(name: str, ns: str, kubeconfig: str, mbps: float | None) -> dict[str, Any]:
    """A worker cluster as an operator registers it with the hub: a kubeconfig Secret."""
    annotations = {ANN_CLUSTER_NAME: name, ANN_REGION: f"region-{name}"}
    if mbps is not None:
        annotations[ANN_BANDWIDTH] = str(mbps)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"worker-{name}",
            "namespace": ns,
            "labels": {LABEL_WORKER: "true"},
            "annotations": annotations,
        },
        "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
    }
