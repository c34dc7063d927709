"""PodDisruptionBudgets as preemption sees them (policy/v1).

Preemption may still evict a pod that a budget protects, as upstream does when nothing else
makes room, but it prefers not to: `violations` tells, for victims taken in a given order,
which of them would take a budget below zero allowed disruptions. A budget applies to the pods
of its namespace that its `selector` matches; an empty selector (`{}`) matches every pod of the
namespace and a missing one matches none (policy/v1 semantics). The allowance is the budget's
`status.disruptionsAllowed`, which the disruption controller of kube-controller-manager keeps;
a budget it has not counted yet allows nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from alnair.common.kube import Obj
from alnair.scheduler.cluster.selectors import LabelSelector


@dataclass(frozen=True, slots=True)
class Budget:
    namespace: str
    selector: LabelSelector
    allowed: int

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and self.selector.matches(labels)


def parse_budget(pdb: Obj) -> Budget | None:
    """The budget of a PodDisruptionBudget object, or None when its selector matches nothing."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return None
    return Budget(
        namespace=pdb["metadata"].get("namespace", "default"),
        selector=LabelSelector.parse(selector),
        allowed=int((pdb.get("status") or {}).get("disruptionsAllowed") or 0),
    )


class DisruptionBudgets:
    """The cluster's budgets by `<namespace>/<name>`, fed by the PDB informer."""

    def __init__(self) -> None:
        self._budgets: dict[str, Budget] = {}

    def upsert(self, pdb: Obj) -> None:
        key = f"{pdb['metadata'].get('namespace', 'default')}/{pdb['metadata']['name']}"
        budget = parse_budget(pdb)
        if budget is None:
            self._budgets.pop(key, None)
        else:
            self._budgets[key] = budget

    def delete(self, pdb: Obj) -> None:
        self._budgets.pop(
            f"{pdb['metadata'].get('namespace', 'default')}/{pdb['metadata']['name']}", None
        )

    def __len__(self) -> int:
        return len(self._budgets)

    def violations(self, victims: Iterable[tuple[str, str, Mapping[str, str]]]) -> set[str]:
        """Keys of the victims, given as (key, namespace, labels) in eviction order, whose
        eviction would take some budget below zero allowed disruptions."""
        left = {key: b.allowed for key, b in self._budgets.items()}
        violating: set[str] = set()
        if not left:
            return violating
        for victim_key, namespace, labels in victims:
            for key, budget in self._budgets.items():
                if budget.selects(namespace, labels):
                    left[key] -= 1
                    if left[key] < 0:
                        violating.add(victim_key)
        return violating
