"""cgroup parsing on real-format /proc/<pid>/cgroup samples of each runtime and driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from alnair.profiler.agent.cgroups import (
    CgroupCounters,
    PodCgroupMeter,
    parse_cpu_stat,
    parse_io_stat,
    parse_proc_cgroup,
    pod_cgroup_candidates,
    pod_of_pid,
    rates,
)

UID = "9f2c1a3e-5b7d-4e11-8a2b-0c4d6e8f1a2b"
UID_US = UID.replace("-", "_")
CID = "4c1f3e2d" * 8  # 64 hex chars, as runtimes print them

BURST = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice"
BEST = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice"

# cgroup v2 (unified), systemd cgroup driver: one "0::" line.
V2_CONTAINERD = f"0::{BURST}/cri-containerd-{CID}.scope\n"
V2_CRIO = f"0::{BEST}/crio-{CID}.scope\n"
V2_DOCKER = f"0::{BURST}/docker-{CID}.scope\n"
# Guaranteed QoS has no QoS level slice.
V2_GUARANTEED = f"0::/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope\n"
# cgroupfs driver (e.g. k3s default, older kubeadm): dashes in the uid, bare container id.
V2_CGROUPFS = f"0::/kubepods/burstable/pod{UID}/{CID}\n"
# kind / nested kubelet: everything under kubelet.slice.
V2_KIND = (
    f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{UID_US}.slice/cri-containerd-{CID}.scope\n"
)
# CRI-O's conmon lives in the pod slice but is not the container.
V2_CRIO_CONMON = f"0::{BURST}/crio-conmon-{CID}.scope\n"

# cgroup v1, one line per hierarchy (systemd driver, containerd) as on Ubuntu 18.04 nodes.
V1_CONTAINERD = "\n".join(
    [
        f"12:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope",
        f"11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope",
        f"10:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope",
        f"4:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope",
        f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope",
        "0::/",
    ]
)
# cgroup v1, cgroupfs driver, docker runtime (nvidia-docker era).
V1_DOCKER_CGROUPFS = "\n".join(
    [
        f"11:devices:/kubepods/besteffort/pod{UID}/{CID}",
        f"7:memory:/kubepods/besteffort/pod{UID}/{CID}",
        f"3:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}",
        "1:name=systemd:/system.slice/docker.service",
    ]
)
# cgroup v1 CRI-O, systemd driver.
V1_CRIO = "\n".join(
    [
        f"9:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/crio-{CID}.scope",
        f"2:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/crio-{CID}.scope",
    ]
)


@pytest.mark.parametrize(
    ("text", "version", "runtime", "pod_path"),
    [
        (
            V2_CONTAINERD,
            2,
            "containerd",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice",
        ),
        (
            V2_CRIO,
            2,
            "cri-o",
            f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice",
        ),
        (
            V2_DOCKER,
            2,
            "docker",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice",
        ),
        (V2_GUARANTEED, 2, "containerd", f"kubepods.slice/kubepods-pod{UID_US}.slice"),
        (V2_CGROUPFS, 2, None, f"kubepods/burstable/pod{UID}"),
        (
            V2_KIND,
            2,
            "containerd",
            f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_US}.slice",
        ),
        (
            V1_CONTAINERD,
            1,
            "containerd",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice",
        ),
        (V1_DOCKER_CGROUPFS, 1, None, f"kubepods/besteffort/pod{UID}"),
        (
            V1_CRIO,
            1,
            "cri-o",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice",
        ),
    ],
    ids=[
        "v2-containerd",
        "v2-crio",
        "v2-docker",
        "v2-guaranteed",
        "v2-cgroupfs",
        "v2-kind",
        "v1-containerd",
        "v1-docker-cgroupfs",
        "v1-crio",
    ],
)
def test_each_runtime_maps_to_pod_and_container(
    text: str, version: int, runtime: str | None, pod_path: str
) -> None:
    found = parse_proc_cgroup(text)
    assert found is not None
    assert found.pod_uid == UID
    assert found.container_id == CID
    assert found.runtime == runtime
    assert found.cgroup_version == version
    assert found.pod_cgroup_path == pod_path


def test_crio_conmon_is_in_the_pod_but_is_no_container() -> None:
    found = parse_proc_cgroup(V2_CRIO_CONMON)
    assert found is not None
    assert found.pod_uid == UID
    assert found.container_id is None


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # a shell on the host
        "0::/system.slice/containerd.service\n",
        "0::/\n",  # inside a cgroup namespace: nothing to see
        "12:memory:/user.slice\n1:name=systemd:/user.slice/user-0.slice\n",
        "",
        "garbage without colons\n",
    ],
)
def test_processes_outside_pods_map_to_none(text: str) -> None:
    assert parse_proc_cgroup(text) is None


def test_pod_of_pid_reads_proc_and_tolerates_vanished_processes(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V2_CONTAINERD)
    found = pod_of_pid(4242, proc_root=tmp_path)
    assert found is not None
    assert found.pod_uid == UID
    assert pod_of_pid(4343, proc_root=tmp_path) is None


CPU_STAT = """usage_usec 2500000
user_usec 2000000
system_usec 500000
nr_periods 0
nr_throttled 0
throttled_usec 0
"""
IO_STAT = """8:0 rbytes=1048576 wbytes=4096 rios=12 wios=1 dbytes=0 dios=0
259:0 rbytes=2048 wbytes=8192 rios=2 wios=3 dbytes=0 dios=0
"""


def test_cgroup_v2_files_parse() -> None:
    assert parse_cpu_stat(CPU_STAT) == 2_500_000
    assert parse_cpu_stat("user_usec 1\n") == 0
    assert parse_io_stat(IO_STAT) == (1048576 + 2048, 4096 + 8192)
    assert parse_io_stat("") == (0, 0)


def test_rates_between_two_readings() -> None:
    a = CgroupCounters(
        ts=100.0, cpu_usage_usec=1_000_000, memory_bytes=0, io_read_bytes=0, io_write_bytes=0
    )
    b = CgroupCounters(
        ts=102.0,
        cpu_usage_usec=4_000_000,
        memory_bytes=512 * 2**20,
        io_read_bytes=2_000_000,
        io_write_bytes=1000,
    )
    r = rates(a, b)
    assert r.cpu_util_cores == pytest.approx(1.5)
    assert r.mem_used_mib == pytest.approx(512)
    assert r.io_read_bps == pytest.approx(1_000_000)
    assert r.io_write_bps == pytest.approx(500)


def test_counters_that_go_backwards_read_as_idle() -> None:
    a = CgroupCounters(100.0, 9_000_000, 0, 5000, 5000)
    b = CgroupCounters(101.0, 1_000, 2**20, 0, 0)
    r = rates(a, b)
    assert (r.cpu_util_cores, r.io_read_bps, r.io_write_bps) == (0.0, 0.0, 0.0)
    assert r.mem_used_mib == pytest.approx(1.0)
    assert rates(a, a).cpu_util_cores == 0.0  # no time passed


def test_meter_reads_pod_cgroup_directory(tmp_path: Path) -> None:
    pod_dir = tmp_path / "kubepods.slice" / f"kubepods-pod{UID_US}.slice"
    pod_dir.mkdir(parents=True)
    (pod_dir / "cpu.stat").write_text("usage_usec 1000000\n")
    (pod_dir / "memory.current").write_text(str(300 * 2**20) + "\n")
    (pod_dir / "io.stat").write_text("8:0 rbytes=0 wbytes=0\n")
    meter = PodCgroupMeter(cgroup_root=tmp_path)
    rel = f"kubepods.slice/kubepods-pod{UID_US}.slice"
    assert meter.measure(UID, rel, ts=10.0) is None  # first reading: no rate yet
    (pod_dir / "cpu.stat").write_text("usage_usec 1500000\n")
    (pod_dir / "io.stat").write_text("8:0 rbytes=4000 wbytes=2000\n")
    r = meter.measure(UID, rel, ts=11.0)
    assert r is not None
    assert r.cpu_util_cores == pytest.approx(0.5)
    assert r.mem_used_mib == pytest.approx(300)
    assert (r.io_read_bps, r.io_write_bps) == (4000, 2000)
    # The pod went away: its cgroup is gone and its state is dropped.
    for f in pod_dir.iterdir():
        f.unlink()
    pod_dir.rmdir()
    assert meter.measure(UID, rel, ts=12.0) is None


@pytest.mark.parametrize(
    ("qos", "expected_systemd"),
    [
        (
            "Burstable",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice",
        ),
        (
            "BestEffort",
            f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice",
        ),
        ("Guaranteed", f"kubepods.slice/kubepods-pod{UID_US}.slice"),
    ],
)
def test_pod_cgroup_candidates_match_what_proc_shows(qos: str, expected_systemd: str) -> None:
    candidates = pod_cgroup_candidates(UID, qos)
    assert candidates[0] == expected_systemd
    # The same layouts parse_proc_cgroup reads back from a process inside the pod.
    for rel in candidates:
        found = parse_proc_cgroup(f"0::/{rel}/cri-containerd-{CID}.scope\n")
        assert found is not None
        assert (found.pod_uid, found.pod_cgroup_path) == (UID, rel)


def test_meter_locates_pods_without_gpu_processes(tmp_path: Path) -> None:
    rel = f"kubepods/besteffort/pod{UID}"
    (tmp_path / rel).mkdir(parents=True)
    (tmp_path / rel / "cpu.stat").write_text("usage_usec 0\n")
    (tmp_path / rel / "memory.current").write_text("0\n")
    meter = PodCgroupMeter(cgroup_root=tmp_path)
    assert meter.locate(UID, "BestEffort") == rel
    assert meter.locate("00000000-0000-0000-0000-000000000000", "Burstable") is None


def _v1_pod(root: Path, rel: str, cpuacct: str, cpu_ns: int, mem: int, io: str | None) -> None:
    for hierarchy, name, value in (
        (cpuacct, "cpuacct.usage", str(cpu_ns)),
        ("memory", "memory.usage_in_bytes", str(mem)),
        ("blkio", "blkio.throttle.io_service_bytes", io),
    ):
        if value is None:
            continue
        (root / hierarchy / rel).mkdir(parents=True, exist_ok=True)
        (root / hierarchy / rel / name).write_text(value + "\n")


@pytest.mark.parametrize("cpuacct", ["cpuacct", "cpu,cpuacct"])
def test_meter_reads_a_pod_across_the_v1_hierarchies(tmp_path: Path, cpuacct: str) -> None:
    """cgroup v1 as this project's CI host mounts it (each controller apart) and as most
    distributions do (`cpu,cpuacct` together), under a kubelet --cgroup-root."""
    rel = f"alnair-rn-1/kubepods/besteffort/pod{UID}"
    blkio = "8:0 Read 0\n8:0 Write 0\n8:0 Total 0\nTotal 0"
    _v1_pod(tmp_path, rel, cpuacct, 2_000_000_000, 64 * 2**20, blkio)
    meter = PodCgroupMeter(cgroup_root=tmp_path, prefix="/alnair-rn-1")
    assert meter.version == 1
    assert meter.locate(UID, "BestEffort") == rel
    assert meter.measure(UID, rel, ts=1.0) is None
    blkio = "8:0 Read 8192\n8:0 Write 4096\n8:0 Total 12288\nTotal 12288"
    _v1_pod(tmp_path, rel, cpuacct, 3_500_000_000, 80 * 2**20, blkio)
    r = meter.measure(UID, rel, ts=3.0)
    assert r is not None
    assert r.cpu_util_cores == pytest.approx(0.75)
    assert r.mem_used_mib == pytest.approx(80)
    assert (r.io_read_bps, r.io_write_bps) == (4096, 2048)


def test_v1_without_blkio_reads_no_io(tmp_path: Path) -> None:
    rel = f"kubepods/pod{UID}"
    _v1_pod(tmp_path, rel, "cpuacct", 0, 0, None)
    meter = PodCgroupMeter(cgroup_root=tmp_path)
    assert meter.measure(UID, rel, ts=1.0) is None
    _v1_pod(tmp_path, rel, "cpuacct", 10**9, 0, None)
    r = meter.measure(UID, rel, ts=2.0)
    assert r is not None and (r.cpu_util_cores, r.io_read_bps) == (pytest.approx(1.0), 0)


def test_a_unified_root_is_v2_even_beside_folders(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpu memory io\n")
    assert PodCgroupMeter(cgroup_root=tmp_path).version == 2
