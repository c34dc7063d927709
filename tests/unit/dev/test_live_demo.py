"""The live demo's pure parts: compression of the trace, the Jobs it submits, its report.

The live run itself (control plane, services, a few hundred KWOK nodes) is `make demo`; its
figures are in docs/notes/issue-12.md.
"""

from __future__ import annotations

import pytest

from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.dev import live_demo as ld
from alnair.dev.demo_elastic import Progress
from alnair.elastic.spec import parse as parse_elastic


def job(
    n: int, job_type: str, arrival_s: float, runtimes: dict[str, float], gpus: int = 1
) -> ld.TraceJob:
    return ld.TraceJob(f"job-{n:05d}", job_type, gpus, arrival_s, runtimes)


JOBS = [
    job(1, "ResNet-50 (batch size 64)", 0.0, {"k80": 4000.0, "p100": 2000.0, "v100": 1000.0}),
    job(2, "A3C", 3000.0, {"k80": 9000.0, "p100": 5000.0, "v100": 3000.0}),
    job(11, "ResNet-50 (batch size 128)", 6000.0, {"p100": 8000.0, "v100": 5000.0}, gpus=4),
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
    assert pod["metadata"]["labels"][ld.LABEL_JOB] == "job-00011"


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


def test_one_training_job_in_seven_is_an_elastic_job_for_its_teams_queue() -> None:
    elastic = job(10, "ResNet-50 (batch size 64)", 0.0, {"v100": 1000.0}, gpus=4)
    assert ld.kind_of(elastic) == "elastic"
    assert ld.kind_of(job(5, "A3C", 0.0, {"v100": 1.0})) == "inference"  # fifth one-GPU
    assert ld.kind_of(job(6, "A3C", 0.0, {"v100": 1.0})) == "training"
    assert ld.kind_of(job(15, "A3C", 0.0, {"v100": 1.0}, gpus=2)) == "training"  # 1 mod 7
    made = ld.job_manifest(elastic, ["K80", "V100M16"])
    assert made["kind"] == "ElasticJob"
    assert made["metadata"]["labels"][ld.LABEL_QUEUE] == ld.LOCAL_QUEUE
    spec = made["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], spec["gpusPerWorker"]) == (2, 8, 1)
    pod = spec["template"]
    assert pod["metadata"]["annotations"][res.GPU_MODEL_REQUEST] == "V100M16"
    assert pod["metadata"]["labels"][ld.LABEL_JOB] == "job-00010"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {res.GPU: "1"}
    # The elastic controller accepts what the demo submits.
    parsed = parse_elastic(made | {"metadata": {**made["metadata"], "namespace": "team-d"}})
    assert (parsed.min_replicas, parsed.max_replicas, parsed.cooldown_s) == (2, 8, 5.0)


def test_elastic_progress_integrates_the_workers_it_held() -> None:
    p = Progress(gpus=2, runtime_s=100.0)
    assert p.finishes_at() is None  # no workers, no progress
    p.workers = {"w-0"}
    p.since = 10.0
    assert p.finishes_at() == pytest.approx(210.0)  # half the trace's GPUs: twice as long
    p.advance(60.0)  # 50 s at half speed: a quarter done
    p.workers |= {"w-1", "w-2", "w-3"}  # grown to twice the trace's count
    assert p.done == pytest.approx(0.25)
    assert p.finishes_at() == pytest.approx(60.0 + 0.75 * 50.0)
    p.advance(1_000.0)
    assert p.done == 1.0


def test_gpu_time_follows_each_holding_and_gives_team_shares() -> None:
    obs = ld.Observed(total_gpus=8)
    obs.team = {"a": "team-a", "e": "team-b"}
    obs.hold("a", 2, 0.0)
    obs.hold("e", 1, 0.0)  # an elastic job grows, then shrinks, then ends
    obs.hold("e", 4, 10.0)
    assert obs.allocated == 6
    obs.hold("e", 2, 20.0)
    obs.hold("e", 0, 30.0)
    obs.hold("a", 0, 30.0)
    obs.ended = 40.0
    # a: 2 x 30 = 60; e: 10 + 40 + 20 = 70
    shares = obs.team_shares()
    assert shares["team-a"] == pytest.approx(60 / 130)
    assert shares["team-b"] == pytest.approx(70 / 130)
    assert obs.allocated == 0


def test_latency_is_split_by_kind_of_job() -> None:
    obs = ld.Observed(total_gpus=8)
    obs.kind = {"a": "training", "b": "training", "e": "elastic"}
    obs.seen = {"a": 0.0, "b": 0.0, "e": 0.0}
    obs.bound = {"a": 0.01, "b": 0.03, "e": 2.0}
    split = ld.latency_by_kind(obs)
    assert split["training"] == (pytest.approx(10.0), pytest.approx(30.0))
    assert split["elastic"] == (pytest.approx(2000.0), pytest.approx(2000.0))
    assert "inference" not in split
