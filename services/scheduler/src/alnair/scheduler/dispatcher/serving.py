"""The pods of serving workloads (Deployments, StatefulSets, LeaderWorkerSets) and PodGroups:
what the dispatcher reads of a workload whose object it never writes.

Such a workload is admitted through its pods: each is created gated (the webhook labels the
template with `alnair.io/workload`), and admission takes the gate off and writes the admission
record on the pod. So whether it is admitted, and whether it finished (a PodGroup), is read from
its pods, found through a label index of one informer rather than a scan.
"""

from __future__ import annotations

from alnair.common.informer import Informer, LabelIndex
from alnair.common.kube import Obj
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_AT,
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    LABEL_WORKLOAD,
    Workload,
    gated,
    workload_label,
)
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind

ADMISSION_RECORD = frozenset({ANN_ADMITTED_TYPE, ANN_ADMITTED_AT, ANN_BORROWING})
"""What a serving workload's pods carry of its admission."""


class ServingPods:
    """The pods labelled with their workload, by workload."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.members = LabelIndex(informer, LABEL_WORKLOAD)

    def of(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Every pod the workload's controller made (gated or not, leaving or not)."""
        return self.members.get(namespace, workload_label(kind, name))

    def live(self, wl: Workload) -> list[Obj]:
        """The workload's pods that are not leaving (gated or not)."""
        return [
            pod
            for pod in self.of(wl.kind, wl.namespace, wl.name)
            if not pod["metadata"].get("deletionTimestamp")
        ]

    def remember(self, namespace: str, pod: Obj) -> None:
        """A pod we just wrote, known before its watch event arrives."""
        self.informer.store[f"{namespace}/{pod['metadata']['name']}"] = pod

    def finished(self, kind: WorkloadKind, obj: Obj) -> str | None:
        """Whether the workload finished, by its object or, for a kind whose object does not
        say (a PodGroup), by its pods."""
        if kind.finished_by_pods is not None:
            meta = obj["metadata"]
            return kind.finished_by_pods(obj, self.of(kind.kind, meta["namespace"], meta["name"]))
        return kind.finished(obj)

    def with_admission(self, kind: WorkloadKind, obj: Obj) -> Obj:
        """A serving workload as admitted or not: the admission record its ungated pods
        carry (never annotations on the object itself, which anyone could write)."""
        meta = obj["metadata"]
        own = {k: v for k, v in (meta.get("annotations") or {}).items()
               if k not in ADMISSION_RECORD}  # fmt: skip
        for pod in self.of(kind.kind, meta["namespace"], meta["name"]):
            pm = pod["metadata"]
            if not gated(pod) and ANN_ADMITTED_TYPE in (pm.get("annotations") or {}):
                record = {k: v for k, v in pm["annotations"].items() if k in ADMISSION_RECORD}
                return {**obj, "metadata": {**meta, "annotations": {**own, **record}}}
        return {**obj, "metadata": {**meta, "annotations": own}}
