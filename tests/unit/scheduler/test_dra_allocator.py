"""The scheduler's claim allocator over slices the DRA driver publishes: consumed capacity summed
over allocated and in-flight claims never exceeds a GPU, request policies round requests and
default to the whole GPU, tainted GPUs take no new claims, CEL selectors of the subset are
evaluated and others refused, and a claim nothing can satisfy gets a reason naming its request."""

from __future__ import annotations

import uuid
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alnair.common import dra
from alnair.common.events import GpuDevice, GpuHealthChanged, GpuInventory
from alnair.deviceplugin.draslices import build_slice
from alnair.deviceplugin.state import NodeDevices
from alnair.scheduler.dra.allocator import (
    UnsupportedClaim,
    Usage,
    allocate,
    node_devices,
    parse_requests,
)
from alnair.scheduler.dra.cel import UnsupportedSelector

GIB = 1 << 30
GPU_MIB = 81920
CLASSES = {
    name: {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.alnair.io"'}}]}}
    for name in dra.CLASSES
}


def node(name: str = "n1", count: int = 8, unhealthy: tuple[int, ...] = ()) -> NodeDevices:
    state = NodeDevices(name)
    gpus = [
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            model="H100" if i < 4 else "A100",
            memory_mib=GPU_MIB,
            compute_capability="9.0" if i < 4 else "8.0",
        )
        for i in range(count)
    ]
    state.set_inventory(GpuInventory(node=name, gpus=gpus))
    for i in unhealthy:
        state.apply_health(
            GpuHealthChanged(node=name, gpu_index=i, gpu_uuid=f"GPU-{i}", healthy=False, xid=79)
        )
    return state


def devices(state: NodeDevices) -> Any:
    return node_devices([build_slice(state.snapshot, 1)], state.node)


def claim(
    memory: str | None = None,
    compute: str | None = None,
    *,
    cls: str = dra.CLASS_SHARED,
    count: int = 1,
    selectors: tuple[str, ...] = (),
    name: str = "c",
) -> dict[str, Any]:
    caps = {}
    if memory:
        caps["memory"] = memory
    if compute:
        caps["compute"] = compute
    exact: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if caps:
        exact["capacity"] = {"requests": caps}
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}},
    }


def run(c: dict[str, Any], devs: Any, usage: Usage) -> Any:
    got = allocate(c, parse_requests(c), devs, CLASSES, usage, new_share_id=uuid.uuid4)
    if got.results:
        usage.set_claim(c["metadata"]["uid"], got.results)
    return got


def sums(usage: Usage) -> dict[str, dict[str, Decimal]]:
    out: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for results in usage.by_claim.values():
        for r in results:
            for k, v in (r.get("consumedCapacity") or {}).items():
                out[r["device"]][k] += Decimal(v.removesuffix("Mi")) * (
                    (1 << 20) if v.endswith("Mi") else 1
                )
    return out


def test_shares_pack_onto_one_gpu_before_the_next() -> None:
    devs, usage = devices(node()), Usage()
    placed = [run(claim("10Gi", "30"), devs, usage).results[0]["device"] for _ in range(4)]
    # three 30 % shares fill a GPU's compute; the fourth goes to the next
    assert placed[:3] == [placed[0]] * 3 and placed[3] != placed[0]
    first = usage.by_claim[next(iter(usage.by_claim))][0]
    assert first["consumedCapacity"] == {"memory": "10240Mi", "compute": "30"}
    assert first["shareID"]


def test_a_claim_without_capacity_takes_the_whole_gpu() -> None:
    devs, usage = devices(node(count=1)), Usage()
    whole = run(claim(cls=dra.CLASS_WHOLE), devs, usage)
    assert whole.results[0]["consumedCapacity"] == {"memory": f"{GPU_MIB}Mi", "compute": "100"}
    refused = run(claim("1Gi", "1"), devs, usage)
    assert refused.results == ()
    assert "request gpu" in refused.reason and "1 without room" in refused.reason


