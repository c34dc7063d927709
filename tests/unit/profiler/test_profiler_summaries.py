"""The agent's pod summaries: folding samples, ending runs, the bounded pending set, the spool."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from alnair.common.events import PodMetric
from alnair.profiler.agent.summaries import SPOOL_FILE, Spool, SummaryBook

POD = {
    "metadata": {
        "uid": "u1",
        "namespace": "ml",
        "name": "train-x",
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": "j1",
                "controller": True,
            }
        ],
    },
    "status": {"phase": "Running"},
}


def sample(second: int, gpu: str | None, util: float, mem: float, uid: str = "u1") -> PodMetric:
    return PodMetric(
        node="n1",
        namespace="ml",
        pod="train-x",
        pod_uid=uid,
        gpu_uuid=gpu,
        gpu_index=None if gpu is None else int(gpu[-1]),
        gpu_util_pct=util,
        gpu_mem_used_mib=mem,
        cpu_util_cores=2.0,
        mem_used_mib=100.0 + second,
        ts=datetime.fromtimestamp(1000 + second, UTC),
    )


def test_two_gpus_count_per_gpu_and_pod_series_once_per_tick() -> None:
    book = SummaryBook()
    book.pod_changed(POD)
    for t in range(3):
        book.observe(
            [sample(t, "GPU-0", 50.0, 1000.0 + t), sample(t, "GPU-1", 70.0, 900.0)], {"n1": "V100"}
        )
    (summary,) = book.end_all_but(alive=set())
    assert summary.ticks == 3
    assert summary.gpu_util_pct.count == 6 and summary.gpu_util_pct.total == 360.0
    assert summary.gpu_mem_used_mib.max == 1002.0
    assert summary.mem_used_mib.count == 3 and summary.mem_used_mib.max == 102.0
    assert summary.gpus == ["GPU-0", "GPU-1"] and summary.gpu_model == "V100"
    assert (summary.owner_kind, summary.owner_name, summary.owner_uid) == ("Job", "train", "j1")
    assert summary.first_ts.timestamp() == 1000 and summary.last_ts.timestamp() == 1002
    assert summary.event_id() == "u1.summary"
    assert list(book.pending) == ["u1"] and not book.running


def test_alive_pods_keep_running_and_finished_unsampled_pods_are_forgotten() -> None:
    book = SummaryBook()
    book.observe([sample(0, "GPU-0", 10.0, 10.0)], {})
    assert book.end_all_but(alive={"u1"}) == []
    other = {**POD, "metadata": {**POD["metadata"], "uid": "u2"}, "status": {"phase": "Succeeded"}}
    book.pod_changed(other)
    assert "u2" not in book._owners
    book.pod_changed({**POD, "metadata": {**POD["metadata"], "uid": "u3"}}, deleted=True)
    assert "u3" not in book._owners


def test_pending_is_bounded_oldest_first() -> None:
    book = SummaryBook(max_pending=2)
    for i in range(3):
        book.observe([sample(0, "GPU-0", 10.0, 10.0, uid=f"p{i}")], {})
        book.end_all_but(alive=set())
    assert list(book.pending) == ["p1", "p2"] and book.dropped == 1


def test_spool_round_trip_continues_running_runs(tmp_path: Path) -> None:
    book = SummaryBook()
    book.pod_changed(POD)
    book.observe([sample(0, "GPU-0", 40.0, 500.0), sample(0, None, 0, 0, uid="idle")], {"n1": "T4"})
    book.end_all_but(alive={"u1"})  # "idle" ended, "u1" still runs
    spool = Spool(tmp_path)
    spool.save(book, with_running=True)

    again = SummaryBook()
    assert Spool(tmp_path).load(again) == 2
    assert list(again.pending) == ["idle"]
    again.observe([sample(1, "GPU-0", 60.0, 700.0)], {})
    (summary,) = again.end_all_but(alive=set())
    assert summary.gpu_util_pct.count == 2 and summary.gpu_util_pct.total == 100.0
    assert summary.gpu_mem_used_mib.max == 700.0 and summary.ticks == 2
    assert summary.owner_uid == "j1" and summary.gpu_model == "T4"


def test_spool_without_running_and_an_unreadable_file(tmp_path: Path) -> None:
    book = SummaryBook()
    book.observe([sample(0, "GPU-0", 40.0, 500.0)], {})
    Spool(tmp_path).save(book, with_running=False)
    assert Spool(tmp_path).load(SummaryBook()) == 0
    (tmp_path / SPOOL_FILE).write_text("{torn")
    assert Spool(tmp_path).load(SummaryBook()) == 0  # logged, not fatal
    assert Spool(None).load(SummaryBook()) == 0
