"""Workloads are held for their queue at creation, and the dispatcher and the elastic controller
work under their own ServiceAccounts as shipped.

Everything here comes from `deploy/kustomize/base` as it ships: the RBAC of the dispatcher, of
the elastic controller and of the certificate Job, and the MutatingWebhookConfiguration (its
rules, selectors and failurePolicy), registered by URL because the local control plane routes
no Services. `alnair certs`, under the certificate Job's own account, issues the serving
certificate into its Secret and puts the CA into the configuration; the Secret's files are
written to the folder the dispatcher serves from, as the kubelet would mount them.
"""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.certs_cli import ensure
from alnair.common.kube import (
    CLUSTERQUEUES,
    DEPLOYMENTS,
    ELASTICJOBS,
    EVENTS,
    JOBS,
    LOCALQUEUES,
    MUTATING_WEBHOOKS,
    PODS,
    SECRETS,
    STATEFULSETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeClient,
    NotFound,
    Resource,
    Unavailable,
)
from alnair.common.kubeconfig import KubeConfig
from alnair.common.tls import write_folder
from alnair.dev.builders import SYSTEM_NS, make_pod, shipped_account
from alnair.dev.elastic import elastic_job, start_controller, workers
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.parsing import (
    ADMISSION_GATE,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    ANN_RAN,
    LABEL_QUEUE,
)
from dispatcher_support import (
    POOL,
    WEBHOOK_CONFIG,
    admitted_type,
    cluster_queue,
    cohort_queues,
    dispatcher_settings,
    explain,
    gpu_job,
    held_on_dry_run,
    local_queue,
    queue_used,
    running_job,
    scheduler,
    url_validating_config,
    url_webhook_config,
    webhooked_dispatcher,
)

pytestmark = pytest.mark.e2e

WEBHOOK_SECRET = "alnair-dispatcher-webhook-tls"
HOOKS = {
    "jobs.hold.alnair.io",
    "jobsets.hold.alnair.io",
    "ray.hold.alnair.io",
    "trainjobs.hold.alnair.io",
    "kubeflow.hold.alnair.io",
    "elasticjobs.hold.alnair.io",
    "pods.hold.alnair.io",
    "serving.hold.alnair.io",
}


async def forbidden(request: Any) -> None:
    with pytest.raises(ApiError) as refused:
        await request
    assert refused.value.status == 403, refused.value


async def dispatcher_account(cp: ControlPlane, kube: KubeClient) -> KubeConfig:
    """The dispatcher's token with what its deploy grants: its RBAC and, since it serves the
    aggregated query API on the webhook's port, the front-proxy CA's reader role in
    kube-system (`query-api.yaml`; its APIService is not registered here)."""
    return await shipped_account(
        cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml", "dispatcher/query-api.yaml",
        skip={"APIService"},
    )  # fmt: skip


