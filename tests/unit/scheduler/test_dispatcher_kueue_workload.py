"""Kueue's `Workload` objects as the dispatcher reads and writes them (`kueue_workload.py`), and
preemption for quota over CPU and memory by the queues' rules (`plain_preemption.py`)."""

from __future__ import annotations

from decimal import Decimal as D
from typing import Any

import pytest

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError
from alnair.common.kube import Obj
from alnair.scheduler.dispatcher import kueue_workload as kw
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_TYPE,
    ANN_FLAVORS,
    ANN_STOPPING,
    NO_GPU,
    Workload,
)
from alnair.scheduler.dispatcher.plain_order import kueue_order
from alnair.scheduler.dispatcher.plain_preemption import Charge, victims
from alnair.scheduler.queueing.model import PreemptionRules
from alnair.scheduler.queueing.resources import (
    FlavorQuotas,
    QueueResources,
    ResourceGroup,
    ResourceLedger,
    ResourceQuota,
)

T0 = "2026-11-27T06:00:00Z"


def workload(name: str = "w", *, cpu: str = "1", gpus: int = 0, count: int = 1, **spec: Any) -> Obj:
    requests = {"cpu": cpu, **({r.GPU: str(gpus)} if gpus else {})}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "7",
                     "generation": 1, "creationTimestamp": T0},
        "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": count, "template": {
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}}],
            **spec},
    }  # fmt: skip


def condition(kind: str, status: str, when: str = T0) -> Obj:
    return {"type": kind, "status": status, "reason": "R", "message": "",
            "lastTransitionTime": when}  # fmt: skip


def no_lookup(*_: Any) -> Obj | None:
    return None


def parsed(obj: Obj) -> Workload:
    return kw.parse_kueue_workload(kw.resolve_workload(obj, no_lookup), 0.0)


def test_a_workload_is_queued_by_its_queue_name_unless_a_controller_owns_it() -> None:
    assert kw.workload_queued(workload())
    owned = workload()
    owned["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "x",
                                             "apiVersion": "batch/v1", "controller": True}]  # fmt: skip
    assert not kw.workload_queued(owned)
    assert not kw.workload_queued(workload(queueName=""))


def test_what_a_workload_asks_and_whether_it_is_admitted_come_from_its_spec_and_status() -> None:
    wl = parsed(workload(cpu="500m", count=3, priority=7))
    assert wl.request.gpus == 0 and wl.request.pods == 3 and wl.held
    assert wl.local_queue == "lq" and kw.priority(wl) == 7
    gpu = parsed(workload(gpus=2, count=2))
    assert gpu.request.gpus == 4 and gpu.request.gpus_per_pod == 2
    # An admission is read from the status alone: annotations of those names are not trusted.
    forged = workload()
    forged["metadata"]["annotations"] = {ANN_ADMITTED_TYPE: "V100M32"}
    assert parsed(forged).held
    admitted = workload()
    admitted["status"] = {
        "conditions": [condition("QuotaReserved", "True"), condition("Admitted", "True")],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": "1"}}]},
    }  # fmt: skip
    wl = parsed(admitted)
    assert not wl.held and wl.admitted_type == NO_GPU
    assert wl.annotations[ANN_FLAVORS] == '{"cpu": "default"}'
    assert ANN_STOPPING not in wl.annotations
    admitted["status"]["conditions"].append(condition("Evicted", "True"))
    assert parsed(admitted).annotations[ANN_STOPPING] == "true"
    # The GPU model is the model of the flavor assigned to GPUs.
    admitted["status"]["admission"]["podSetAssignments"][0]["flavors"][r.GPU] = "v100"
    flavor = {"metadata": {"name": "v100"}, "spec": {"nodeLabels": {r.LABEL_GPU_MODEL: "V100M32"}}}
    seen = kw.resolve_workload(admitted, lambda *_: flavor)
    assert kw.parse_kueue_workload(seen, 0.0).admitted_type == "V100M32"


def test_a_finished_workload_is_said_so_by_its_finished_condition() -> None:
    obj = workload()
    assert kw.workload_finished(obj) is None
    obj["status"] = {"conditions": [{**condition("Finished", "True"), "reason": "Succeeded"}]}
    assert kw.workload_finished(obj) == "Succeeded"


def test_bad_pod_sets_are_named() -> None:
    with pytest.raises(InvalidValueError, match=r"spec.podSets"):
        kw.parse_kueue_workload(workload(podSets=[]), 0.0)
    bad = workload()
    bad["spec"]["podSets"][0]["count"] = -1
    with pytest.raises(InvalidValueError, match=r"spec.podSets\[0\].count"):
        kw.parse_kueue_workload(bad, 0.0)


