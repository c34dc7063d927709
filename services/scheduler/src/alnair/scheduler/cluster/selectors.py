"""Kubernetes label selectors (`matchLabels` + `matchExpressions`), as the API defines them.

Used for the pods a PodDisruptionBudget covers and for inter-pod (anti-)affinity terms.
An empty selector matches everything; operators are In, NotIn, Exists and DoesNotExist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from alnair.common.kube import Obj

OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, frozenset[str]], ...] = ()
    """(key, operator, values); an unknown operator matches nothing."""
    nothing: bool = False
    """A null selector (where the API means "no pod"), as opposed to an empty one."""

    @classmethod
    def parse(cls, selector: Obj) -> LabelSelector:
        return cls(
            match_labels=tuple(sorted((selector.get("matchLabels") or {}).items())),
            expressions=tuple(
                (e.get("key", ""), e.get("operator", ""), frozenset(e.get("values") or ()))
                for e in selector.get("matchExpressions") or []
            ),
        )

    def invalid_operator(self) -> str | None:
        """The first operator this selector uses that the API does not define, if any."""
        return next((op for _k, op, _v in self.expressions if op not in OPERATORS), None)

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for key, op, values in self.expressions:
            value = labels.get(key)
            if op == "In" and value not in values:
                return False
            if op == "NotIn" and value is not None and value in values:
                return False
            if op == "Exists" and value is None:
                return False
            if op == "DoesNotExist" and value is not None:
                return False
            if op not in OPERATORS:
                return False
        return True