def test_tainted_gpu_takes_no_new_claims_unless_tolerated() -> None:
    devs, usage = devices(node(count=2, unhealthy=(0,))), Usage()
    for _ in range(3):
        assert run(claim("10Gi", "30"), devs, usage).results[0]["device"] == "gpu-1"
    full = run(claim("10Gi", "30"), devs, usage)
    assert full.results == () and "1 tainted" in full.reason
    tolerant = claim("10Gi", "30")
    tolerant["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": dra.TAINT_UNHEALTHY, "operator": "Exists"}
    ]
    assert run(tolerant, devs, usage).results[0]["device"] == "gpu-0"


def test_cel_selectors_of_the_subset_choose_the_gpu() -> None:
    devs, usage = devices(node()), Usage()
    a100 = run(
        claim("10Gi", "10", selectors=('device.attributes["gpu.alnair.io"].model == "A100"',)),
        devs,
        usage,
    )
    assert a100.results[0]["device"] in {f"gpu-{i}" for i in range(4, 8)}
    hopper = run(
        claim(
            "10Gi",
            "10",
            selectors=(
                'device.attributes["gpu.alnair.io"].computeCapability.isGreaterThan(semver("8.5.0"))'
                ' && device.capacity["gpu.alnair.io"].memory.compareTo(quantity("80Gi")) >= 0',
            ),
        ),
        devs,
        usage,
    )
    assert hopper.results[0]["device"] in {f"gpu-{i}" for i in range(4)}
    none = run(
        claim("1Gi", selectors=('device.attributes["gpu.alnair.io"].model == "T4"',)), devs, usage
    )
    assert none.results == () and none.reason.startswith("request gpu: 0 device(s)")


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "a" || device.driver == "b"',
        "device.attributes.exists(a, true)",
        "size(x) > 1",
    ],
)
def test_selectors_outside_the_subset_are_refused_naming_them(expression: str) -> None:
    c = claim("1Gi", selectors=(expression,))
    with pytest.raises(UnsupportedSelector, match="not supported by the Alnair allocator"):
        allocate(c, parse_requests(c), devices(node()), CLASSES, Usage())


def test_request_shapes_it_does_not_allocate_are_refused_naming_the_request() -> None:
    c = claim("1Gi")
    c["spec"]["devices"]["requests"][0] = {"name": "pick", "firstAvailable": []}
    with pytest.raises(UnsupportedClaim, match="ns/c/pick"):
        parse_requests(c)


def test_a_claim_nothing_can_satisfy_names_its_request() -> None:
    got = run(claim("90Gi", "10"), devices(node()), Usage())
    assert got.results == ()
    assert got.reason == (
        "request gpu: 8 device(s) of class shared-gpu.alnair.io match, 8 without room for "
        "compute 10, memory 92160Mi; 1 needed"
    )


def test_released_claims_free_their_share() -> None:
    devs, usage = devices(node(count=1)), Usage()
    held = [claim("20Gi", "50") for _ in range(2)]
    for c in held:
        assert run(c, devs, usage).results
    assert run(claim("20Gi", "50"), devs, usage).results == ()
    usage.forget(held[0]["metadata"]["uid"])  # its bind failed: released
    assert run(claim("20Gi", "50"), devs, usage).results


@given(
    st.lists(
        st.tuples(st.integers(1, 90), st.integers(1, 100), st.booleans()), min_size=1, max_size=60
    )
)
def test_no_gpu_is_ever_over_committed(asks: list[tuple[int, int, bool]]) -> None:
    devs, usage = devices(node(count=4)), Usage()
    for gib, pct, whole in asks:
        run(claim(cls=dra.CLASS_WHOLE) if whole else claim(f"{gib}Gi", str(pct)), devs, usage)
    for device, used in sums(usage).items():
        assert used["memory"] <= GPU_MIB << 20, device
        assert used["compute"] <= 100, device