def test_admission_eviction_and_pending_are_written_as_kueue_writes_them() -> None:
    obj = workload(cpu="250m", count=4)
    obj["status"] = {"conditions": [{**condition("QuotaReserved", "False"), "reason": "Pending",
                                     "message": "quota: short"},
                                    condition("Evicted", "True")]}  # fmt: skip
    wl = parsed(obj)
    status = kw.admitted_status(wl, "cq", {"cpu": "default"}, "admitted by ClusterQueue cq")
    assert status["admission"] == {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "main", "count": 4, "flavors": {"cpu": "default"},
         "resourceUsage": {"cpu": "1"}}]}  # fmt: skip
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["QuotaReserved"]["status"] == "True" and conds["Admitted"]["status"] == "True"
    assert conds["Evicted"]["status"] == "False"  # readmitted: no longer evicted
    assert all(c["observedGeneration"] == 1 for c in conds.values())
    # Waiting: said once per reason, in QuotaReserved False / Pending.
    assert kw.pending_status(wl, "quota: short") is None
    pending = kw.pending_status(wl, "quota: shorter")
    assert pending is not None
    (reserved,) = [c for c in pending["conditions"] if c["type"] == "QuotaReserved"]
    assert reserved["message"] == "quota: shorter" and reserved["lastTransitionTime"] == T0
    evicted = {c["type"]: c for c in kw.evicted_status(wl, "Preempted", "for x")["conditions"]}
    assert evicted["Evicted"]["reason"] == "Preempted" and evicted["Preempted"]["status"] == "True"


# --- preemption for CPU quota -----------------------------------------------------------------


def ledger(cohort: str | None = "co", nominal: str = "4") -> ResourceLedger:
    def q(name: str) -> QueueResources:
        group = ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(D(nominal))}),))
        return QueueResources((group,), cohort)

    return ResourceLedger({"a": q("a"), "b": q("b")})


def charge(lg: ResourceLedger, queue: str, name: str, cpu: int, prio: int, at: float,
           stopping: bool = False) -> Charge:  # fmt: skip
    wl = parsed(workload(name, cpu=str(cpu), priority=prio))
    c = Charge(queue, wl, {"cpu": "f"}, {"cpu": D(cpu)}, admitted_s=at, created_s=at,
               stopping=stopping)  # fmt: skip
    lg.take(queue, c.assignment, c.asked)
    return c


def pick(lg: ResourceLedger, charges: list[Charge], cpu: int, prio: int, queue: str = "a",
         **rules: Any) -> list[str] | None:  # fmt: skip
    wl = parsed(workload("new", cpu=str(cpu), priority=prio))
    before = lg.usage(queue, "f", "cpu")
    out = victims(wl, queue, {"cpu": D(cpu)}, lg, charges, rules=PreemptionRules(**rules),
                  cohort_of=lambda q: "co", priority=kw.priority, created_s=100.0)  # fmt: skip
    assert lg.usage(queue, "f", "cpu") == before  # the ledger is left as it was
    return None if out is None else [c.wl.name for c in out]


def test_lower_priority_in_the_queue_is_preempted_the_fewest_and_newest_first() -> None:
    lg = ledger(cohort=None)
    charges = [charge(lg, "a", "old", 1, 1, 1.0), charge(lg, "a", "new1", 1, 1, 2.0),
               charge(lg, "a", "big", 2, 5, 3.0)]  # fmt: skip
    # 4 of 4 used: a 2-CPU workload of priority 3 needs two of the 1-CPU ones (not "big", 5).
    assert pick(lg, charges, 2, 3, within_queue="LowerPriority") == ["new1", "old"]
    # Only one CPU needed: the most recently admitted of the lowest priority.
    assert pick(lg, charges, 1, 3, within_queue="LowerPriority") == ["new1"]
    # Never: nothing; nor for a priority no higher than theirs.
    assert pick(lg, charges, 1, 3, within_queue="Never") is None
    assert pick(lg, charges, 1, 1, within_queue="LowerPriority") is None
    # Workloads already stopping make the room: wait for them, preempt nothing more.
    charges[1] = charge(ledger(cohort=None), "a", "new1", 1, 1, 2.0, stopping=True)
    assert pick(lg, charges, 1, 3, within_queue="LowerPriority") == []


def test_quota_owed_is_reclaimed_from_borrowers_of_the_cohort_only() -> None:
    lg = ledger()
    # b borrows 3 of a's quota (7 of its 4; the cohort has 1 left): a may take back what it
    # is owed, the most recently admitted first.
    charges = [charge(lg, "b", f"b{i}", 1, 9, float(i)) for i in range(7)]
    assert pick(lg, charges, 3, 1, reclaim="Any") == ["b6", "b5"]
    assert pick(lg, charges, 3, 1, reclaim="LowerPriority") is None  # theirs is higher
    assert pick(lg, charges, 3, 1, reclaim="Never") is None
    # Beyond its own nominal quota it is not owed anything: no reclaim.
    assert pick(lg, charges, 5, 1, reclaim="Any") is None


