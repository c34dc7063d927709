"""The DRA driver's pure parts: reading a claim's allocation, the limits a share gets, the
sharing configuration (the claim's overriding the class's), and compute capabilities as the
versions DRA attributes want."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common import dra
from alnair.common.events import GpuDevice
from alnair.deviceplugin.allocation import Layout
from alnair.deviceplugin.draclaims import ClaimError, claim_devices, claim_grants, limits

GPU = GpuDevice(index=0, uuid="GPU-0", model="A100", memory_mib=40960)


def claim(results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def sharing(value: str, source: str, requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": dra.DRIVER,
            "parameters": {"kind": dra.SHARING_CONFIG_KIND, "sharing": value},
        },
    }
    if requests:
        entry["requests"] = requests
    return entry


def result(device: str, pool: str = "n1", driver: str = dra.DRIVER, **kw: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, **kw}


def test_only_this_drivers_devices_on_this_node_are_prepared() -> None:
    got = claim_devices(
        claim(
            [
                result("gpu-1", consumedCapacity={"memory": "10Gi", "compute": "30"}),
                result("gpu-2", pool="n2"),
                result("nic-0", driver="net.example.com"),
            ]
        ),
        "n1",
    )
    assert [(d.device, d.gpu_index, d.memory_mib, d.compute_pct) for d in got] == [
        ("gpu-1", 1, 10240, 30)
    ]


@pytest.mark.parametrize(
    ("consumed", "expected"),
    [
        ({}, (None, None)),
        ({"memory": "40Gi", "compute": "100"}, (None, None)),
        ({"memory": "1500Mi"}, (1500, None)),
        ({"compute": "25"}, (None, 25)),
        ({"memory": "0.5Gi", "compute": "99"}, (512, 99)),
    ],
)
def test_a_share_is_limited_to_what_it_consumed(
    consumed: dict[str, str], expected: tuple[int | None, int | None]
) -> None:
    [device] = claim_devices(claim([result("gpu-0", consumedCapacity=consumed)]), "n1")
    assert limits(device, GPU) == expected


def test_claim_config_overrides_class_config_for_its_requests() -> None:
    results = [result("gpu-0")]
    by_class = claim_devices(claim(results, [sharing("mps", "FromClass")]), "n1")
    assert by_class[0].sharing == "mps"
    both = [sharing("mps", "FromClass"), sharing("intercept", "FromClaim", ["gpu"])]
    assert claim_devices(claim(results, both), "n1")[0].sharing == "intercept"
    other = [sharing("mps", "FromClass"), sharing("intercept", "FromClaim", ["other"])]
    assert claim_devices(claim(results, other), "n1")[0].sharing == "mps"


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (claim([result("gpu-x")]), "gpu-x"),
        (claim([result("gpu-0", consumedCapacity={"compute": "2.5"})]), "2.5"),
        (claim([result("gpu-0")], [sharing("mig", "FromClass")]), "mig"),
        ({"metadata": {"namespace": "ns", "name": "c"}, "status": {}}, "ns/c"),
    ],
)
def test_unusable_claims_are_refused_naming_the_value(bad: Any, named: str) -> None:
    with pytest.raises(ClaimError, match=named.replace(".", r"\.")):
        claim_devices(bad, "n1")


def test_a_share_must_be_its_claims_only_device() -> None:
    devices = claim_devices(
        claim([result("gpu-0", consumedCapacity={"compute": "20"}), result("gpu-1")]), "n1"
    )
    gpus = {0: GPU, 1: GPU.model_copy(update={"index": 1, "uuid": "GPU-1"})}
    with pytest.raises(ClaimError, match="share"):
        claim_grants("uid-1", devices, gpus, Layout())


@pytest.mark.parametrize(
    ("capability", "version"),
    [("8.0", "8.0.0"), ("9", "9.0.0"), ("10.1.2", "10.1.2"), ("", None), ("sm_80", None)],
)
def test_compute_capability_as_semver(capability: str, version: str | None) -> None:
    assert dra.semver(capability) == version
