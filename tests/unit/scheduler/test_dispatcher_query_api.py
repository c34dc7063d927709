"""What the dispatcher's query API says a queue lends (`query_api.lent`)."""

from __future__ import annotations

from types import SimpleNamespace

from alnair.scheduler.dispatcher.core import QueueState
from alnair.scheduler.dispatcher.query_api import QUERY_API, lent
from alnair.scheduler.live.cache import SchedulerCache
from alnair.scheduler.query_api import node_gpus
from alnair.scheduler.queueing.model import ClusterQueueSpec, FlavorQuota
from scheduler_support import bound, node


def _state(name: str, nominal: int, lending: int | None = None) -> QueueState:
    quota = {"V100M32": FlavorQuota(nominal, lending_limit=lending)}
    return QueueState(ClusterQueueSpec(name, quota, cohort="c"), None)


def _usage(used: int) -> dict[str, object]:
    return {"flavorsUsage": [{"name": "V100M32", "total": used, "borrowed": 0}]}


def test_what_a_cohort_borrows_is_lent_by_the_queues_with_unused_quota() -> None:
    queues = {"a": _state("a", 8), "b": _state("b", 4), "c": _state("c", 4)}
    # a runs 12 of its 8: it borrows 4, which b (idle) and c (3 unused) can lend.
    report = {"a": _usage(12), "b": _usage(0), "c": _usage(1)}
    assert lent(queues, report) == {"b": 4}
    # b lends at most 1 (its lending limit): c lends the rest.
    queues["b"] = _state("b", 4, lending=1)
    assert lent(queues, report) == {"b": 1, "c": 3}
    # Nobody borrows: nobody lends.
    assert sum(lent(queues, {"a": _usage(8)}).values()) == 0


def test_every_queued_kind_is_a_resource_of_the_query_api() -> None:
    names = {r.name for r in QUERY_API.resources}
    assert {"clusterqueues", "queuedworkloads", "jobs", "jobsets", "rayjobs"} <= names


def test_the_gpu_map_pages_by_node_name_and_summarizes_every_node() -> None:
    cache = SchedulerCache()
    for i in (3, 1, 5, 2, 4):
        cache.upsert_node(node(f"n{i}", 4))
    cache.add_bound(bound("a", "n2", 2, "0,1", "ua"))
    scheduler = SimpleNamespace(cache=cache)
    pages, after = [], ""
    while True:
        doc = node_gpus(scheduler, limit=2, after=after)  # type: ignore[arg-type]
        pages.append([n["node"] for n in doc["items"]])
        after = doc["metadata"].get("continue", "")
        if not after:
            break
    assert pages == [["n1", "n2"], ["n3", "n4"], ["n5"]]
    (summary,) = doc["summary"]
    assert (summary["nodes"], summary["gpus"], summary["usedMilli"]) == (5, 20, 2000)
    # A GPU gone bad changes the snapshot: the cached view is made again.
    cache.set_gpu_health("n5", 0, False)
    (summary,) = node_gpus(scheduler, limit=1)["summary"]  # type: ignore[arg-type]
    assert summary["unhealthy"] == 1 and summary["freeMilli"] == 17000
