"""A queued Job's DRA claims of Alnair's GPUs, counted in its queue (`dra_claims.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common import dra
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Resource
from alnair.scheduler.dispatcher.dra_claims import with_claims
from alnair.scheduler.dispatcher.parsing import parse_workload


def job(*claims: dict[str, Any], parallelism: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "labels": {"alnair.io/queue-name": "q"}},
        "spec": {"parallelism": parallelism, "suspend": True, "template": {"spec": {
            "resourceClaims": list(claims),
            "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}],
        }}},
    }  # fmt: skip


def template(cls: str, count: int = 1, memory: str | None = None) -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if memory:
        exact["capacity"] = {"requests": {"memory": memory}}
    return {"metadata": {"name": "t", "namespace": "ns"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}}}}  # fmt: skip


def lookup_of(objs: dict[str, dict[str, Any]]) -> Any:
    def lookup(resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        return objs.get(f"{resource.plural}/{namespace}/{name}")

    return lookup


def test_whole_gpus_of_a_claim_template_count_per_pod() -> None:
    j = job({"name": "gpu", "resourceClaimTemplateName": "t"})
    seen = with_claims(j, lookup_of({"resourceclaimtemplates/ns/t": template(dra.CLASS_WHOLE, 2)}))
    wl = parse_workload(seen, 0.0)
    assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == (4, 2, 2)
    assert "limits" not in j["spec"]["template"]["spec"]["containers"][0]["resources"]  # unchanged


def test_a_share_counts_by_its_memory() -> None:
    j = job({"name": "gpu", "resourceClaimTemplateName": "t"})
    found = {"resourceclaimtemplates/ns/t": template(dra.CLASS_SHARED, 1, "10Gi")}
    wl = parse_workload(with_claims(j, lookup_of(found)), 0.0)
    assert wl.request.memory_mib_per_pod == 10 * 1024


def test_an_existing_claim_and_another_drivers_class() -> None:
    claim = {"metadata": {"name": "c", "namespace": "ns"},
             "spec": {"devices": {"requests": [
                 {"name": "gpu", "exactly": {"deviceClassName": dra.CLASS_WHOLE}}]}}}  # fmt: skip
    seen = with_claims(job({"name": "gpu", "resourceClaimName": "c"}),
                       lookup_of({"resourceclaims/ns/c": claim}))  # fmt: skip
    assert parse_workload(seen, 0.0).request.gpus == 2
    other = job({"name": "gpu", "resourceClaimTemplateName": "t"})
    found = {"resourceclaimtemplates/ns/t": template("fpga.example.com")}
    assert with_claims(other, lookup_of(found)) is other  # nothing of the queue's


@pytest.mark.parametrize(
    ("found", "field"),
    [
        ({}, "spec.template.spec.resourceClaims[0].resourceClaimTemplateName"),
        ({"resourceclaimtemplates/ns/t": template(dra.CLASS_SHARED)},
         "spec.template.spec.resourceClaims[0] devices.requests[0].exactly.capacity.requests.memory"),
        ({"resourceclaimtemplates/ns/t": template(dra.CLASS_SHARED, 2, "1Gi")},
         "spec.template.spec.resourceClaims[0] devices.requests[0].exactly.count"),
    ],
)  # fmt: skip
def test_what_cannot_be_counted_is_named(found: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidValueError) as exc:
        with_claims(job({"name": "gpu", "resourceClaimTemplateName": "t"}), lookup_of(found))
    assert exc.value.field == field