async def test_held_at_creation_admitted_under_its_own_account_and_refused_when_down(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    skip = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Job"}
    dispatcher_cfg = await dispatcher_account(cp, kube)
    elastic_cfg = await shipped_account(
        cp, kube, "alnair-elastic", "elastic/rbac.yaml", "elastic/owned-policy.yaml"
    )
    certs_cfg = await shipped_account(
        cp, kube, "alnair-dispatcher-certs", "dispatcher/webhook.yaml", skip=skip
    )
    await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"jobs-{ns}", None, {"V100M32": 2}))
    await kube.create(CLUSTERQUEUES, cluster_queue(f"ela-{ns}", None, {"V100M32": 2}))
    await kube.create(LOCALQUEUES, local_queue("jobs", ns, f"jobs-{ns}"), ns)
    await kube.create(LOCALQUEUES, local_queue("elastic", ns, f"ela-{ns}"), ns)
    await kube.create(CLUSTERQUEUES, cluster_queue(f"kq-{ns}", None, {"V100M32": 1}))
    await kube.create(LOCALQUEUES, local_queue("kq", ns, f"kq-{ns}"), ns)

    async with (
        KubeClient(dispatcher_cfg) as as_dispatcher,
        KubeClient(elastic_cfg) as as_elastic,
        KubeClient(certs_cfg) as as_certs,
    ):
        # The certificate Job's work, with its account: a new Secret the first time.
        hosts = ["127.0.0.1"]
        issued = await ensure(as_certs, namespace=SYSTEM_NS, secret=WEBHOOK_SECRET, hosts=hosts)
        secret = await kube.get(SECRETS, WEBHOOK_SECRET, SYSTEM_NS)
        files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
        write_folder(tmp_path / "tls", files)
        # Its account reaches that one Secret and its own webhook configuration, nothing else.
        await forbidden(as_certs.list(SECRETS, SYSTEM_NS))
        await forbidden(as_certs.get(SECRETS, "alnair-nats-users", SYSTEM_NS))
        await forbidden(as_certs.list(MUTATING_WEBHOOKS))

        settings = dispatcher_settings(
            cp, ns, webhook_cert_dir=str(tmp_path / "tls"), webhook_port=0
        )
        running = await start_dispatcher(settings, kube=as_dispatcher)
        elastic = await start_controller(cp, ns, kube=as_elastic)
        try:
            assert running.webhook is not None
            with contextlib.suppress(NotFound):
                await kube.delete(MUTATING_WEBHOOKS, WEBHOOK_CONFIG)
            config = url_webhook_config(running.webhook.url, ns)
            assert {h["name"] for h in config["webhooks"]} == HOOKS
            await kube.create(MUTATING_WEBHOOKS, config)
            with contextlib.suppress(NotFound):
                await kube.delete(VALIDATING_WEBHOOKS, WEBHOOK_CONFIG)
            await kube.create(VALIDATING_WEBHOOKS, url_validating_config(running.webhook.url))
            # Run again: the certificate is kept, the CA goes into every webhook.
            again = await ensure(
                as_certs, namespace=SYSTEM_NS, secret=WEBHOOK_SECRET, hosts=hosts,
                webhooks=[WEBHOOK_CONFIG],
            )  # fmt: skip
            assert issued.issued and not again.issued and again.webhooks_patched == len(HOOKS) + 1
            assert again.ca_pem == files["ca.crt"]
            await wait_for(lambda: held_on_dry_run(kube, ns), 30, 0.2)

            # What the CRD schema cannot check about a queue is refused, with the reason.
            async def refused_queue(body: dict[str, Any]) -> str | None:
                try:
                    await kube.create(CLUSTERQUEUES, body)
                except ApiError as exc:
                    return str(exc)
                await kube.delete(CLUSTERQUEUES, body["metadata"]["name"])
                return None  # created: the validation is not loaded yet

            typo = await wait_for(
                lambda: refused_queue(cluster_queue(f"typo-{ns}", None, {"V100M23": 2})), 30, 0.2
            )
            assert "V100M23" in typo and "no node has" in typo
            orphan = await refused_queue(cluster_queue(f"orphan-{ns}", f"nope-{ns}", {"T4": 1}))
            assert orphan is not None and f"no Cohort named 'nope-{ns}'" in orphan

            # Created running, asking more than its queue's quota: held, and never runs.
            big = await kube.create(JOBS, running_job("big", ns, "jobs", 3), ns)
            assert big["spec"]["suspend"] is True
            # One that fits is admitted by the dispatcher, under its own account.
            fits = await kube.create(JOBS, running_job("fits", ns, "jobs", 2), ns)
            assert fits["spec"]["suspend"] is True
            assert await wait_for(lambda: admitted_type(kube, ns, "fits"), 20) == "V100M32"
            waiting = await wait_for(
                lambda: explain(running, ns, "big", lambda d: d["reason"] is not None), 10
            )
            assert (waiting["status"], waiting["reason"]["kind"]) == ("waiting", "quota")
            assert (await kube.get(JOBS, "big", ns))["spec"]["suspend"] is True
            pods = await kube.list(PODS, ns, label_selector="job-name=big")
            assert pods["items"] == []

            # What only the dispatcher writes cannot be written at creation.
            forged = await kube.create(
                JOBS,
                running_job("forged", ns, "jobs", 1, **{ANN_ADMITTED_TYPE: "V100M32",
                                                        ANN_RAN: "999999"}),
                ns,
            )  # fmt: skip
            assert forged["spec"]["suspend"] is True
            assert not {ANN_ADMITTED_TYPE, ANN_RAN} & set(
                forged["metadata"].get("annotations") or {}
            )

            # Written for Kueue (its label, no suspend): held and admitted the same way.
            kueue_job = running_job("kueue-style", ns, "kq", 1)
            del kueue_job["metadata"]["labels"][LABEL_QUEUE]
            kueue_job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "kq"
            assert (await kube.create(JOBS, kueue_job, ns))["spec"]["suspend"] is True
            assert await wait_for(lambda: admitted_type(kube, ns, "kueue-style"), 20) == "V100M32"
            explained = await explain(running, ns, "kueue-style", lambda d: True)
            assert explained["queue"] == "kq" and explained["cluster_queue"] == f"kq-{ns}"

            # An ElasticJob naming its queue in its spec, created running: held, admitted at
            # its minimum by the dispatcher; the elastic controller, under its own account,
            # then runs it.
            ej = elastic_job("ej", ns, lo=1, hi=2, pool=ns, queue="elastic")
            made = await kube.create(ELASTICJOBS, ej, ns)
            assert made["spec"]["suspend"] is True

            async def elastic_admitted() -> bool:
                obj = await kube.get(ELASTICJOBS, "ej", ns)
                annotations = obj["metadata"].get("annotations") or {}
                return not obj["spec"]["suspend"] and ANN_ADMITTED_TYPE in annotations

            await wait_for(elastic_admitted, 20)

            # Its worker pods: the StatefulSet the controller made, run by the real
            # StatefulSet controller.
            await wait_for(lambda: workers(kube, ns, "ej"), 20)

            # Beside their job, both accounts are refused.
            await forbidden(as_dispatcher.create(PODS, {"metadata": {"name": "x"}}, ns))
            await forbidden(as_dispatcher.create(JOBS, gpu_job("x", ns, "jobs", 1), ns))
            await forbidden(as_dispatcher.list(SECRETS, SYSTEM_NS))
            await forbidden(as_elastic.delete(PODS, "x", ns))
            await forbidden(as_elastic.list(JOBS))
        finally:
            await elastic.stop()
            await running.stop()

        try:
            # The webhook is down: failurePolicy Fail refuses what it would have held, and only
            # that (a Job without the queue label never reaches it).
            # (The API server answers 500; the client reads a 5xx as "try again later".)
            with pytest.raises(Unavailable) as refused:
                await kube.create(JOBS, running_job("late", ns, "jobs", 1), ns)
            assert 'failed calling webhook "jobs.hold.alnair.io"' in str(refused.value)
            with pytest.raises(NotFound):
                await kube.get(JOBS, "late", ns)
            plain = running_job("plain", ns, "jobs", 1)
            del plain["metadata"]["labels"][LABEL_QUEUE]
            stored = await kube.create(JOBS, plain, ns)
            assert stored["spec"].get("suspend") is not True
        finally:
            await kube.delete(MUTATING_WEBHOOKS, WEBHOOK_CONFIG)
            await kube.delete(VALIDATING_WEBHOOKS, WEBHOOK_CONFIG)
            await kube.delete(SECRETS, WEBHOOK_SECRET, SYSTEM_NS)
            for cq in (f"jobs-{ns}", f"ela-{ns}", f"kq-{ns}"):
                await kube.delete(CLUSTERQUEUES, cq)


