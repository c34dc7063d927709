"""How the aggregator reads owners: completion, GPUs asked for, controller references."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common import resources as res
from alnair.profiler.aggregator.owners import controller_of, finished, template_gpus
from alnair.profiler.aggregator.store import profile_from_hash


def job(conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j"}, "status": {"conditions": conditions or [], **status}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (job(), None),
        (job([{"type": "Complete", "status": "False"}]), None),
        # Newer Jobs set SuccessCriteriaMet before Complete: not final until Complete.
        (job([{"type": "SuccessCriteriaMet", "status": "True"}]), None),
        (
            job(
                [
                    {
                        "type": "Complete",
                        "status": "True",
                        "lastTransitionTime": "2026-01-01T00:01:40Z",
                    }
                ],
                completionTime="2026-01-01T00:01:39Z",
            ),
            ("succeeded", 1767225699.0),
        ),
        (
            job(
                [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}]
            ),
            ("failed", 1767225610.0),
        ),
        ({"status": {"phase": "Succeeded"}}, ("succeeded", None)),  # a CRD with a phase
        ({"status": {"phase": "Failed"}}, ("failed", None)),
        ({"status": {"phase": "Running"}}, None),
        ({}, None),
    ],
)
def test_finished(obj: dict[str, Any], expected: tuple[str, float | None] | None) -> None:
    assert finished(obj) == expected


def test_template_gpus_times_parallelism() -> None:
    container = {"resources": {"limits": {res.GPU: "2"}}}
    spec = {
        "parallelism": 3,
        "template": {"spec": {"containers": [container, {"name": "sidecar"}]}},
    }
    assert template_gpus({"spec": spec}) == 6
    sts = {
        "spec": {
            "replicas": 4,
            "template": {"spec": {"containers": [{"resources": {"requests": {res.GPU: 1}}}]}},
        }
    }
    assert template_gpus(sts) == 4
    assert template_gpus({"spec": {}}) == 0


def test_controller_reference_preferred_single_reference_accepted() -> None:
    ctrl = {"kind": "StatefulSet", "name": "w", "controller": True}
    other = {"kind": "ConfigMap", "name": "x"}
    assert controller_of({"metadata": {"ownerReferences": [other, ctrl]}}) == ctrl
    assert controller_of({"metadata": {"ownerReferences": [other]}}) == other
    assert controller_of({"metadata": {"ownerReferences": [other, other]}}) is None
    assert controller_of({"metadata": {}}) is None


def test_profile_from_redis_hash() -> None:
    fields = {
        "gpu_util_pct:count": "4",
        "gpu_util_pct:sum": "300",
        "gpu_util_pct:max": "95.5",
        "cpu_util_cores:count": "2",
        "cpu_util_cores:sum": "5",
        "cpu_util_cores:max": "3",
        "first_ts": "10",
    }
    profile = profile_from_hash(fields)
    assert profile.get("gpu_util_pct").mean == 75.0
    assert profile.get("gpu_util_pct").max == 95.5
    assert profile.get("cpu_util_cores").mean == 2.5
    assert profile.get("mem_used_mib").count == 0
