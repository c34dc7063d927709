"""The live demo's pure parts: compression of the trace, the Jobs it submits, its report.

The live run itself (control plane, services, a few hundred KWOK nodes) is `make demo`; its
figures are in docs/notes/issue-12.md.
"""

from __future__ import annotations

import pytest

from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.dev import live_demo as ld


def job(
    n: int, job_type: str, arrival_s: float, runtimes: dict[str, float], gpus: int = 1
) -> ld.TraceJob:
    return ld.TraceJob(f"job-{n:05d}", job_type, gpus, arrival_s, runtimes)


JOBS = [
    job(1, "ResNet-50 (batch size 64)", 0.0, {"k80": 4000.0, "p100": 2000.0, "v100": 1000.0}),
    job(2, "A3C", 3000.0, {"k80": 9000.0, "p100": 5000.0, "v100": 3000.0}),
    job(3, "ResNet-50 (batch size 128)", 6000.0, {"p100": 8000.0, "v100": 5000.0}, gpus=4),
]


def test_compression_fits_arrivals_in_the_window_and_scales_runtimes_to_the_median() -> None:
    comp = ld.compression(JOBS, window_s=60, median_runtime_s=30, max_runtime_s=90)
    assert comp.arrival(6000.0) == pytest.approx(60.0)
    # the median of the fastest runtimes (1000, 3000, 5000) is 3000 trace seconds -> 30 s
    assert comp.runtime(3000.0) == pytest.approx(30.0)
    assert comp.runtime(1000.0) == pytest.approx(10.0)
    assert comp.runtime(1e9) == 90.0  # capped
    assert comp.runtime(1.0) == 1.0  # never below a second


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("window_s", {"window_s": 0}),
        ("median_runtime_s", {"median_runtime_s": -1}),
        ("max_runtime_s", {"max_runtime_s": 0}),
    ],
)
def test_bad_compression_settings_are_named(field: str, kw: dict[str, float]) -> None:
    args = {"window_s": 60.0, "median_runtime_s": 30.0, "max_runtime_s": 90.0, **kw}
    with pytest.raises(InvalidValueError, match=field):
        ld.compression(JOBS, **args)


def test_model_annotations_split_gavel_job_types() -> None:
    assert ld.model_annotations("ResNet-50 (batch size 64)") == {
        res.ANN_MODEL_NAME: "ResNet-50",
        res.ANN_BATCH_SIZE: "64",
    }
    assert ld.model_annotations("A3C") == {res.ANN_MODEL_NAME: "A3C"}


def test_job_manifest_asks_for_our_scheduler_and_excludes_types_it_cannot_run_on() -> None:
    models = ["K80", "P100", "V100M16"]
    anywhere = ld.job_manifest(JOBS[0], models)
    pod = anywhere["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "alnair"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {res.GPU: "1"}
    assert res.GPU_MODEL_REQUEST not in pod["metadata"]["annotations"]
    assert res.ANN_DURATION not in pod["metadata"]["annotations"]  # written once bound
    no_k80 = ld.job_manifest(JOBS[2], models)
    pod = no_k80["spec"]["template"]
    assert pod["metadata"]["annotations"][res.GPU_MODEL_REQUEST] == "P100|V100M16"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {res.GPU: "4"}
    assert pod["metadata"]["labels"][ld.LABEL_JOB] == "job-00003"


def test_report_from_what_the_watch_saw() -> None:
    obs = ld.Observed(total_gpus=10)
    obs.gpus = {"a": 2, "b": 4}
    obs.submitted = {"a": 0.0, "b": 1.0}
    obs.seen = {"a": 0.1, "b": 1.1}
    obs.bound = {"a": 0.2, "b": 1.5}
    obs.finished = {"a": (5.0, "Succeeded"), "b": (11.0, "Succeeded")}
    # allocation: 2 GPUs 0.2-1.5, 6 GPUs 1.5-5, 4 GPUs 5-11, then none
    obs.timeline = [(0.2, 2, 0), (1.5, 6, 0), (5.0, 4, 0), (11.0, 0, 0)]
    r = ld.report(obs)
    assert (r.jobs, r.done, r.failed) == (2, 2, 0)
    assert r.mean_jct_s == pytest.approx((5.0 + 10.0) / 2)
    assert r.latency_p50_ms == pytest.approx(100.0)
    assert r.latency_max_ms == pytest.approx(400.0)
    area = 2 * 1.3 + 6 * 3.5 + 4 * 6.0
    assert r.mean_util_pct == pytest.approx(100 * area / (11.0 * 10))
    assert r.peak_util_pct == pytest.approx(60.0)
    assert r.makespan_s == pytest.approx(11.0)


def test_the_shipped_trace_loads_with_runtimes_from_gavels_table() -> None:
    jobs = ld.load_trace(["k80", "p100", "v100"])
    assert len(jobs) == 1181
    assert {j.gpus for j in jobs} <= {1, 2, 4, 8}
    assert all(j.runtime_s for j in jobs)
    # the one configuration Gavel could not run on a K80 gets no K80 runtime
    r50 = [j for j in jobs if j.job_type == "ResNet-50 (batch size 128)"]
    assert r50 and all("k80" not in j.runtime_s for j in r50)
    first = jobs[0]  # Transformer (batch size 128), 95,121 steps on one GPU, at t=0
    assert first.arrival_s == 0.0 and first.gpus == 1
    assert first.runtime_s["v100"] == pytest.approx(95121 / 5.642201972497628)
    assert len(ld.load_trace(["v100"], limit=10)) == 10
