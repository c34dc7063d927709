"""Placement of preferred allocations and the container grants, as pure functions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from alnair.common.events import GpuLink
from alnair.common.topology import set_score
from alnair.deviceplugin.allocation import (
    Layout,
    grant_fraction,
    grant_whole,
    pick_fraction,
    pick_whole,
)

NV, SYS, PIX, X = GpuLink.NVLINK, GpuLink.SYS, GpuLink.PIX, GpuLink.SELF
# two NVLink pairs (0-1, 2-3) joined only through the socket interconnect
TOPO = [
    [X, NV, SYS, SYS],
    [NV, X, SYS, SYS],
    [SYS, SYS, X, NV],
    [SYS, SYS, NV, X],
]


def units(gpu: int, n: int) -> list[str]:
    return [f"mem-{gpu}-{k}" for k in range(n)]


def test_fraction_stays_on_the_tightest_gpu_that_fits() -> None:
    available = {0: units(0, 10), 1: units(1, 4), 2: units(2, 6)}
    chosen = pick_fraction(available, [], [], 5)
    assert {c.split("-")[1] for c in chosen} == {"2"}
    assert len(chosen) == 5


def test_fraction_follows_the_scheduler_then_the_must_include() -> None:
    available = {0: units(0, 10), 1: units(1, 10)}
    assert {c.split("-")[1] for c in pick_fraction(available, [], [], 3, scheduler_gpu=1)} == {"1"}
    chosen = pick_fraction(available, ["mem-0-7"], [0], 3)
    assert chosen[0] == "mem-0-7"
    assert {c.split("-")[1] for c in chosen} == {"0"}


def test_fraction_spills_over_only_when_no_gpu_fits() -> None:
    available = {0: units(0, 3), 1: units(1, 4)}
    chosen = pick_fraction(available, [], [], 6)
    assert len(chosen) == 6
    assert sum(c.startswith("mem-1-") for c in chosen) == 4  # fullest GPU first


def test_whole_gpus_take_an_nvlink_pair() -> None:
    assert sorted(pick_whole([0, 1, 2, 3], [], 2, TOPO)) in ([0, 1], [2, 3])
    assert sorted(pick_whole([0, 2, 3], [], 2, TOPO)) == [2, 3]
    assert sorted(pick_whole([0, 1, 2, 3], [2], 2, TOPO)) == [2, 3]


def test_whole_gpus_honour_the_scheduler_when_available() -> None:
    assert pick_whole([0, 1, 2, 3], [], 2, TOPO, scheduler_gpus=[0, 2]) == [0, 2]
    # not available any more: fall back to the best pair
    assert sorted(pick_whole([1, 2, 3], [], 2, TOPO, scheduler_gpus=[0, 2])) == [2, 3]


def test_whole_gpus_prefer_one_numa_node_between_equal_links() -> None:
    flat = [[X, PIX, PIX, PIX], [PIX, X, PIX, PIX], [PIX, PIX, X, PIX], [PIX, PIX, PIX, X]]
    numa = {0: 0, 1: 1, 2: 1, 3: 0}
    assert sorted(pick_whole([0, 1, 2, 3], [], 2, flat, numa)) == [0, 3]


def test_set_score_sums_pairs() -> None:
    assert set_score([0, 1], TOPO) == 5
    assert set_score([0, 1, 2], TOPO) == 5
    assert set_score([0, 9], TOPO) == 0


@given(
    st.dictionaries(st.integers(0, 7), st.integers(0, 40), min_size=1),
    st.integers(1, 60),
    st.data(),
)
def test_fraction_invariants(sizes: dict[int, int], size: int, data: st.DataObject) -> None:
    available = {g: units(g, n) for g, n in sizes.items()}
    flat = [d for ids in available.values() for d in ids]
    must = data.draw(st.lists(st.sampled_from(flat), max_size=3, unique=True)) if flat else []
    must_gpus = [int(m.split("-")[1]) for m in must]
    chosen = pick_fraction(available, must, must_gpus, size)
    assert set(must[:size]) <= set(chosen)
    assert len(chosen) == len(set(chosen)) == min(size, len(set(flat) | set(must)))
    assert set(chosen) <= set(flat)
    fits = [g for g, ids in available.items() if len(ids) >= size]
    if not must and fits:
        assert len({c.split("-")[1] for c in chosen}) == 1


@given(st.sets(st.integers(0, 7), min_size=1), st.integers(1, 8), st.data())
def test_whole_invariants(avail: set[int], size: int, data: st.DataObject) -> None:
    topo = [
        [X if i == j else (NV if i // 2 == j // 2 else SYS) for j in range(8)] for i in range(8)
    ]
    must = data.draw(st.lists(st.sampled_from(sorted(avail)), max_size=2, unique=True))
    chosen = pick_whole(sorted(avail), must, size, topo)
    assert len(chosen) == len(set(chosen)) == min(size, len(avail))
    assert set(must[:size]) <= set(chosen)
    assert set(chosen) <= avail


def test_whole_grant_sets_visible_devices() -> None:
    grant = grant_whole(["GPU-a", "GPU-c"])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-c", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert grant.mounts == []


def test_fraction_grant_injects_the_shim_its_limits_and_state() -> None:
    layout = Layout(shim_host_path="/opt/alnair/libalnair-intercept.so", state_dir="/srv/alnair")
    grant = grant_fraction(
        uuid="GPU-b",
        gpu_index=1,
        vgpu_id="v1",
        memory_mib=4096,
        compute_pct=30,
        layout=layout,
    )
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert grant.envs["CUDA_VISIBLE_DEVICES"] == "0"
    assert grant.envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "4096"
    assert grant.envs["ALNAIR_GPU_COMPUTE_PCT"] == "30"
    assert grant.envs["LD_PRELOAD"] == layout.shim_container_path
    assert grant.envs["ALNAIR_VGPU_ID"] == "v1"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in grant.mounts}
    assert mounts[layout.shim_container_path] == ("/opt/alnair/libalnair-intercept.so", True)
    assert mounts["/var/run/alnair/vgpu"] == ("/srv/alnair/vgpu/v1", False)
    # its own vGPU's socket directory only, read-only (issue 16)
    assert mounts["/var/run/alnair/registry"] == ("/srv/alnair/registry/v1", True)
    assert grant.envs["ALNAIR_VGPU_REGION"] == "/var/run/alnair/vgpu/region"
    assert grant.envs["ALNAIR_REGISTRY_SOCKET"] == "/var/run/alnair/registry/registry.sock"


def test_memory_only_fraction_sets_no_compute_limit() -> None:
    grant = grant_fraction(
        uuid="GPU-b", gpu_index=1, vgpu_id="v1", memory_mib=512, compute_pct=None, layout=Layout()
    )
    assert "ALNAIR_GPU_COMPUTE_PCT" not in grant.envs
    assert grant.envs["ALNAIR_GPU_MEMORY_LIMIT_MIB"] == "512"


def test_mps_grant_uses_mps_limits_and_no_shim() -> None:
    grant = grant_fraction(
        uuid="GPU-b",
        gpu_index=1,
        vgpu_id="v1",
        memory_mib=2048,
        compute_pct=25,
        layout=Layout(),
        mode="mps",
    )
    assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert grant.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert "LD_PRELOAD" not in grant.envs
    assert [m.container_path for m in grant.mounts] == ["/tmp/nvidia-mps"]
