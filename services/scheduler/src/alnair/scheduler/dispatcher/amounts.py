"""What pods charge against quota, in the API server's vocabulary (`requests.X`, `limits.X`):
shared by the namespace ResourceQuota check (`resource_quota.py`) and the Kueue Workload
adapter's admission record (`kueue_workload.py`)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from alnair.common import resources as res
from alnair.common.kube import Obj

Amounts = dict[str, Decimal]


def add(into: Amounts, name: str, amount: Decimal) -> None:
    into[name] = into.get(name, Decimal(0)) + amount


def pod_amounts(template: Obj, where: str) -> Amounts:
    """One pod's charge against a quota (`requests.X`, `limits.X`), as the API server counts
    it: containers summed, an init container counted when it asks more than they do."""
    spec = template.get("spec") or {}

    def charge(containers: Iterable[Obj], field: str) -> list[Amounts]:
        out = []
        for c, container in enumerate(containers):
            reqs = container.get("resources") or {}
            limits = reqs.get("limits") or {}
            requests = {**limits, **(reqs.get("requests") or {})}  # limits default requests
            one: Amounts = {}
            for kind, amounts in (("requests", requests), ("limits", limits)):
                for name, q in amounts.items():
                    at = f"{where}.{field}[{c}].resources.{kind}.{name}".lstrip(".")
                    add(one, f"{kind}.{name}", res.parse_quantity(q, at))
            out.append(one)
        return out

    total: Amounts = {}
    for one in charge(spec.get("containers") or [], "spec.containers"):
        for name, amount in one.items():
            add(total, name, amount)
    for one in charge(spec.get("initContainers") or [], "spec.initContainers"):
        for name, amount in one.items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total
