"""Devices made from the inventory: counts, ids, topology, and ids mapped back to GPUs."""

from __future__ import annotations

import pytest

from alnair.common.errors import InvalidValueError
from alnair.common.events import GpuDevice
from alnair.deviceplugin.devices import (
    COMPUTE,
    MEMORY,
    WHOLE,
    build_devices,
    gpu_index_of,
)

GPUS = [
    GpuDevice(index=0, uuid="GPU-a", model="T4", memory_mib=15360, numa_node=0),
    GpuDevice(index=1, uuid="GPU-b", model="T4", memory_mib=15360, numa_node=1),
]


def test_whole_gpus_are_named_by_uuid_with_their_numa_node() -> None:
    devs = build_devices(WHOLE, GPUS)
    assert [(d.id, d.numa_node, d.healthy) for d in devs] == [
        ("GPU-a", 0, True),
        ("GPU-b", 1, True),
    ]


@pytest.mark.parametrize(
    ("resource", "unit", "per_gpu"),
    [(MEMORY, 1, 15360), (MEMORY, 256, 60), (COMPUTE, 1, 100)],
)
def test_fractional_units_per_gpu(resource: str, unit: int, per_gpu: int) -> None:
    devs = build_devices(resource, GPUS, memory_unit_mib=unit)
    assert len(devs) == 2 * per_gpu
    assert len({d.id for d in devs}) == len(devs)
    assert sum(d.gpu_index == 1 for d in devs) == per_gpu
    assert all(d.numa_node == d.gpu_index for d in devs)


def test_health_override_marks_every_unit_of_the_gpu() -> None:
    devs = build_devices(COMPUTE, GPUS, [True, False])
    assert {d.healthy for d in devs if d.gpu_index == 1} == {False}
    assert {d.healthy for d in devs if d.gpu_index == 0} == {True}


def test_ids_map_back_to_their_gpu() -> None:
    index = {"GPU-a": 0, "GPU-b": 1}
    assert gpu_index_of(WHOLE, "GPU-b", index) == 1
    assert gpu_index_of(MEMORY, "mem-1-17", index) == 1
    assert gpu_index_of(COMPUTE, "sm-0-99", index) == 0


@pytest.mark.parametrize(
    ("resource", "bad"),
    [(WHOLE, "GPU-zz"), (MEMORY, "sm-0-1"), (COMPUTE, "sm-x-1"), (MEMORY, "mem-0")],
)
def test_foreign_ids_are_named_in_the_error(resource: str, bad: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        gpu_index_of(resource, bad, {"GPU-a": 0})
    assert bad in str(err.value)


def test_unknown_resource_and_bad_unit_are_refused() -> None:
    with pytest.raises(InvalidValueError, match="example.com/fpga"):
        build_devices("example.com/fpga", GPUS)
    with pytest.raises(InvalidValueError, match="memory_unit_mib"):
        build_devices(MEMORY, GPUS, memory_unit_mib=0)
