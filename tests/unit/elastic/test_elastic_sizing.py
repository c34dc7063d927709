"""The ElasticJob spec checks and the sizing rules, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common import resources as r
from alnair.elastic.manifests import stateful_set
from alnair.elastic.sizing import WorkerShape, capacity, decide, free_gpus
from alnair.elastic.spec import JOB_LABEL, ElasticSpec, SpecError, parse


def job(gpus: int = 1, **spec: Any) -> dict[str, Any]:
    limits = {r.GPU: str(gpus)} if gpus else {}
    body: dict[str, Any] = {
        "minReplicas": 2,
        "maxReplicas": 8,
        "template": {
            "spec": {"containers": [{"name": "w", "image": "x", "resources": {"limits": limits}}]}
        },
    }
    body.update(spec)
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": body,
    }


def test_parse_defaults_and_sizes() -> None:
    s = parse(job(2, allowedSizes=[8, 2, 4]))
    assert (s.min_replicas, s.max_replicas, s.gpus_per_worker, s.cooldown_s) == (2, 8, 2, 60.0)
    assert s.sizes == (2, 4, 8)
    assert s.largest_size_at_most(7) == 4 and s.largest_size_at_most(1) is None
    assert parse(job()).sizes == tuple(range(2, 9))


def test_bad_specs_name_every_field() -> None:
    with pytest.raises(SpecError) as err:
        parse(job(0, minReplicas=5, maxReplicas=3, allowedSizes=[9], rendezvous="mpi"))
    fields = {f for f, _ in err.value.problems}
    assert {"spec.maxReplicas", "spec.allowedSizes", "spec.rendezvous"} <= fields
    assert any("asks for no GPUs" in why for _, why in err.value.problems)
    with pytest.raises(SpecError, match="gpusPerWorker"):
        parse(job(2, gpusPerWorker=4))


def decide_(spec: ElasticSpec, **kw: Any) -> tuple[int, str]:
    base: dict[str, Any] = {"current": 4, "running": 4, "capacity_workers": 4, "now_s": 100.0,
                            "last_resize_s": None}  # fmt: skip
    base.update(kw)
    d = decide(spec, **base)
    return d.target, d.reason


def test_start_grow_cooldown_and_shrink_rules() -> None:
    s = parse(job(1, allowedSizes=[2, 4, 8], scaleCooldownSeconds=30))
    # First start: the largest allowed size that fits, or the minimum pending.
    assert decide_(s, current=None, running=0, capacity_workers=7)[0] == 4
    target, why = decide_(s, current=None, running=0, capacity_workers=1)
    assert target == 2 and "waiting for the minimum" in why
    # Grow only to an allowed size, and only after the cooldown.
    assert decide_(s, capacity_workers=9)[0] == 8
    d = decide(s, current=4, running=4, capacity_workers=9, now_s=100.0, last_resize_s=90.0)
    assert d.target == 4 and d.defer_s == pytest.approx(20.0)
    # Less room never shrinks by itself ...
    assert decide_(s, capacity_workers=1)[0] == 4
    # ... workers taken do: to the largest allowed size below the survivors, or re-queue at min.
    assert decide_(s, current=8, forced=7)[0] == 4
    target, why = decide_(s, current=4, forced=1)
    assert target == 2 and "not a failure" in why
    # A shrink request is clamped to an allowed size >= min; suspension empties the job.
    assert decide_(s, current=8, request=3)[0] == 2
    assert decide_(parse(job(1, suspend=True)))[0] == 0


def node(name: str, gpus: int, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {r.GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str, gpus: int, node_name: str | None, prio: int = 0, job: str = ""
) -> dict[str, Any]:
    labels = {JOB_LABEL: job} if job else {}
    spec: dict[str, Any] = {
        "priority": prio,
        "containers": [{"resources": {"requests": {r.GPU: str(gpus)}}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": spec,
            "status": {"phase": "Running" if node_name else "Pending"}}  # fmt: skip


def test_capacity_counts_holes_and_leaves_room_for_higher_priority_pending_pods() -> None:
    nodes = [node("a", 8, pool="p"), node("b", 4, pool="p"), node("c", 8, pool="other")]
    pods = [pod("x", 3, "a"), pod("y", 4, "b"), pod("done", 8, "c")]
    shape = WorkerShape(gpus=2, node_selector={"pool": "p"}, tolerations=(), priority=10)
    assert free_gpus(nodes, pods, shape) == {"a": 5, "b": 0}
    assert capacity(shape, nodes, pods, ("ns", "j"), running=1).workers == 3
    waiting = [*pods, pod("vip", 2, None, prio=100), pod("low", 2, None, prio=1)]
    assert capacity(shape, nodes, waiting, ("ns", "j"), running=1).workers == 2
    mine = [*pods, pod("j-workers-3", 2, None, prio=10, job="j")]
    assert capacity(shape, nodes, mine, ("ns", "j"), running=1).workers == 3


def test_the_statefulset_is_parallel_gang_labelled_and_carries_the_rendezvous() -> None:
    s = parse(job(2, minReplicas=1, maxReplicas=4))
    sts = stateful_set(s, 3)
    assert sts["spec"]["podManagementPolicy"] == "Parallel" and sts["spec"]["replicas"] == 3
    tpl = sts["spec"]["template"]
    assert tpl["metadata"]["labels"][r.POD_GROUP_LABEL] == "j"
    env = {e["name"]: e["value"] for e in tpl["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"] == "1:4" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_RDZV_ENDPOINT"] == "j-rdzv.ns.svc:29400"
    horovod = stateful_set(parse(job(1, rendezvous="horovod")), 2)["spec"]["template"]["spec"]
    assert horovod["volumes"][0]["configMap"]["name"] == "j-discovery"
