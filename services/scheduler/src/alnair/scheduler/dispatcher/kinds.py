"""The kinds of workload the dispatcher queues: one adapter per kind, one core for all.

The core (`controller.Dispatcher`) owns queues, quota, the policy, reservations, explanations,
Events and metrics. An adapter says only what is particular to its kind:

- which objects of the kind go through a queue (`queued`), the same test the admission webhook
  holds them by;
- how its objects are keyed (an ElasticJob and a Job of one name must not collide);
- what it asks of the queue (`parse`: pod sets as a `Workload`);
- when it has finished (`finished`);
- how it is held and released: both kinds today hold with `spec.suspend` and take the chosen
  GPU model in `spec.template.spec.nodeSelector`, so the core writes that patch;
- whether the core writes the `alnair.io/Admitted` condition (a Job's status conditions are
  open to other writers; an ElasticJob's belong to its controller).

`docs/admission.md` has the kind-by-behaviour table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alnair.common.kube import ELASTICJOBS, JOBS, Obj, Resource
from alnair.scheduler.dispatcher.objects import (
    LABEL_QUEUE,
    Workload,
    elastic_finished,
    elastic_key,
    is_finished,
    parse_elastic_workload,
    parse_workload,
)

JOB_CONTROLLER = "kubernetes.io/job-controller"
"""`spec.managedBy` of a Job the built-in Job controller runs (the default)."""


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    kind: str
    api_version: str
    resource: Resource
    label_selector: str | None
    """What the informer lists (None: every object, `queued` decides)."""
    queued: Callable[[Obj], bool]
    key: Callable[[str, str], str]
    parse: Callable[[Obj, float], Workload]
    finished: Callable[[Obj], str | None]
    writes_conditions: bool

    @property
    def informer(self) -> str:
        """The name of its informer (logs, metrics)."""
        return f"queued-{self.resource.plural}"

    def ref(self, obj: Obj) -> Obj:
        """The object with its kind, for Events (list results carry no kind)."""
        return {**obj, "apiVersion": self.api_version, "kind": self.kind}

    def key_of(self, obj: Obj) -> str:
        meta = obj["metadata"]
        return self.key(str(meta["namespace"]), str(meta["name"]))


def _job_queued(obj: Obj) -> bool:
    """A Job names its LocalQueue with the label and is run by the built-in Job controller.

    A Job another controller runs (`spec.managedBy`: the multi-cluster hub's copy on a worker,
    a JobSet's child) is that controller's to admit."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    managed_by = (obj.get("spec") or {}).get("managedBy")
    return bool(labels.get(LABEL_QUEUE)) and managed_by in (None, "", JOB_CONTROLLER)


def _elastic_queued(obj: Obj) -> bool:
    """An ElasticJob names its queue with the label or `spec.queue`."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_QUEUE) or (obj.get("spec") or {}).get("queue"))


JOB = WorkloadKind(
    kind="Job",
    api_version="batch/v1",
    resource=JOBS,
    label_selector=LABEL_QUEUE,
    queued=_job_queued,
    key=lambda namespace, name: f"{namespace}/{name}",
    parse=parse_workload,
    finished=is_finished,
    writes_conditions=True,
)
ELASTIC = WorkloadKind(
    kind="ElasticJob",
    api_version="alnair.io/v1alpha1",
    resource=ELASTICJOBS,
    label_selector=None,  # `spec.queue` alone queues one too
    queued=_elastic_queued,
    key=elastic_key,
    parse=parse_elastic_workload,
    finished=elastic_finished,
    writes_conditions=False,
)
KINDS: dict[str, WorkloadKind] = {k.kind: k for k in (JOB, ELASTIC)}
"""Every kind the dispatcher queues, by `kind`."""
