"""A namespace's ResourceQuota, asked before admission (issue 24): a workload whose pods the
quota would refuse waits, with the quota, the resource and the amounts in its reason, instead
of being admitted and having its pods refused by the API server.

What a workload asks is its pod sets' amounts in the quota's own vocabulary: `pods` (and
`count/pods`), `requests.<resource>` (bare `cpu`, `memory`, `ephemeral-storage` are requests
too) and `limits.<resource>`, per pod as the API server charges it (the sum of its containers,
or its largest init container when that is more). Each quota's room is `hard - used` from its
status. Used is the larger of what the status says and what the workloads the dispatcher
admitted in that namespace ask: between an admission and the Job controller creating the
pods, the status does not show them yet, and a second workload must not be admitted into
the same room meanwhile.

Not read: quotas with `scopes` or a `scopeSelector` (which pods they charge depends on each
pod's priority class or QoS; they are skipped and the log says so once), object counts other
than pods (the workload's own object exists already), and pod overhead. A workload the quota
refuses anyway (a race with pods no queue controls) is caught by the pods-ready timeout.
"""

from __future__ import annotations

import logging
from decimal import Decimal

from alnair.common import resources as res
from alnair.common.errors import InvalidValueError
from alnair.common.informer import Informer
from alnair.common.kube import RESOURCEQUOTAS, KubeClient, Obj
from alnair.scheduler.dispatcher.amounts import Amounts, add, pod_amounts
from alnair.scheduler.dispatcher.parsing import GPU, PodSet, Workload

log = logging.getLogger(__name__)

REQUEST_ALIASES = {"cpu": "requests.cpu", "memory": "requests.memory",
                   "ephemeral-storage": "requests.ephemeral-storage",
                   "count/pods": "pods"}  # fmt: skip


def workload_amounts(wl: Workload) -> Amounts:
    """All a workload's pods charge at once; `pods` counts every pod of its sets."""
    total: Amounts = {}
    pods = 0
    for pod_set in wl.pod_sets:
        if pod_set.count <= 0:
            continue
        for name, amount in pod_amounts(pod_set.template, pod_set.where).items():
            add(total, name, amount * pod_set.count)
        pods += pod_set.count
    total["pods"] = Decimal(max(pods, wl.request.pods))  # (a PodGroup states one set)
    return total


def asked_of_queue(wl: Workload) -> Amounts:
    """What a workload asks of a queue's quota over resources other than GPUs: its pods'
    requests, all at once, by resource (GPUs, whole or by memory, are the policies')."""
    gpu = {GPU, *res.GPU_MEMORY_UNIT_MIB}
    return {
        name.removeprefix("requests."): amount
        for name, amount in workload_amounts(wl).items()
        if name.startswith("requests.") and name.removeprefix("requests.") not in gpu
    }


def _charge(held: Amounts, wl: Workload) -> None:
    try:
        amounts = workload_amounts(wl)
    except InvalidValueError:
        return  # (its own admission was refused the same way: it holds nothing here)
    for name, amount in amounts.items():
        add(held, name, amount)


def _show(name: str, amount: Decimal) -> str:
    if name.endswith(("memory", "storage")):
        return f"{amount / 2**20:.0f}Mi"
    return f"{amount.normalize():f}"


class NamespaceQuotas:
    """The ResourceQuotas of every namespace (one informer), asked per workload."""

    def __init__(self, kube: KubeClient) -> None:
        self.informer = Informer(kube, RESOURCEQUOTAS, name="resourcequotas")
        self._scoped: set[str] = set()
        self._admitted: dict[str, list[Workload]] = {}
        self._held: dict[str, Amounts] = {}

    def begin(self) -> None:
        """A new reconcile: nothing admitted yet (each admitted workload is `charge`d)."""
        self._admitted.clear()
        self._held.clear()

    def charge(self, wl: Workload) -> None:
        """`wl` is admitted in its namespace now."""
        self._admitted.setdefault(wl.namespace, []).append(wl)
        held = self._held.get(wl.namespace)
        if held is not None:
            _charge(held, wl)

    def _held_in(self, namespace: str) -> Amounts:
        """What the admitted workloads of `namespace` ask, summed once per reconcile (and
        only for a namespace that has a quota)."""
        held = self._held.get(namespace)
        if held is None:
            held = self._held[namespace] = {}
            for wl in self._admitted.get(namespace, ()):
                _charge(held, wl)
        return held

    def shortfall(self, wl: Workload) -> str | None:
        """Why `wl`'s namespace's quota would refuse its pods, given what is charged there
        (None: it would not)."""
        quotas = [q for q in self.informer.values()
                  if q["metadata"].get("namespace") == wl.namespace]  # fmt: skip
        if not quotas:
            return None
        try:
            asked = workload_amounts(wl)
        except InvalidValueError as exc:
            return f"its pods' requests cannot be read: {exc}"
        held = self._held_in(wl.namespace)
        for quota in sorted(quotas, key=lambda q: str(q["metadata"]["name"])):
            problem = self._over(quota, asked, held)
            if problem:
                return problem
        return None

    def _over(self, quota: Obj, asked: Amounts, held: Amounts) -> str | None:
        meta, spec = quota["metadata"], quota.get("spec") or {}
        name = f"{meta.get('namespace')}/{meta['name']}"
        if spec.get("scopes") or spec.get("scopeSelector"):
            if name not in self._scoped:
                self._scoped.add(name)
                log.info("a scoped ResourceQuota is not asked before admission",
                         extra={"quota": name})  # fmt: skip
            return None
        status = quota.get("status") or {}
        hard = status.get("hard") or spec.get("hard") or {}
        used = status.get("used") or {}
        for key, limit in sorted(hard.items()):
            resource = REQUEST_ALIASES.get(key, key)
            need = asked.get(resource, Decimal(0))
            if not need:
                continue
            try:
                cap = res.parse_quantity(limit, f"ResourceQuota {name}: hard.{key}")
                now = res.parse_quantity(used.get(key, "0"), f"ResourceQuota {name}: used.{key}")
            except InvalidValueError:
                continue
            now = max(now, held.get(resource, Decimal(0)))
            if now + need > cap:
                return (
                    f"ResourceQuota {name}: {key} {_show(resource, need)} asked, "
                    f"{_show(resource, max(Decimal(0), cap - now))} left of {_show(resource, cap)}"
                )
        return None


__all__ = ["NamespaceQuotas", "PodSet", "pod_amounts", "workload_amounts"]
