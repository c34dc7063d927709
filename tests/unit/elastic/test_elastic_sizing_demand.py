"""Pending demand that competes for an elastic job's GPUs: only pods that may use its nodes."""

from __future__ import annotations

from typing import Any

from alnair.common import resources as r
from alnair.elastic.sizing import pending_demand_gpus


def pod(name: str, gpus: int, selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": {
            "nodeSelector": selector or {},
            "containers": [{"resources": {"limits": {r.GPU: str(gpus)}}}],
        },
        "status": {"phase": "Pending"},
    }


def test_pods_pinned_to_other_nodes_do_not_hold_back_growth() -> None:
    nodes = [{"metadata": {"name": "n1", "labels": {"pool": "a"}}}]
    pods = [pod("here", 2, {"pool": "a"}), pod("anywhere", 1), pod("elsewhere", 4, {"pool": "b"})]
    assert pending_demand_gpus(pods, ("ml", "ej"), 0, nodes) == 3
    assert pending_demand_gpus(pods, ("ml", "ej"), 0) == 7  # no nodes given: all of them