def test_a_borrower_is_never_taken_below_its_own_quota() -> None:
    """Reclaiming stops at a borrower's nominal quota: taken further, it would be owed quota
    in turn and take it back (two queues preempting each other for ever)."""

    def q() -> QueueResources:
        group = ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(D(4))}),))
        return QueueResources((group,), "co")

    lg = ResourceLedger({"a": q(), "b": q(), "c": q()})
    # b and c each use 6 of their 4: the cohort's 12 are all used; b's are the newest.
    charges = [charge(lg, "c", f"c{i}", 2, 9, float(i)) for i in range(3)]
    charges += [charge(lg, "b", f"b{i}", 2, 9, 10.0 + i) for i in range(3)]
    # a is owed 4: b gives back what it borrows (one), then c (b is within its own then).
    assert pick(lg, charges, 4, 1, reclaim="Any") == ["b2", "c2"]


def test_workloads_are_tried_in_kueues_order_heads_owed_quota_first() -> None:
    """Each queue's workloads by priority, then arrival; among the queues' heads, those that
    fit their own queue's quota first (judged after what was admitted before them), then
    priority, then arrival."""
    nominal = {"a": 20, "b": 20}
    used = {"a": 15, "b": 0}
    wls = {
        "a-large": (parsed(workload("a-large", cpu="20", priority=200)), "a"),
        "a-small": (parsed(workload("a-small", cpu="1", priority=50)), "a"),
        "b-medium": (parsed(workload("b-medium", cpu="5", priority=100)), "b"),
        "b-small": (parsed(workload("b-small", cpu="1", priority=50)), "b"),
        "b-small-2": (parsed(workload("b-small-2", cpu="1", priority=50)), "b"),
    }
    arrival = {"a-large": "3", "a-small": "1", "b-medium": "4", "b-small": "2", "b-small-2": "5"}

    def cpu(wl: Workload) -> int:
        return int(wl.obj["spec"]["podSets"][0]["template"]["spec"]["containers"][0][
            "resources"]["requests"]["cpu"])  # fmt: skip

    tried = []
    for wl, queue in kw_order(list(wls.values()), nominal, used, cpu, arrival):
        tried.append(wl.name)
        used[queue] += cpu(wl)  # each one admitted
    # a's large (its queue's head, borrowing) waits behind b's medium (owed); a's small is
    # behind a's large whatever it would fit; b's medium then b's smalls stay owed quota until
    # b holds 20.
    assert tried == ["b-medium", "b-small", "b-small-2", "a-large", "a-small"]
    used.update(a=0, b=16)
    tried = []
    for wl, queue in kw_order(list(wls.values()), nominal, used, cpu, arrival):
        tried.append(wl.name)
        used[queue] += cpu(wl)
    # a is empty: its large fits its own quota and goes first. Then every head borrows: b's
    # medium by priority, then the smalls by arrival across the queues.
    assert tried == ["a-large", "b-medium", "a-small", "b-small", "b-small-2"]


def test_a_head_the_caller_knows_will_wait_is_yielded_without_being_judged() -> None:
    """A workload whose shape already failed in this pass (`settled`) comes out as soon as it
    is its queue's head, and whether it borrows is never asked: it takes nothing, so where it
    comes changes nothing for the others, and thousands of them cost no heap work."""
    nominal, used = {"a": 20, "b": 20}, {"a": 15, "b": 0}
    wls = [
        (parsed(workload("a-large", cpu="20", priority=200)), "a"),
        (parsed(workload("a-large-2", cpu="20", priority=200)), "a"),
        (parsed(workload("a-small", cpu="1", priority=50)), "a"),
        (parsed(workload("b-small", cpu="1", priority=50)), "b"),
    ]
    arrival = {"a-large": "1", "a-large-2": "2", "a-small": "3", "b-small": "4"}

    def cpu(wl: Workload) -> int:
        return int(wl.obj["spec"]["podSets"][0]["template"]["spec"]["containers"][0][
            "resources"]["requests"]["cpu"])  # fmt: skip

    short: set[tuple[str, int]] = set()
    judged: list[str] = []

    def borrows(wl: Workload, q: str) -> bool:
        judged.append(wl.name)
        return used[q] + cpu(wl) > nominal[q]

    tried = []
    for wl, queue in kueue_order(
        wls, borrows=borrows, rank=lambda wl: (-kw.priority(wl), arrival[wl.name], wl.key),
        settled=lambda wl, q: (q, cpu(wl)) in short,
    ):  # fmt: skip
        tried.append(wl.name)
        if used[queue] + cpu(wl) > nominal[queue] + 2:  # the cohort lends 2: a's large waits
            short.add((queue, cpu(wl)))
        else:
            used[queue] += cpu(wl)
    # b's small (owed) first; a's large borrows, does not fit, and its twin follows it at
    # once, never judged; then a's small, judged as a's head.
    assert tried == ["b-small", "a-large", "a-large-2", "a-small"]
    assert "a-large-2" not in judged and judged.count("a-small") == 1


def kw_order(
    waiting: list[tuple[Workload, str]],
    nominal: dict[str, int],
    used: dict[str, int],
    cpu: Any,
    arrival: dict[str, str],
) -> Any:
    return kueue_order(
        waiting,
        borrows=lambda wl, q: used[q] + cpu(wl) > nominal[q],
        rank=lambda wl: (-kw.priority(wl), arrival[wl.name], wl.key),
    )
