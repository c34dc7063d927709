"""What the dispatcher counts on its queues and says about a workload, as pure functions: the
ClusterQueue status in Kueue's fields, LocalQueue counts, the pods-ready backoff and the
explanation of a queued workload."""

from __future__ import annotations

from typing import Any

from alnair.common import resources as r
from alnair.scheduler.dispatcher.core import QueueState
from alnair.scheduler.dispatcher.explain import explanation, queue_descriptions
from alnair.scheduler.dispatcher.parsing import parse_cluster_queue, parse_workload
from alnair.scheduler.dispatcher.queue_status import (
    cluster_queue_statuses,
    local_queue_statuses,
)
from alnair.scheduler.dispatcher.writing import JobState
from alnair.scheduler.queueing import (
    Admission,
    Decisions,
    JobSpec,
    QueueSnapshot,
    RunningJob,
    WaitReason,
)


def _named(name: str) -> dict[str, Any]:
    """A ClusterQueue of 4 V100M32 in cohort `pool`."""
    flavor = {"name": "V100M32", "resources": [{"name": r.GPU, "nominalQuota": 4}]}
    spec = {"cohort": "pool", "resourceGroups": [{"coveredResources": [r.GPU], "flavors": [flavor]}]}  # fmt: skip
    return {"metadata": {"name": name}, "spec": spec}


def job(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A suspended 2-GPU Job `ml/j` queued in LocalQueue `team`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "j", "namespace": "ml", "uid": "u1", "resourceVersion": "1",
            "labels": {"alnair.io/queue-name": "team"}, "annotations": annotations or {},
        },
        "spec": {"suspend": True, "parallelism": 1, "template": {"spec": {
            "containers": [{"name": "c", "resources": {"limits": {r.GPU: "2"}}}]}}},
    }  # fmt: skip


def test_cluster_queue_status_counts_running_and_this_rounds_admissions() -> None:
    team, idle = _named("team"), _named("idle")
    queues = {
        "team": QueueState(parse_cluster_queue(team, {"pool"}), None),
        "idle": QueueState(None, "spec.cohort: no Cohort named 'gone' exists"),
    }
    running = [RunningJob(JobSpec("a", "team", 2, 0.0), "V100M32", 0.0, borrowing=True)]
    pending = [JobSpec("b", "team", 1, 1.0), JobSpec("c", "team", 4, 2.0)]
    snapshot = QueueSnapshot(now_s=5.0, pending=pending, running=running, queues={}, capacity={})
    decisions = Decisions(admissions=(Admission("b", "V100M32", 1),))
    status = cluster_queue_statuses(snapshot, decisions, [team, idle], queues)
    assert status["team"]["pendingWorkloads"] == 1  # c; b was admitted this round
    assert status["team"]["admittedWorkloads"] == 2
    assert (status["team"]["usedGPUs"], status["team"]["borrowedGPUs"]) == (3, 2)
    assert status["team"]["flavorsUsage"] == [{"name": "V100M32", "total": 3, "borrowed": 0}]
    assert status["team"]["conditions"][0]["status"] == "True"
    inactive = status["idle"]["conditions"][0]
    assert (inactive["status"], inactive["reason"]) == ("False", "InvalidSpec")
    assert "no Cohort named" in inactive["message"]


def test_local_queue_counts_leave_out_invalid_and_unknown_workloads() -> None:
    wl = parse_workload(job(), 60.0)  # ml/j, LocalQueue from its label
    states = {
        wl.key: JobState(wl.key),
        "gone": JobState("gone"),  # no workload known for it: not counted
    }
    counts = local_queue_statuses(states, {wl.key: wl}, admitted_now=())
    lq = f"ml/{wl.local_queue}"
    assert counts == {lq: {"pendingWorkloads": 1, "admittedWorkloads": 0}}
    assert local_queue_statuses(states, {wl.key: wl}, admitted_now={wl.key})[lq] == {
        "pendingWorkloads": 0,
        "admittedWorkloads": 1,
    }
    states[wl.key].invalid = "spec.template: no GPUs"
    assert local_queue_statuses(states, {wl.key: wl}, admitted_now=()) == {}


def test_the_explanation_of_a_waiting_and_an_admitted_workload() -> None:
    obj = job(annotations={"alnair.io/queue-state": "waiting: quota", "other.io/x": "1"})
    state = JobState("ml/j", cluster_queue="team", position=2)
    state.reason = WaitReason("quota", "ClusterQueue team has 0 of 2 V100M32 free")
    out = explanation("Job", obj, state, None, "alnair")
    assert (out["job"], out["status"], out["position"], out["policy"]) == (
        "ml/j", "waiting", 2, "alnair",
    )  # fmt: skip
    assert out["reason"] == {"kind": "quota", "message": state.reason.message}
    assert out["annotations"] == {"alnair.io/queue-state": "waiting: quota"}
    state.admitted_type = "V100M32"
    admitted = explanation("Job", obj, state, None, "alnair")
    assert (admitted["status"], admitted["position"], admitted["reason"]) == (
        "admitted", None, None,
    )  # fmt: skip
    assert explanation("Job", obj, state, "Complete", "alnair")["status"] == "complete"
    described = queue_descriptions([_named("team")], {"team": QueueState(None, "bad")})
    assert described[0]["name"] == "team" and described[0]["active"] is False
