"""The hub's reading of worker Secrets and hub Jobs, and the mirror it creates on a worker."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.scheduler.dispatcher.hub import (
    ANN_DATA_SIZE_MB,
    ANN_DATASET,
    ANN_IMAGE_SIZE,
    ANN_PLACED_CLUSTER,
    MANAGED_BY,
    job_artifacts,
    mirror_of,
)
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE
from alnair.scheduler.dispatcher.worker_clusters import (
    ANN_BANDWIDTH,
    ANN_CLUSTER_NAME,
    ANN_ORIGIN,
    LABEL_ORIGIN,
    parse_worker_secret,
)

KUBECONFIG = yaml.safe_dump(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "w", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "w", "user": "u"}}],
        "current-context": "c",
    }
)


def worker_secret(annotations: dict[str, str], data: str | None = KUBECONFIG) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "metadata": {"name": "worker-east", "annotations": annotations, "resourceVersion": "7"},
        "data": {},
    }
    if data is not None:
        doc["data"]["kubeconfig"] = base64.b64encode(data.encode()).decode()
    return doc


def test_worker_secret_fields() -> None:
    config = parse_worker_secret(worker_secret({ANN_BANDWIDTH: "2500", ANN_CLUSTER_NAME: "east"}))
    assert (config.name, config.secret, config.bandwidth_mbps) == ("east", "worker-east", 2500.0)
    assert "127.0.0.1:6443" in config.kubeconfig
    # The Secret's name when no cluster name is annotated.
    assert parse_worker_secret(worker_secret({ANN_BANDWIDTH: "1"})).name == "worker-east"


@pytest.mark.parametrize(
    ("annotations", "data", "field"),
    [
        ({}, KUBECONFIG, ANN_BANDWIDTH),
        ({ANN_BANDWIDTH: "fast"}, KUBECONFIG, ANN_BANDWIDTH),
        ({ANN_BANDWIDTH: "-5"}, KUBECONFIG, ANN_BANDWIDTH),
        ({ANN_BANDWIDTH: "inf"}, KUBECONFIG, ANN_BANDWIDTH),
        ({ANN_BANDWIDTH: "10"}, None, "data.kubeconfig"),
        ({ANN_BANDWIDTH: "10"}, "just: text", "data.kubeconfig"),
        ({ANN_BANDWIDTH: "10", ANN_CLUSTER_NAME: "a/b"}, KUBECONFIG, ANN_CLUSTER_NAME),
    ],
)
def test_a_bad_worker_secret_names_the_field(
    annotations: dict[str, str], data: str | None, field: str
) -> None:
    with pytest.raises(InvalidValueError) as caught:
        parse_worker_secret(worker_secret(annotations, data))
    assert field in str(caught.value)


def _kubeconfig(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> str:
    doc = yaml.safe_load(KUBECONFIG)
    doc["users"][0]["user"] = user
    doc["clusters"][0]["cluster"].update(cluster or {})
    return str(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    ("user", "cluster", "field"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh"}}, None,
         "users[0].user.exec"),
        ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, None,
         "users[0].user.tokenFile"),
        ({"auth-provider": {"name": "oidc"}}, None, "users[0].user.auth-provider"),
        ({"client-certificate": "/etc/x.crt", "client-key": "/etc/x.key"}, None,
         "users[0].user.client-certificate"),
        ({"username": "u", "password": "p"}, None, "users[0].user.username"),
        ({"token": "t"}, {"insecure-skip-tls-verify": True},
         "clusters[0].cluster.insecure-skip-tls-verify"),
        ({"token": "t"}, {"certificate-authority": "/etc/ca.crt"},
         "clusters[0].cluster.certificate-authority"),
        ({"token": "t"}, {"proxy-url": "http://mitm:3128"}, "clusters[0].cluster.proxy-url"),
    ],
)  # fmt: skip
def test_a_worker_kubeconfig_that_could_run_or_read_anything_is_refused_naming_it(
    user: dict[str, Any], cluster: dict[str, Any] | None, field: str
) -> None:
    secret = worker_secret({ANN_BANDWIDTH: "10"}, _kubeconfig(user, cluster))
    with pytest.raises(InvalidValueError) as caught:
        parse_worker_secret(secret)
    assert f"data.kubeconfig {field}" in str(caught.value)
    assert "not accepted" in str(caught.value)


def test_a_self_contained_worker_kubeconfig_is_accepted() -> None:
    inline = _kubeconfig(
        {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"},
        {"certificate-authority-data": "Y2E=", "insecure-skip-tls-verify": False},
    )
    assert parse_worker_secret(worker_secret({ANN_BANDWIDTH: "10"}, inline)).name == "worker-east"


def hub_job(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "u-1",
            "labels": {LABEL_QUEUE: "q", "team": "a"},
            "annotations": annotations,
        },
        "spec": {
            "managedBy": MANAGED_BY,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}},
            "template": {
                "metadata": {
                    "labels": {"batch.kubernetes.io/controller-uid": "u-1", "app": "x"},
                },
                "spec": {
                    "containers": [
                        {"name": "a", "image": "repo/train:1"},
                        {"name": "b", "image": "repo/side:1"},
                    ]
                },
            },
        },
    }


def test_artifacts_from_annotations() -> None:
    job = hub_job({ANN_IMAGE_SIZE: "6000", ANN_DATASET: "imagenet", ANN_DATA_SIZE_MB: "146000"})
    names = {a.name: a.size_mb for a in job_artifacts(job)}
    assert names == {
        "image:repo/side:1": 3000.0,
        "image:repo/train:1": 3000.0,
        "data:imagenet": 146000.0,
    }
    # A size without a name: a dataset only this job uses (never found cached elsewhere).
    anonymous = job_artifacts(hub_job({ANN_DATA_SIZE_MB: "10"}))
    assert "data:u-1" in {a.name for a in anonymous}
    with pytest.raises(InvalidValueError, match=ANN_DATA_SIZE_MB):
        job_artifacts(hub_job({ANN_DATA_SIZE_MB: "lots"}))
    with pytest.raises(InvalidValueError, match=ANN_IMAGE_SIZE):
        job_artifacts(hub_job({ANN_IMAGE_SIZE: "-1"}))


def test_the_mirror_runs_on_the_chosen_model_and_names_its_origin() -> None:
    job = hub_job({"model_name": "resnet50", ANN_PLACED_CLUSTER: "east", "x.io/other": "y"})
    mirror = mirror_of(job, "V100M32", "hub")
    meta, spec = mirror["metadata"], mirror["spec"]
    assert meta["labels"] == {"team": "a", LABEL_ORIGIN: "u-1"}
    assert meta["annotations"] == {"model_name": "resnet50", ANN_ORIGIN: "hub/ml/train"}
    assert "managedBy" not in spec and "selector" not in spec
    assert spec["suspend"] is False
    assert spec["template"]["metadata"]["labels"] == {"app": "x"}
    assert spec["template"]["spec"]["nodeSelector"] == {r.LABEL_GPU_MODEL: "V100M32"}
    assert job["spec"]["managedBy"] == MANAGED_BY  # the hub Job is not changed


def test_a_jobset_mirror_runs_every_replicated_job_on_the_chosen_model() -> None:
    """Any kind the hub places is copied by its adapter: `managedBy` gone, released (not
    suspended) with the model in every replicated Job's pod template; no queue label."""
    from alnair.scheduler.dispatcher.hub import delegated
    from alnair.scheduler.dispatcher.kinds import JOBSET

    def replicated(name: str, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": name, "image": f"repo/{name}:1"}
        if gpus:
            container["resources"] = {"limits": {r.GPU: str(gpus)}}
        return {"name": name, "replicas": 2, "template": {"spec": {"template": {"spec": {
            "containers": [container], "nodeSelector": {"pool": "a"}}}}}}  # fmt: skip

    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "ml", "uid": "u-2",
                     "labels": {LABEL_QUEUE: "q", "kueue.x-k8s.io/queue-name": "q"}},
        "spec": {"managedBy": MANAGED_BY,
                 "replicatedJobs": [replicated("workers", 1), replicated("driver", 0)]},
    }  # fmt: skip
    assert delegated(js) and not JOBSET.queued(js)  # the hub's, not the local dispatcher's
    mirror = mirror_of(js, "P100", "hub", JOBSET.parse(js, 60.0))
    assert (mirror["apiVersion"], mirror["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert mirror["metadata"]["labels"] == {LABEL_ORIGIN: "u-2"}
    assert "managedBy" not in mirror["spec"] and mirror["spec"]["suspend"] is False
    for rj in mirror["spec"]["replicatedJobs"]:
        assert rj["template"]["spec"]["template"]["spec"]["nodeSelector"] == {
            "pool": "a", r.LABEL_GPU_MODEL: "P100"}  # fmt: skip
    assert js["spec"]["managedBy"] == MANAGED_BY  # the hub's object is not changed
    # Images from every replicated Job are what a worker may already hold.
    assert {a.name for a in job_artifacts(js)} == {"image:repo/workers:1", "image:repo/driver:1"}
