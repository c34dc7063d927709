"""Kueue's queue objects read as Alnair's queues (`kueue_queues.py`), and the queues'
preemption rules over a policy's decision (`queueing.permits`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.dispatcher.kueue_queues import (
    kueue_status,
    local_queue_problem,
    parse_kueue_cluster_queue,
    priority_of,
)
from alnair.scheduler.queueing import (
    ClusterQueueSpec,
    Decisions,
    FlavorQuota,
    GpuPool,
    JobSpec,
    Preemption,
    PreemptionRules,
    QueueSnapshot,
    RunningJob,
    WaitReason,
    queue_policy,
)
from alnair.scheduler.queueing.permits import refused, within_rules
from alnair.scheduler.queueing.resources import ResourceLedger

GPU = "nvidia.com/gpu"


def flavor(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


FLAVORS = {
    "v100": flavor("v100", nodeLabels={"alnair.io/gpu-model": "V100M32"}),
    "a100": flavor("a100", nodeLabels={"alnair.io/gpu-model": "A100"}),
    "plain": flavor("plain"),
    "spot": flavor("spot"),
}


def cq(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{
            "coveredResources": [GPU],
            "flavors": [
                {"name": "v100", "resources": [{"name": GPU, "nominalQuota": 4}]},
                {"name": "a100", "resources": [{"name": GPU, "nominalQuota": "2",
                                                "borrowingLimit": 2, "lendingLimit": 1}]},
            ],
        }],
        "cohortName": "research",
    }  # fmt: skip
    body.update(spec)
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": body}  # fmt: skip


def test_a_gpu_cluster_queue_reads_as_its_models_quota() -> None:
    got = parse_kueue_cluster_queue(
        cq(fairSharing={"weight": "2"}, preemption={"reclaimWithinCohort": "Any",
                                                    "withinClusterQueue": "LowerPriority"}),
        {}, FLAVORS,
    )  # fmt: skip
    assert got.spec.name == "team-a"
    assert got.spec.cohort == "research"  # no Cohort object is needed, as in Kueue
    assert got.spec.weight == 2.0
    assert got.spec.quota == {
        "V100M32": FlavorQuota(4),
        "A100": FlavorQuota(2, borrowing_limit=2, lending_limit=1),
    }
    assert got.flavors == {"V100M32": "v100", "A100": "a100"}
    assert got.spec.preemption == PreemptionRules("LowerPriority", "Any", "Never")
    assert got.namespaces.matches({"any": "thing"})
    assert not got.hold


def test_kueue_defaults_preempt_nothing_and_a_null_selector_selects_no_namespace() -> None:
    body = cq()
    del body["spec"]["namespaceSelector"]
    got = parse_kueue_cluster_queue(body, {}, FLAVORS)
    assert got.spec.preemption == PreemptionRules("Never", "Never", "Never")
    assert not got.namespaces.matches({})
    chosen = parse_kueue_cluster_queue(
        cq(namespaceSelector={"matchLabels": {"team": "a"}}), {}, FLAVORS
    )
    assert chosen.namespaces.matches({"team": "a"})
    assert not chosen.namespaces.matches({"team": "b"})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"resourceGroups": [{"coveredResources": ["cpu", GPU], "flavors": []}]},
         "spec.resourceGroups[0].coveredResources"),
        ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "v100", "resources": [{"name": "cpu", "nominalQuota": 1}]}]}]},
         "ResourceFlavor v100 spec.nodeLabels.alnair.io/gpu-model"),
        ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "plain", "resources": [{"name": "memory", "nominalQuota": 1}]}]}]},
         "spec.resourceGroups[0].flavors[0].resources[0].name"),
        ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "plain", "resources": [{"name": "cpu", "nominalQuota": "lots"}]}]}]},
         "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"),
        ({"resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": "h100", "resources": [{"name": GPU, "nominalQuota": 1}]}]}]},
         "spec.resourceGroups[0].flavors[0].name"),
        ({"resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": "v100", "resources": [{"name": GPU, "nominalQuota": "1Gi"}]}]}]},
         "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"),
        ({"queueingStrategy": "StrictFIFO"}, "spec.queueingStrategy"),
        ({"stopPolicy": "HoldAndDrain"}, "spec.stopPolicy"),
        ({"admissionChecksStrategy": {"admissionChecks": [{"name": "x"}]}},
         "spec.admissionChecksStrategy"),
        ({"preemption": {"borrowWithinCohort": {"policy": "LowerPriority",
                                                "maxPriorityThreshold": 5}}},
         "spec.preemption.borrowWithinCohort.maxPriorityThreshold"),
        ({"cohortName": None}, "spec.resourceGroups[0].flavors[1].resources[0].borrowingLimit"),
        ({"fairSharing": {"weight": "0"}}, "spec.fairSharing.weight"),
    ],
)  # fmt: skip
def test_what_alnair_cannot_honour_is_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidValueError) as exc:
        parse_kueue_cluster_queue(cq(**change), {}, FLAVORS)
    assert exc.value.field == field


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodeLabels": {"instance-type": "gpu"}}, "ResourceFlavor v100 spec.nodeLabels"),
        ({"nodeLabels": {"alnair.io/gpu-model": "V100M32", "zone": "a"}},
         "ResourceFlavor v100 spec.nodeLabels.zone"),
        ({"nodeLabels": {"alnair.io/gpu-model": "V100M32"},
          "nodeTaints": [{"key": "spot", "effect": "NoSchedule"}]},
         "ResourceFlavor v100 spec.nodeTaints"),
    ],
)  # fmt: skip
def test_a_flavor_must_be_a_gpu_model_and_nothing_more(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidValueError) as exc:
        parse_kueue_cluster_queue(cq(), {}, {**FLAVORS, "v100": flavor("v100", **spec)})
    assert exc.value.field == field


def test_hierarchical_cohorts_and_v1beta1_objects_are_refused() -> None:
    parent = {"metadata": {"name": "research"}, "spec": {"parentName": "org"}}
    with pytest.raises(InvalidValueError) as exc:
        parse_kueue_cluster_queue(cq(), {"research": parent}, FLAVORS)
    assert exc.value.field == "Cohort research spec.parentName"
    flat = {"metadata": {"name": "research"}, "spec": {}}
    assert parse_kueue_cluster_queue(cq(), {"research": flat}, FLAVORS).spec.cohort == "research"
    old = cq()
    old["metadata"]["managedFields"] = [
        {"manager": "kubectl", "apiVersion": "kueue.x-k8s.io/v1beta1"}
    ]
    with pytest.raises(InvalidValueError, match="written as v1beta1") as exc:
        parse_kueue_cluster_queue(old, {}, FLAVORS)
    assert exc.value.field == "apiVersion"


def test_held_queues_and_priority_classes() -> None:
    assert parse_kueue_cluster_queue(cq(stopPolicy="Hold"), {}, FLAVORS).hold
    lq = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "team-a"}}
    assert local_queue_problem(lq) is None
    lq["spec"]["stopPolicy"] = "Hold"
    assert local_queue_problem(lq) == "LocalQueue ns/q is held (spec.stopPolicy: Hold)"
    classes = {"high": {"metadata": {"name": "high"}, "value": 1000}}
    assert priority_of({"kueue.x-k8s.io/priority-class": "high"}, classes) == 1000
    assert priority_of({}, classes) is None
    with pytest.raises(KeyError):
        priority_of({"kueue.x-k8s.io/priority-class": "low"}, classes)


def test_status_is_kueues_shape_per_flavor_with_borrowing_above_nominal() -> None:
    queue = parse_kueue_cluster_queue(cq(), {}, FLAVORS)
    counts = {
        "pendingWorkloads": 3,
        "admittedWorkloads": 2,
        "flavorsUsage": [{"name": "A100", "total": 3, "borrowed": 0},
                         {"name": "V100M32", "total": 4, "borrowed": 0}],
    }  # fmt: skip
    status = kueue_status(counts, queue, None, {})
    assert status["pendingWorkloads"] == 3
    assert status["admittedWorkloads"] == status["reservingWorkloads"] == 2
    assert status["flavorsUsage"] == [
        {"name": "a100", "resources": [{"name": GPU, "total": 3, "borrowed": 1}]},
        {"name": "v100", "resources": [{"name": GPU, "total": 4, "borrowed": 0}]},
    ]
    (active,) = status["conditions"]
    assert (active["type"], active["status"], active["reason"]) == ("Active", "True", "Ready")
    # an unchanged condition keeps its time, so an unchanged status is not written again
    again = kueue_status(
        counts, queue, None, {"conditions": [{**active, "lastTransitionTime": "t0"}]}
    )
    assert again["conditions"][0]["lastTransitionTime"] == "t0"
    broken = kueue_status({**counts, "flavorsUsage": []}, None, "invalid spec.x", status)
    assert broken["conditions"][0]["status"] == "False"
    assert broken["conditions"][0]["message"] == "invalid spec.x"


# --- the queues' preemption rules over a decision -------------------------------------


def _snapshot(rules: dict[str, PreemptionRules], running: list[RunningJob],
              pending: list[JobSpec]) -> QueueSnapshot:  # fmt: skip
    queues = {
        name: ClusterQueueSpec(name, {"V100M32": FlavorQuota(4)}, cohort="c", preemption=r)
        for name, r in rules.items()
    }
    return QueueSnapshot(now_s=100.0, pending=pending, running=running, queues=queues, capacity={})


def _job(jid: str, queue: str, priority: int = 0, arrival: float = 0.0) -> JobSpec:
    return JobSpec(id=jid, queue=queue, gpus=4, arrival_s=arrival, priority=priority)


@pytest.mark.parametrize(
    ("rule", "victim_priority", "victim_arrival", "allowed"),
    [
        ("Policy", 5, 0.0, True),
        ("Never", 0, 0.0, False),
        ("LowerPriority", 0, 0.0, True),
        ("LowerPriority", 1, 0.0, False),
        ("LowerOrNewerEqualPriority", 1, 50.0, True),
        ("LowerOrNewerEqualPriority", 1, 5.0, False),
    ],
)
def test_within_queue(
    rule: str, victim_priority: int, victim_arrival: float, allowed: bool
) -> None:
    victim = RunningJob(_job("v", "a", victim_priority, victim_arrival), "V100M32", 60.0)
    taker = _job("t", "a", priority=1, arrival=10.0)
    snap = _snapshot({"a": PreemptionRules(within_queue=rule)}, [victim], [taker])  # type: ignore[arg-type]
    why = refused(Preemption("v", "shorter", "t"), snap)
    assert (why is None) is allowed
    if not allowed:
        assert "preemption.withinClusterQueue" in why  # type: ignore[operator]


@pytest.mark.parametrize(
    ("rule", "borrowing", "allowed"),
    [("Any", True, True), ("Never", True, False), ("LowerPriority", True, True),
     ("Any", False, False)],
)  # fmt: skip
def test_reclaim_and_borrowing_across_queues(rule: str, borrowing: bool, allowed: bool) -> None:
    victim = RunningJob(_job("v", "b", priority=0), "V100M32", 60.0, borrowing=borrowing)
    taker = _job("t", "a", priority=1)
    rules = {"a": PreemptionRules("Never", rule, "Never"), "b": PreemptionRules()}  # type: ignore[arg-type]
    assert (
        refused(Preemption("v", "reclaim", "t"), _snapshot(rules, [victim], [taker])) is None
    ) is allowed


def test_refused_preemptions_leave_the_taker_waiting_on_the_rule_and_moves_stay() -> None:
    victim = RunningJob(_job("v", "a"), "V100M32", 60.0)
    mover = RunningJob(_job("m", "a"), "V100M32", 60.0)
    taker = _job("t", "a")
    snap = _snapshot({"a": PreemptionRules(within_queue="Never")}, [victim, mover], [taker])
    decisions = Decisions(
        preemptions=(Preemption("v", "shorter", "t"), Preemption("m", "moves", "m")),
        waiting={"t": WaitReason("capacity", "waits for v")},
    )
    out = within_rules(decisions, snap)
    assert [p.job_id for p in out.preemptions] == ["m"]
    assert out.waiting["t"].kind == "capacity"
    assert "withinClusterQueue is Never" in out.waiting["t"].message
    allowed = _snapshot({"a": PreemptionRules()}, [victim, mover], [taker])
    assert within_rules(decisions, allowed) is decisions


# --- priority orders every policy, and lets a higher priority displace a lower one ----------


def _pool_snapshot(running: list[RunningJob], pending: list[JobSpec]) -> QueueSnapshot:
    used = sum(r.gpus for r in running)
    return QueueSnapshot(
        now_s=100.0,
        pending=pending,
        running=running,
        queues={"a": ClusterQueueSpec("a", {"V100M32": FlavorQuota(8)})},
        capacity={"V100M32": GpuPool(total=8, free=8 - used, memory_mib=32768.0)},
    )


@pytest.mark.parametrize("policy", ["fifo", "sjf", "drf", "alnair"])
def test_the_higher_priority_is_admitted_first(policy: str) -> None:
    early = JobSpec(id="early", queue="a", gpus=8, arrival_s=0.0, priority=0)
    late = JobSpec(id="late", queue="a", gpus=8, arrival_s=50.0, priority=10)
    decisions = queue_policy(policy).decide(_pool_snapshot([], [early, late]))
    assert [a.job_id for a in decisions.admissions] == ["late"]


def test_a_higher_priority_displaces_a_lower_priority_run_of_unknown_runtime() -> None:
    run = RunningJob(JobSpec(id="low", queue="a", gpus=8, arrival_s=0.0), "V100M32", 10.0)
    high = JobSpec(id="high", queue="a", gpus=8, arrival_s=50.0, priority=10)
    same = JobSpec(id="same", queue="a", gpus=8, arrival_s=50.0)
    alnair = queue_policy("alnair")
    decided = alnair.decide(_pool_snapshot([run], [high]))
    assert [(p.job_id, p.for_job_id) for p in decided.preemptions] == [("low", "high")]
    # an equal priority does not: a run of unknown runtime is never displaced by the order
    assert alnair.decide(_pool_snapshot([run], [same])).preemptions == ()


def test_a_reclaim_is_made_for_the_taker_whose_rules_allow_it() -> None:
    """Two takers want a borrower's GPUs: the borrower's own queue may not preempt it
    (withinClusterQueue Never), the lender may (reclaimWithinCohort Any): the preemption is
    made for the lender, whichever comes first in the plan."""
    quota = {"V100M32": FlavorQuota(4)}
    queues = {
        "a": ClusterQueueSpec("a", quota, cohort="c", preemption=PreemptionRules("Never", "Any", "Never")),
        "b": ClusterQueueSpec("b", {"V100M32": FlavorQuota(2)}, cohort="c",
                              preemption=PreemptionRules("Never", "Never", "Never")),
    }  # fmt: skip
    borrower = RunningJob(JobSpec(id="b1", queue="b", gpus=4, arrival_s=0.0), "V100M32", 10.0, True)
    mine = JobSpec(id="b2", queue="b", gpus=2, arrival_s=1.0)
    lender = JobSpec(id="a1", queue="a", gpus=4, arrival_s=2.0)
    snap = QueueSnapshot(
        now_s=100.0, pending=[mine, lender], running=[borrower], queues=queues,
        capacity={"V100M32": GpuPool(total=16, free=12, memory_mib=32768.0)},
    )  # fmt: skip
    decided = within_rules(queue_policy("alnair").decide(snap), snap)
    assert [(p.job_id, p.for_job_id) for p in decided.preemptions] == [("b1", "a1")]


def test_quota_over_cpu_and_memory_reads_as_resource_groups() -> None:
    body = cq(resourceGroups=[
        {"coveredResources": [GPU], "flavors": [
            {"name": "v100", "resources": [{"name": GPU, "nominalQuota": 4}]}]},
        {"coveredResources": ["cpu", "memory"], "flavors": [
            {"name": "plain", "resources": [{"name": "cpu", "nominalQuota": "300m"},
                                            {"name": "memory", "nominalQuota": "300Mi",
                                             "lendingLimit": "100Mi"}]},
            {"name": "spot", "resources": [{"name": "cpu", "nominalQuota": 8},
                                           {"name": "memory", "nominalQuota": "8Gi"}]}]},
    ])  # fmt: skip
    got = parse_kueue_cluster_queue(body, {}, FLAVORS)
    assert got.spec.quota == {"V100M32": FlavorQuota(4)}
    (group,) = got.resources.groups
    assert group.covered == ("cpu", "memory")
    assert [f.name for f in group.flavors] == ["plain", "spot"]
    assert group.flavors[0].quotas["cpu"].nominal == Decimal("0.3")
    assert group.flavors[0].quotas["memory"].lending_limit == 100 * 2**20
    ledger = ResourceLedger({"team-a": got.resources})
    asked = {"cpu": Decimal("0.15"), "memory": Decimal(300 * 2**20)}
    assert ledger.assign("team-a", asked) == {"cpu": "plain", "memory": "plain"}
    used = {"flavorsUsage": [], "pendingWorkloads": 0, "admittedWorkloads": 1}
    ledger.take("team-a", {"cpu": "plain", "memory": "plain"}, asked)
    status = kueue_status(used, got, None, {}, ledger)
    assert status["flavorsUsage"] == [{"name": "plain", "resources": [
        {"name": "cpu", "total": "0.15", "borrowed": "0"},
        {"name": "memory", "total": str(300 * 2**20), "borrowed": "0"},
    ]}]  # fmt: skip


def test_flavor_preferences_are_read_not_applied_and_said() -> None:
    got = parse_kueue_cluster_queue(
        cq(flavorFungibility={"whenCanPreempt": "MayStopSearch", "whenCanBorrow": "MayStopSearch"}),
        {}, FLAVORS,
    )  # fmt: skip
    (note,) = got.notes
    assert note.startswith("spec.flavorFungibility.whenCanPreempt='MayStopSearch' is not applied")
    assert parse_kueue_cluster_queue(cq(), {}, FLAVORS).notes == ()
