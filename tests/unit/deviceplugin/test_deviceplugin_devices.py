"""Devices made from the inventory: counts, ids, topology, and ids mapped back to GPUs."""

from __future__ import annotations

import pytest

from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.events import GpuDevice
from alnair.deviceplugin.app import start
from alnair.deviceplugin.devices import (
    COMPUTE,
    DEFAULT_RESOURCES,
    MEMORY,
    MEMORY_GIB,
    WHOLE,
    build_devices,
    gpu_index_of,
)
from alnair.deviceplugin.plugin import KUBELET_MAX_MESSAGE_BYTES, list_message_bytes
from alnair.deviceplugin.settings import DevicePluginSettings

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
    ("resource", "per_gpu"),
    [(MEMORY, 15360), (MEMORY_GIB, 15), (COMPUTE, 100)],
)
def test_fractional_units_per_gpu(resource: str, per_gpu: int) -> None:
    devs = build_devices(resource, GPUS)
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
    assert gpu_index_of(MEMORY_GIB, "gib-1-14", index) == 1
    assert gpu_index_of(COMPUTE, "sm-0-99", index) == 0


@pytest.mark.parametrize(
    ("resource", "bad"),
    [
        (WHOLE, "GPU-zz"),
        (MEMORY, "sm-0-1"),
        (COMPUTE, "sm-x-1"),
        (MEMORY, "mem-0"),
        (MEMORY_GIB, "mem-0-1"),
    ],
)
def test_foreign_ids_are_named_in_the_error(resource: str, bad: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        gpu_index_of(resource, bad, {"GPU-a": 0})
    assert bad in str(err.value)


def test_unknown_resource_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="example.com/fpga"):
        build_devices("example.com/fpga", GPUS)


def _node(gpus: int, memory_mib: int) -> list[GpuDevice]:
    return [
        GpuDevice(index=i, uuid=f"GPU-{i:036x}", model="X", memory_mib=memory_mib, numa_node=i % 2)
        for i in range(gpus)
    ]


# 80 GB (A100/H100 80GB: 81920 MiB) and 141 GB (H200: 144384 MiB) GPUs, UUIDs of NVML's length
@pytest.mark.parametrize(("gpus", "memory_mib"), [(8, 81920), (16, 144384)])
def test_every_default_resource_fits_the_kubelets_message_on_big_nodes(
    gpus: int, memory_mib: int
) -> None:
    """The default memory unit (GiB) keeps ListAndWatch far under the kubelet's 4 MiB limit on
    the largest nodes sold; the MiB resource would not fit."""
    node = _node(gpus, memory_mib)
    sizes = {r: list_message_bytes(build_devices(r, node)) for r in DEFAULT_RESOURCES}
    assert max(sizes.values()) * 50 < KUBELET_MAX_MESSAGE_BYTES  # a margin of 50x at least
    assert len(build_devices(MEMORY_GIB, node)) == gpus * (memory_mib // 1024)
    assert list_message_bytes(build_devices(MEMORY, node)) > KUBELET_MAX_MESSAGE_BYTES


async def test_a_memory_unit_setting_is_refused_naming_the_resources() -> None:
    """The unit is the resource's name: a setting that changed it would let a node advertise
    units the scheduler reads as another."""
    settings = DevicePluginSettings(node_name="n1", memory_unit_mib=16)
    with pytest.raises(ConfigError, match="alnair.io/gpu-memory-gib") as err:
        await start(settings, connect_bus=False, http=False)
    assert "MEMORY_UNIT_MIB=16" in str(err.value)
    assert DevicePluginSettings(node_name="n1").resources == list(DEFAULT_RESOURCES)
