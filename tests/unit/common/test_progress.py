"""Issue 27: training progress read from a job's metrics, logs and annotations, and what the
queue plans with it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from alnair.common import progress as pr
from alnair.common.events import PodMetric
from alnair.common.progress import Progress
from alnair.profiler.agent.progress import ProgressReader, ProgressSpec, metrics_url
from alnair.profiler.aggregator.finalize import progress_fields
from alnair.scheduler.dispatcher.progressing import (
    ANN_RESUMED_STEP,
    planned_progress,
    remaining,
)
from alnair.scheduler.queueing.model import RuntimeEstimate


def test_each_source_reads_steps_totals_and_checkpoints() -> None:
    text = (
        "# HELP alnair_train_step steps done\n# TYPE alnair_train_step gauge\n"
        'alnair_train_step{rank="0"} 120\nalnair_train_step{rank="1"} 121\n'
        "alnair_train_total_steps 400\nalnair_train_checkpoint_step 100\nother_metric 7\n"
    )
    assert pr.from_metrics(text) == Progress(121, 400, 100, "metric")
    assert pr.from_metrics("other 1\n") is None
    lines = ["epoch 1 step 10/400 loss 2.1", "saved checkpoint at step 100", "Step: 130 of 400"]
    assert pr.from_log(lines, pr.log_pattern(None)) == Progress(130, 400, 100, "log")
    custom = pr.log_pattern(r"it=(?P<step>\d+)")
    assert pr.from_log(["it=5", "it=9"], custom) == Progress(9, None, None, "log")
    with pytest.raises(ValueError, match="names neither"):
        pr.log_pattern(r"loss=(\d+)")
    with pytest.raises(ValueError, match="progress-log-pattern"):
        pr.log_pattern(r"(")
    ann = {pr.ANN_STEP: "60", pr.ANN_TOTAL: "100", pr.ANN_CHECKPOINT: "55"}
    found = pr.from_annotations(ann)
    assert found == Progress(60, 100, 55, "annotation")
    assert found.fraction == 0.6 and found.kept_fraction == 0.55 and found.lost_steps == 5
    assert pr.from_annotations({pr.ANN_STEP: "lots"}) is None
    assert pr.from_annotations({pr.ANN_STEP: "-3"}) is None
    # data-parallel workers: the furthest report wins, whatever the order
    a, b = Progress(10, 100, 5), Progress(12, 100, 10)
    assert a.furthest(b) == b and b.furthest(a) == b


def test_a_sample_carries_progress_and_a_record_keeps_it() -> None:
    metric = PodMetric(node="n", namespace="ns", pod="p", pod_uid="u")
    assert metric.progress() is None
    carried = PodMetric.model_validate_json(
        metric.with_progress(Progress(7, 10, 5, "log")).model_dump_json()
    )
    assert carried.progress() == Progress(7, 10, 5, "log")
    owner = {"metadata": {"annotations": {**Progress(60, 100, 55).annotations(),
                                          pr.ANN_PREEMPTIONS: "1"}}}  # fmt: skip
    assert progress_fields(owner) == {
        "progress_step": 60, "total_steps": 100, "checkpoint_step": 55, "preemptions": 1,
    }  # fmt: skip


async def test_the_agent_prefers_metrics_then_logs_then_annotations(tmp_path: Path) -> None:
    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.port == 9100:
            return httpx.Response(200, text="alnair_train_step 50\nalnair_train_total_steps 80\n")
        return httpx.Response(503)

    client = httpx.AsyncClient(transport=httpx.MockTransport(serve))
    logs = tmp_path / "ml_job-0_u1" / "main"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("step 30/80\ncheckpoint saved at step 25\n")
    reader = ProgressReader(tmp_path, frozenset({"ml"}), client=client)
    pod = {
        "metadata": {"namespace": "ml", "name": "job-0", "uid": "u1", "annotations": {
            pr.ANN_METRICS: "9100", pr.ANN_STEP: "10", pr.ANN_TOTAL: "80"}},
        "status": {"podIP": "10.1.2.3"},
    }  # fmt: skip
    spec = ProgressSpec.of(pod)
    assert metrics_url(spec) == "http://10.1.2.3:9100/metrics"
    assert await reader.read(spec) == Progress(50, 80, None, "metric")
    broken = ProgressSpec.of({**pod, "metadata": {**pod["metadata"], "annotations": {
        pr.ANN_METRICS: "9200/stats", pr.ANN_STEP: "10", pr.ANN_TOTAL: "80"}}})  # fmt: skip
    assert await reader.read(broken) == Progress(30, 80, 25, "log")  # the metric failed
    elsewhere = ProgressSpec.of({**pod, "metadata": {**pod["metadata"], "namespace": "other"}})
    assert await reader.read(elsewhere) == Progress(50, 80, None, "metric")
    quiet = ProgressSpec.of({"metadata": {"namespace": "other", "name": "x", "uid": "u2",
                                          "annotations": {pr.ANN_STEP: "10"}}})  # fmt: skip
    assert await reader.read(quiet) == Progress(10, None, None, "annotation")
    # a namespace not opted in: its log is never read, even when the file is there
    assert await ProgressReader(tmp_path, frozenset(), client=client).read(broken) == Progress(
        10, 80, None, "annotation"
    )
    await reader.close()


def test_the_queue_plans_a_resumed_job_with_what_its_checkpoint_left() -> None:
    full = {"V100": RuntimeEstimate(1000.0, 1200.0), "K80": RuntimeEstimate(3000.0, 3600.0)}
    # Stopped at 60%, checkpointed at 60%: waiting, it is planned with the 40% left.
    waiting = planned_progress(Progress(60, 100, 60).annotations(), full, None)
    assert waiting.kept == 0.6 and waiting.lost_s == 0.0
    left = remaining(full, waiting.kept)
    assert left["V100"].expected_s == pytest.approx(400.0)
    assert left["K80"].upper_s == pytest.approx(1440.0)
    assert waiting.describe()["kept_pct"] == 60.0  # type: ignore[index]
    # Running again from step 60, now at 80 with the last checkpoint at 70: it was planned
    # from its start with 40% left, and a stop would lose 10 steps (100 s on a V100).
    ann = {**Progress(80, 100, 70).annotations(), ANN_RESUMED_STEP: "60"}
    running = planned_progress(ann, full, "V100")
    assert running.kept == 0.6 and running.lost_s == pytest.approx(100.0)
    assert planned_progress({}, full, "V100").kept == 0.0
    assert remaining(full, 0.0) == full
