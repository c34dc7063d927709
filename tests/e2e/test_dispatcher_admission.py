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

from alnair.common.certs_cli import ensure
from alnair.common.kube import (
    CLUSTERQUEUES,
    ELASTICJOBS,
    JOBS,
    LOCALQUEUES,
    MUTATING_WEBHOOKS,
    PODS,
    SECRETS,
    ApiError,
    KubeClient,
    NotFound,
    Unavailable,
)
from alnair.common.localstack import ControlPlane
from alnair.common.localstack.controlplane import load_manifests
from alnair.common.tls import write_folder
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.objects import ANN_ADMITTED_TYPE, ANN_RAN, LABEL_QUEUE
from dispatcher_support import (
    POOL,
    admitted_type,
    cluster_queue,
    dispatcher_settings,
    explain,
    gpu_job,
    local_queue,
    wait_for,
)
from elastic_support import elastic_job, start_controller, workers
from kube_builders import BASE, SYSTEM_NS, shipped_account

pytestmark = pytest.mark.e2e

WEBHOOK_CONFIG = "alnair-dispatcher"
WEBHOOK_SECRET = "alnair-dispatcher-webhook-tls"
HOOKS = {"jobs.hold.alnair.io", "elasticjobs.hold.alnair.io"}


def url_webhook_config(url: str, namespace: str) -> dict[str, Any]:
    """The shipped configuration, pointed at `url` and limited to the test's namespace (so no
    other test's Jobs depend on this dispatcher)."""
    (config,) = [
        d
        for d in load_manifests(BASE / "dispatcher" / "webhook.yaml")
        if d["kind"] == "MutatingWebhookConfiguration"
    ]
    assert {h["name"] for h in config["webhooks"]} == HOOKS
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Fail"
        hook["clientConfig"] = {"url": f"{url}/mutate"}
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
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
    except ApiError:
        return False  # registered, its CA not yet loaded
    return made["spec"].get("suspend") is True


async def forbidden(request: Any) -> None:
    with pytest.raises(ApiError) as refused:
        await request
    assert refused.value.status == 403, refused.value


async def test_held_at_creation_admitted_under_its_own_account_and_refused_when_down(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    cp = control_plane
    skip = {"MutatingWebhookConfiguration", "Job"}
    dispatcher_cfg = await shipped_account(cp, kube, "alnair-dispatcher", "dispatcher/rbac.yaml")
    elastic_cfg = await shipped_account(cp, kube, "alnair-elastic", "elastic/rbac.yaml")
    certs_cfg = await shipped_account(
        cp, kube, "alnair-dispatcher-certs", "dispatcher/webhook.yaml", skip=skip
    )
    await cp.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"jobs-{ns}", None, {"V100M32": 2}))
    await kube.create(CLUSTERQUEUES, cluster_queue(f"ela-{ns}", None, {"V100M32": 2}))
    await kube.create(LOCALQUEUES, local_queue("jobs", ns, f"jobs-{ns}"), ns)
    await kube.create(LOCALQUEUES, local_queue("elastic", ns, f"ela-{ns}"), ns)

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
            await kube.create(MUTATING_WEBHOOKS, url_webhook_config(running.webhook.url, ns))
            # Run again: the certificate is kept, the CA goes into both webhooks.
            again = await ensure(
                as_certs, namespace=SYSTEM_NS, secret=WEBHOOK_SECRET, hosts=hosts,
                webhooks=[WEBHOOK_CONFIG],
            )  # fmt: skip
            assert issued.issued and not again.issued and again.webhooks_patched == 2
            assert again.ca_pem == files["ca.crt"]
            await wait_for(lambda: held_on_dry_run(kube, ns), 30, 0.2)

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
            assert not {ANN_ADMITTED_TYPE, ANN_RAN} & set(forged["metadata"].get("annotations") or {})

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
            await forbidden(as_dispatcher.list(PODS))
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
            await kube.delete(SECRETS, WEBHOOK_SECRET, SYSTEM_NS)
            for cq in (f"jobs-{ns}", f"ela-{ns}"):
                await kube.delete(CLUSTERQUEUES, cq)