async def _pod(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    with contextlib.suppress(NotFound):
        return await kube.get(PODS, name, ns)
    return None


def _gated(pod: dict[str, Any] | None) -> bool:
    return bool(pod) and ADMISSION_GATE in {
        g["name"] for g in (pod or {})["spec"].get("schedulingGates") or []
    }


async def test_pods_of_their_own_queue_admit_complete_and_are_evicted_for_the_lender(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """Plain Pods through a queue: gated at creation, admitted within quota with the GPU model
    in their node selector, bound by the scheduler, counted until they finish; one that
    borrowed is evicted when the lender needs its quota back (a gate cannot be put back)."""
    ns = namespace
    cp = control_plane
    dispatcher_cfg = await dispatcher_account(cp, kube)
    await cp.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "pc", {"pods": (2, 2), "lender": (2, 0)})

    def pod(name: str, gpus: int, seconds: float) -> dict[str, Any]:
        return make_pod(name, ns).pool(ns).gpus(gpus).runs_for(seconds).queue("pods").obj()

    async with (
        KubeClient(dispatcher_cfg) as as_dispatcher,
        scheduler(kube),
        webhooked_dispatcher(cp, kube, ns, tmp_path, as_dispatcher) as running,
    ):
        try:
            # Within the queue's own quota, then on quota borrowed from the idle lender.
            first = await kube.create(PODS, pod("p1", 2, 4), ns)
            assert _gated(first)
            await kube.create(PODS, pod("p2", 2, 600), ns)
            for name in ("p1", "p2"):
                admitted = await wait_for(
                    lambda n=name: _admitted_pod(kube, ns, n),
                    20,  # type: ignore[misc]
                )
                assert admitted["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32"
            p2 = await kube.get(PODS, "p2", ns)
            assert p2["metadata"]["annotations"][ANN_BORROWING] == "true"
            # Full: the third waits, gated, for quota.
            assert _gated(await kube.create(PODS, pod("p3", 2, 600), ns))
            waiting = await wait_for(
                lambda: explain(running, ns, "p3", lambda d: d["reason"] is not None, kind="pods"),
                10,
            )
            assert (waiting["kind"], waiting["status"]) == ("Pod", "waiting")
            assert waiting["reason"]["kind"] in ("quota", "capacity", "reservation")
            if (await kube.get(PODS, "p1", ns))["status"].get("phase") == "Running":
                assert _gated(await kube.get(PODS, "p3", ns))
            # p1 finishes: its quota is p3's; the admission follows p1's completion.
            await wait_for(lambda: _phase(kube, ns, "p1", "Succeeded"), 30)
            await wait_for(lambda: _admitted_pod(kube, ns, "p3"), 20)

            # The lender needs its quota: the borrowed pod cannot be gated again, so it is
            # evicted, and the lender's Job admitted.
            await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 30) == "V100M32"

            # p2 and p3 both run on borrowed quota now (p1's finish left p2's flag as it was):
            # the policy evicts one of them, and only one.
            async def one_evicted() -> str | None:
                gone = [n for n in ("p2", "p3") if await _gone(kube, ns, n)]
                return gone[0] if len(gone) == 1 else None

            victim = await wait_for(one_evicted, 20)
            evicted = await wait_for(lambda: _events(kube, ns, victim, "Preempted"), 10)
            assert "evicted for" in evicted[0]["message"] and "l1" in evicted[0]["message"]
            assert (await one_evicted()) == victim
        finally:
            for cq in (f"pods-{ns}", f"lender-{ns}"):
                await kube.delete(CLUSTERQUEUES, cq)


async def _admitted_pod(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    pod = await _pod(kube, ns, name)
    if pod is None or _gated(pod):
        return None
    return pod if ANN_ADMITTED_TYPE in (pod["metadata"].get("annotations") or {}) else None


async def _phase(kube: KubeClient, ns: str, name: str, phase: str) -> bool:
    pod = await _pod(kube, ns, name)
    return bool(pod) and (pod or {}).get("status", {}).get("phase") == phase


async def _gone(kube: KubeClient, ns: str, name: str) -> bool:
    return await _pod(kube, ns, name) is None


async def _events(kube: KubeClient, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    items = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={name}"))["items"]
    return [e for e in items if e["reason"] == reason]


def deployment(name: str, ns: str, queue: str, replicas: int) -> dict[str, Any]:
    """A serving Deployment as a user writes it: a queue label, nothing held."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": r.SCHEDULER_NAME,
                    "nodeSelector": {POOL: ns},
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "serve", "image": "example.invalid/serve:1",
                                    "resources": {"limits": {r.GPU: "1"}}}],
                },
            },
        },
    }  # fmt: skip


async def _serving(kube: KubeClient, ns: str, app: str) -> list[dict[str, Any]]:
    pods = (await kube.list(PODS, ns, label_selector=f"app={app}"))["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def _all_running(kube: KubeClient, ns: str, app: str, n: int) -> list[dict[str, Any]]:
    pods = await _serving(kube, ns, app)
    ok = [p for p in pods if p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")]
    return ok if len(ok) == n and len(pods) == n else []


async def _admitted_serving(
    kube: KubeClient, resource: Resource, doc: dict[str, Any]
) -> list[dict[str, Any]]:
    """Create a serving workload; its template is labelled at creation, and every one of its
    `replicas` pods comes to run ungated, with the model in its node selector."""
    meta = doc["metadata"]
    made = await kube.create(resource, doc, meta["namespace"])
    label = made["spec"]["template"]["metadata"]["labels"]["alnair.io/workload"]
    assert label == f"{doc['kind'].lower()}.{meta['name']}"
    pods = await wait_for(
        lambda: _all_running(kube, meta["namespace"], meta["name"], doc["spec"]["replicas"]), 40
    )
    for pod in pods:
        assert pod["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32"
    return list(pods)


async def test_serving_deployments_are_admitted_whole_and_evicted_whole(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """A Deployment labelled for a queue: its pods are gated as the ReplicaSet makes them,
    all ungated together when the dispatcher admits it (the model in each node selector),
    counted while it runs, its quota back when it is deleted; one on borrowed quota is
    evicted whole for the lender, and its recreated pods wait gated again."""
    ns = namespace
    cp = control_plane
    dispatcher_cfg = await dispatcher_account(cp, kube)
    await cp.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "sc", {"serve": (2, 2), "lender": (2, 0)})
    async with (
        KubeClient(dispatcher_cfg) as as_dispatcher,
        scheduler(kube),
        webhooked_dispatcher(cp, kube, ns, tmp_path, as_dispatcher) as running,
    ):
        try:
            pods = await _admitted_serving(kube, DEPLOYMENTS, deployment("web", ns, "serve", 2))
            for pod in pods:
                assert pod["metadata"]["annotations"][ANN_ADMITTED_TYPE] == "V100M32"
            admitted = await wait_for(lambda: _events(kube, ns, "web", "Admitted"), 10)
            assert "2 x V100M32" in admitted[0]["message"]
            # The whole of it counts; the next one borrows the idle lender's quota.
            await kube.create(DEPLOYMENTS, deployment("api", ns, "serve", 2), ns)
            await wait_for(lambda: _all_running(kube, ns, "api", 2), 30)
            # A third waits, its pods gated, for quota.
            await kube.create(DEPLOYMENTS, deployment("more", ns, "serve", 1), ns)
            waiting = await wait_for(
                lambda: explain(running, ns, "more", lambda d: d["reason"] is not None,
                                kind="deployments"), 20,
            )  # fmt: skip
            assert waiting["status"] == "waiting"
            gated_pods = await wait_for(lambda: _serving(kube, ns, "more"), 20)
            assert all(p["spec"].get("schedulingGates") for p in gated_pods)
            # Deleting web gives its quota back: more is admitted.
            await kube.delete(DEPLOYMENTS, "web", ns, propagation="Foreground")
            await wait_for(lambda: _all_running(kube, ns, "more", 1), 40)

            # The lender needs its quota: a borrowing Deployment is evicted whole.
            await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 40) == "V100M32"
            evicted = await wait_for(lambda: _evicted_one(kube, ns, "api", "more"), 20)
            reasons = await _events(kube, ns, evicted, "Preempted")
            assert "evicted whole" in reasons[0]["message"]
        finally:
            for cq in (f"serve-{ns}", f"lender-{ns}"):
                await kube.delete(CLUSTERQUEUES, cq)


def statefulset(name: str, ns: str, queue: str, replicas: int) -> dict[str, Any]:
    """A serving StatefulSet as a user writes it (its pods made one by one, each only once
    the one before is ready: the default `OrderedReady`)."""
    doc = deployment(name, ns, queue, replicas)
    doc["kind"] = "StatefulSet"
    doc["spec"]["serviceName"] = name
    return doc


async def test_a_serving_statefulset_is_admitted_pod_by_pod(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """A StatefulSet labelled for a queue: its controller makes one pod at a time and the next
    only once the last is ready, so the admission reaches each as it comes (the model in its
    node selector) up to its replicas, and all of it counts, on borrowed quota here. The
    lender then wants its quota back while GPUs are still free: the StatefulSet is evicted
    whole for it and its pods come back gated."""
    ns = namespace
    cp = control_plane
    dispatcher_cfg = await dispatcher_account(cp, kube)
    await cp.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "ss", {"serve": (0, 2), "lender": (2, 0)})
    async with (
        KubeClient(dispatcher_cfg) as as_dispatcher,
        scheduler(kube),
        webhooked_dispatcher(cp, kube, ns, tmp_path, as_dispatcher),
    ):
        try:
            pods = await _admitted_serving(kube, STATEFULSETS, statefulset("db", ns, "serve", 2))
            for pod in pods:
                assert pod["metadata"]["annotations"][ANN_BORROWING] == "true"
            assert await wait_for(lambda: queue_used(kube, f"serve-{ns}"), 10) == 2

            # Two of the node's four GPUs are free, but the quota is the lender's.
            await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
            assert await wait_for(lambda: _evicted_one(kube, ns, "db"), 30) == "db"
            reasons = await _events(kube, ns, "db", "Preempted")
            assert "evicted whole" in reasons[0]["message"]
            assert await wait_for(lambda: admitted_type(kube, ns, "l1"), 30) == "V100M32"
        finally:
            for cq in (f"serve-{ns}", f"lender-{ns}"):
                await kube.delete(CLUSTERQUEUES, cq)


async def _evicted_one(kube: KubeClient, ns: str, *apps: str) -> str | None:
    """The serving workload among `apps` that was evicted: its pods are back, gated."""
    for app in apps:
        pods = await _serving(kube, ns, app)
        regated = pods and all(p["spec"].get("schedulingGates") for p in pods)
        if regated and await _events(kube, ns, app, "Preempted"):
            return app
    return None
