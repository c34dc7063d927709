"""The aggregation math: fair split of a shared GPU, and mergeable summaries."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from alnair.profiler.agent.attribution import attribute_device_util, pod_shares
from alnair.profiler.gpu import GpuSample, ProcessUsage
from alnair.profiler.statistics import Profile, Stat, owner_annotations

utils = st.floats(min_value=0, max_value=100, allow_nan=False)
values = st.floats(min_value=0, max_value=1e6, allow_nan=False)


def test_two_pods_sharing_a_gpu_split_it_by_sm_share() -> None:
    # dcgm-exporter would report 90% for both pods; they really used 60 and 30.
    split = attribute_device_util(90.0, {"a": 40.0, "b": 20.0})
    assert split == {"a": pytest.approx(60.0), "b": pytest.approx(30.0)}


def test_no_sm_samples_split_evenly() -> None:
    assert attribute_device_util(50.0, {"a": 0.0, "b": 0.0}) == {"a": 25.0, "b": 25.0}
    assert attribute_device_util(50.0, {}) == {}


@example(device=1.5, sms={"0": 5e-324})  # subnormal samples once broke the sum
@given(
    device=st.floats(min_value=-10, max_value=150, allow_nan=False),
    sms=st.dictionaries(st.text(min_size=1, max_size=4), utils, min_size=1, max_size=8),
)
def test_shares_always_add_up_to_the_device(device: float, sms: dict[str, float]) -> None:
    split = attribute_device_util(device, sms)
    assert set(split) == set(sms)
    assert all(v >= 0 for v in split.values())
    assert math.isclose(sum(split.values()), min(100.0, max(0.0, device)), abs_tol=1e-6)


def test_pod_shares_group_processes_by_pod_and_drop_strangers() -> None:
    sample = GpuSample(
        index=0,
        uuid="GPU-0",
        util_pct=80.0,
        mem_used_mib=9000.0,
        processes=(
            ProcessUsage(0, 3000.0, 30.0, pid=10),  # pod a, main process
            ProcessUsage(0, 1000.0, 10.0, pid=11),  # pod a, dataloader worker with CUDA
            ProcessUsage(0, 4000.0, 40.0, pid=20),  # pod b
            ProcessUsage(0, 1000.0, None, pid=99),  # host process, no pod
        ),
    )
    shares = {s.pod_uid: s for s in pod_shares(sample, {10: "a", 11: "a", 20: "b"})}
    assert set(shares) == {"a", "b"}
    assert shares["a"].mem_used_mib == 4000.0
    assert shares["b"].mem_used_mib == 4000.0
    assert shares["a"].gpu_util_pct == pytest.approx(40.0)
    assert shares["b"].gpu_util_pct == pytest.approx(40.0)
    assert shares["a"].sm_util_pct == 40.0


def test_sim_processes_carry_their_pod() -> None:
    sample = GpuSample(1, "GPU-1", 70.0, 5000.0, (ProcessUsage(1, 5000.0, 70.0, pod_uid="p"),))
    (share,) = pod_shares(sample, {})
    assert (share.pod_uid, share.gpu_index, share.gpu_uuid, share.gpu_util_pct) == (
        "p",
        1,
        "GPU-1",
        70.0,
    )


def test_stat_mean_and_max() -> None:
    s = Stat.of([10.0, 30.0, 20.0])
    assert (s.count, s.mean, s.max) == (3, pytest.approx(20.0), 30.0)
    assert Stat().mean == 0.0


@given(
    xs=st.lists(values, max_size=30),
    ys=st.lists(values, max_size=30),
    zs=st.lists(values, max_size=30),
)
def test_merging_summaries_equals_summarising_everything(
    xs: list[float], ys: list[float], zs: list[float]
) -> None:
    whole = Stat.of(xs + ys + zs)
    left = Stat.of(xs).merge(Stat.of(ys)).merge(Stat.of(zs))
    right = Stat.of(xs).merge(Stat.of(ys).merge(Stat.of(zs)))
    for merged in (left, right):
        assert merged.count == whole.count
        assert merged.max == whole.max
        assert math.isclose(merged.total, whole.total, rel_tol=1e-9, abs_tol=1e-6)


def test_job_profile_folds_pods_and_annotates_owner() -> None:
    worker0 = Profile(
        {
            "gpu_util_pct": Stat.of([90.0, 80.0]),
            "gpu_mem_used_mib": Stat.of([8000.0, 9000.0]),
            "cpu_util_cores": Stat.of([2.0]),
        }
    )
    worker1 = Profile(
        {
            "gpu_util_pct": Stat.of([70.0, 60.0]),
            "gpu_mem_used_mib": Stat.of([12000.0, 11000.0]),
            "mem_used_mib": Stat.of([4096.0]),
        }
    )
    job = Profile.fold([worker0, worker1])
    assert job.get("gpu_util_pct").mean == pytest.approx(75.0)
    assert job.get("gpu_util_pct").max == 90.0
    assert job.get("gpu_mem_used_mib").max == 12000.0
    ann = owner_annotations(job)
    assert ann["alnair.io/profile-gpu-util-max-pct"] == "90.00"
    assert ann["alnair.io/profile-gpu-util-mean-pct"] == "75.00"
    assert ann["alnair.io/profile-gpu-mem-max-mib"] == "12000.00"
    assert ann["alnair.io/profile-cpu-util-max-cores"] == "2.00"
    assert ann["alnair.io/profile-mem-max-mib"] == "4096.00"
    assert ann["alnair.io/profile-samples"] == "4"
