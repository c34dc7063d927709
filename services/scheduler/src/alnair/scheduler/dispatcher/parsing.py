"""Kubernetes objects as the queueing model reads them: queues, Jobs, plain pods, GPU nodes,
and what every workload parser shares (`Workload`, pod sets, GPU requests, the dispatcher's
labels and annotations). Each other kind's parser is with its family: `training.py`
(PodGroup, JobSet, RayJob/RayCluster, TrainJob, ElasticJob), `inference.py` (Deployment,
StatefulSet, LeaderWorkerSet), `kubeflow_v1.py` (PyTorchJob, MPIJob).

Parsing is strict and names the bad field (`spec.resourceGroups[0].flavors[1].resources[0]
.nominalQuota`), because a queue or a Job the dispatcher misreads would be admitted wrongly,
and a user needs to know which line of their manifest to fix. The CRD schema refuses most bad
input already; these checks repeat the ones a schema cannot make (a cohort that does not exist,
a Job asking for GPUs in a way the queue cannot count).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from alnair.common import resources as res
from alnair.common.annotations import MODEL_ANNOTATION_KEYS, object_model
from alnair.common.errors import InvalidValueError
from alnair.common.kube import (
    JOBS,
    PODS,
    Obj,
    Resource,
)
from alnair.scheduler.queueing.model import ClusterQueueSpec, FlavorQuota

LABEL_QUEUE = "alnair.io/queue-name"
"""The label a workload names its LocalQueue with."""
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
"""Kueue's label for the same: manifests written for Kueue queue here unchanged (a LocalQueue of
that name in the namespace). Do not run Kueue beside Alnair on one cluster: both would admit."""
QUEUE_LABELS = (LABEL_QUEUE, LABEL_KUEUE_QUEUE)


def controller_ref(obj: Obj) -> Obj | None:
    """The owner reference of `obj` that is its controller, if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((dict(r) for r in refs if r.get("controller")), None)


def queue_label(meta: Mapping[str, Any]) -> str:
    """The LocalQueue a workload's labels name ('' for none): Alnair's label first."""
    labels = meta.get("labels") or {}
    return str(labels.get(LABEL_QUEUE) or labels.get(LABEL_KUEUE_QUEUE) or "")


MANAGED_BY_HUB = "alnair.io/multicluster"
"""`spec.managedBy` of a Job the multi-cluster hub runs on a worker (`dispatcher/hub.py`); the
single-cluster dispatcher leaves such Jobs alone."""
ANN_ADMITTED_TYPE = "alnair.io/admitted-gpu-model"
ANN_ADMITTED_AT = "alnair.io/admitted-at"
ANN_SELECTED_TYPE = "alnair.io/selected-gpu-model"
"""The GPU model the dispatcher wrote into the pod template's node selector (kept while
suspended: a started Job's template cannot change until it is admitted again)."""
ANN_FLAVORS = "alnair.io/admitted-flavors"
"""Kueue's queues: the flavor each resource other than GPUs was counted in at admission, as
JSON (`{"cpu": "default-flavor"}`), so the same quota is charged while it runs."""
NO_GPU = "none"
"""ANN_ADMITTED_TYPE of a workload admitted without GPUs (Kueue's queues over CPU, memory)."""
ANN_BORROWING = "alnair.io/borrowing"
ANN_STOPPING = "alnair.io/stopping"
"""Set (never written: read from a Kueue Workload's status) on an admitted workload told to
stop whose reservation is not given back yet."""
ANN_RAN = "alnair.io/ran-s"
"""Seconds a preempted job ran before, summed over its preempted runs."""
ANN_RESTART_COST = "alnair.io/restart-cost-s"
ANN_QUEUE_STATE = "alnair.io/queue-state"
ANN_PODS_READY_AT = "alnair.io/pods-ready-at"
"""When every pod of the admitted workload was first seen ready (the pods-ready timeout stops)."""
ANN_NOT_READY_EVICTIONS = "alnair.io/pods-not-ready-evictions"
"""How often the workload gave its quota back because its pods were not ready in time."""
ANN_REQUEUE_AT = "alnair.io/requeue-at"
"""Not queued again before this time (epoch seconds): the backoff after such an eviction."""
ANN_TRIAL = "alnair.io/trial"
"""The TrialJob run for this Job's cold start, or `skip` (set by the user) for none."""
LABEL_TRIAL_FOR = "alnair.io/trial-for"
LABEL_WORKLOAD = "alnair.io/workload"
"""On a serving workload's pod template (set by the webhook at creation): `<kind>.<name>`, so
each pod its controller makes is gated, and the dispatcher knows whose pod it is."""
ADMISSION_GATE = "alnair.io/admission"
"""The scheduling gate that holds a queued Pod until the dispatcher admits it (a gated pod's
node selector may still be added to, KEP-3838, which is how the chosen GPU model reaches it)."""
GPU = "nvidia.com/gpu"


def whole_count(value: Any, where: str, *, minimum: int = 0) -> int:
    """An integer field as a count (at least `minimum`); InvalidValueError names `where`."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidValueError(where, value, "must be an integer")
    try:
        number = int(value)
    except ValueError:
        raise InvalidValueError(where, value, "must be an integer") from None
    if number < minimum:
        raise InvalidValueError(where, value, f"must be >= {minimum}")
    return number


def parse_cluster_queue(obj: Obj, cohorts: set[str]) -> ClusterQueueSpec:
    """A ClusterQueue object as the policies see it; the first bad field is named."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec") or {}
    cohort = spec.get("cohort") or None
    if cohort is not None and cohort not in cohorts:
        raise InvalidValueError("spec.cohort", cohort, f"no Cohort named {cohort!r} exists")
    weight = fair_share_weight(spec, "spec.fairSharing.weight")
    quota: dict[str, FlavorQuota] = {}
    groups = spec.get("resourceGroups") or []
    if not groups:
        raise InvalidValueError("spec.resourceGroups", groups, "at least one group is needed")
    for g, group in enumerate(groups):
        for f, flavor in enumerate(group.get("flavors") or []):
            where = f"spec.resourceGroups[{g}].flavors[{f}]"
            model = flavor.get("name")
            if not model:
                raise InvalidValueError(f"{where}.name", model, "a GPU model is needed")
            if model in quota:
                raise InvalidValueError(f"{where}.name", model, "listed twice")
            for r, resource in enumerate(flavor.get("resources") or []):
                rw = f"{where}.resources[{r}]"
                if resource.get("name") != GPU:
                    raise InvalidValueError(f"{rw}.name", resource.get("name"), f"only {GPU}")
                quota[model] = flavor_quota(resource, rw, cohort, "spec.cohort")
    return ClusterQueueSpec(name=name, quota=quota, cohort=cohort, weight=weight)


def flavor_quota(resource: Obj, where: str, cohort: str | None, cohort_field: str) -> FlavorQuota:
    """One flavor's GPU quota (`nominalQuota`, `borrowingLimit`, `lendingLimit` at `where`),
    checked as Kueue checks it; borrowing and lending need a cohort (`cohort_field`)."""
    nominal = whole_count(resource.get("nominalQuota"), f"{where}.nominalQuota")
    borrow = resource.get("borrowingLimit")
    lend = resource.get("lendingLimit")
    if cohort is None and (borrow is not None or lend is not None):
        raise InvalidValueError(
            f"{where}.borrowingLimit", borrow, f"borrowing and lending need {cohort_field}"
        )
    lend_n = None if lend is None else whole_count(lend, f"{where}.lendingLimit")
    if lend_n is not None and lend_n > nominal:
        raise InvalidValueError(f"{where}.lendingLimit", lend, "exceeds nominalQuota")
    return FlavorQuota(
        nominal=nominal,
        borrowing_limit=None if borrow is None else whole_count(borrow, f"{where}.borrowingLimit"),
        lending_limit=lend_n,
    )


def fair_share_weight(spec: Obj, where: str) -> float:
    """`fairSharing.weight` of a queue's spec (1 when unset); it must be a number > 0."""
    weight_raw = (spec.get("fairSharing") or {}).get("weight", 1)
    try:
        weight = float(weight_raw)
    except (TypeError, ValueError):
        raise InvalidValueError(where, weight_raw, "not a number") from None
    if not weight > 0 or math.isinf(weight):
        raise InvalidValueError(where, weight_raw, "must be > 0")
    return weight


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one Job asks of the queue: GPUs in all, and per pod (whole or fraction)."""

    gpus: int
    pods: int
    gpus_per_pod: int
    memory_mib_per_pod: int | None = None
    """Fractional GPU pods: the GPU memory each asks for in MiB (`alnair.io/gpu-memory-gib` x 1024
    or `alnair.io/gpu-memory`)."""


def gpu_request(job: Obj) -> GpuRequest:
    """The GPUs a Job's pods ask for, all pods running at once (parallelism)."""
    request = gpus_asked(job)
    if request is None:
        raise InvalidValueError(
            "spec.template.spec.containers[].resources",
            0,
            f"a queued Job must ask for {GPU}, {res.GPU_MEMORY_GIB} or {res.GPU_MEMORY}",
        )
    return request


def gpus_asked(job: Obj) -> GpuRequest | None:
    """`gpu_request`, or None when the Job's pods ask for no GPU at all."""
    spec = job.get("spec") or {}
    pods = job_pods(spec, "spec")
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    whole, memory = 0, 0
    for c, container in enumerate(containers):
        amounts = res.container_requests(container)
        where = f"spec.template.spec.containers[{c}].resources"
        if GPU in amounts:
            whole += whole_count(amounts[GPU], f"{where}.{GPU}")
        # the resource's name is its unit (GiB or MiB)
        units = {
            name: whole_count(amounts[name], f"{where}.{name}", minimum=1)
            for name in res.GPU_MEMORY_UNIT_MIB
            if name in amounts
        }
        memory += int(res.gpu_memory_mib(units, where))
    if whole and memory:
        raise InvalidValueError(
            "spec.template.spec.containers[].resources",
            f"{GPU} and GPU memory",
            "ask for whole GPUs or a fraction, not both",
        )
    if memory:
        # A fraction counts as one GPU of quota: it holds a GPU's share for its lifetime.
        return GpuRequest(gpus=pods, pods=pods, gpus_per_pod=1, memory_mib_per_pod=memory)
    if not whole:
        return None
    return GpuRequest(gpus=pods * whole, pods=pods, gpus_per_pod=whole)


@dataclass(frozen=True, slots=True)
class PodSet:
    """Pods of one template a workload runs at once: `count` of them. `where` is the field of
    the template (errors inside it are named from there)."""

    where: str
    template: Obj
    count: int


def _inside_template(pod_set: PodSet, field: str) -> str:
    return f"{pod_set.where}.{field.removeprefix('spec.template.')}"


def pod_sets_request(
    meta: Obj,
    pod_sets: list[PodSet],
    kind: str,
    *,
    none_field: str,
    none_reason: str,
    field_of: Callable[[PodSet, str], str] = _inside_template,
) -> tuple[GpuRequest, str | None]:
    """What a workload of several pod sets asks, all running at once: the GPUs of every set
    (a set asking none, a coordinator, counts for nothing), the pods that ask them, and the
    per-pod shape the policy places (the largest); whole GPUs only. With the GPU model its
    templates insist on, if any. InvalidValueError names the field (`field_of` a set and the
    field as a Job's), or `none_field` when no set asks for a GPU."""
    gpus = pods = per_pod = 0
    model: str | None = None
    for pod_set in pod_sets:
        if not pod_set.count:
            continue
        job_like = {"metadata": meta, "spec": {"parallelism": pod_set.count,
                                               "template": pod_set.template}}  # fmt: skip
        try:
            request = gpus_asked(job_like)
        except InvalidValueError as exc:
            raise InvalidValueError(field_of(pod_set, exc.field), exc.value, exc.reason) from None
        if request is None:
            continue
        if request.memory_mib_per_pod is not None:
            raise InvalidValueError(
                field_of(pod_set, "spec.template.spec.containers[].resources"), "GPU memory",
                f"a {kind} asks for whole GPUs (fractions are queued for Jobs and Pods)",
            )  # fmt: skip
        gpus += request.gpus
        pods += request.pods
        per_pod = max(per_pod, request.gpus_per_pod)
        model = model or gpu_model_constraint(job_like)
    if not gpus:
        raise InvalidValueError(none_field, 0, none_reason)
    return GpuRequest(gpus=gpus, pods=pods, gpus_per_pod=per_pod), model


def pod_sets_workload(
    obj: Obj,
    pod_sets: list[PodSet],
    *,
    key: str,
    kind: str,
    api_version: str,
    resource: Resource,
    held: bool,
    default_restart_cost_s: float,
    none_field: str,
    none_reason: str,
    field_of: Callable[[PodSet, str], str] = _inside_template,
) -> Workload:
    """A workload of several pod sets all running at once, as the queue tracks it: what its
    sets ask (`pod_sets_request`, naming the field of a bad one), the GPU model its annotation
    or templates insist on, its restart cost, and what the predictor reads."""
    meta = obj["metadata"]
    request, model = pod_sets_request(
        meta, pod_sets, kind, none_field=none_field, none_reason=none_reason, field_of=field_of
    )
    return Workload(
        key=key,
        obj=obj,
        local_queue=queue_label(meta),
        request=request,
        features=object_model(obj).present(),
        gpu_model=(meta.get("annotations") or {}).get(res.LABEL_GPU_MODEL) or model,
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        resource=resource,
        kind=kind,
        api_version=api_version,
        held=held,
        pod_sets=tuple(pod_sets),
    )


def job_pods(spec: Obj, where: str) -> int:
    """The pods a Job spec runs at once: `parallelism`, at most `completions`."""
    pods = whole_count(spec.get("parallelism", 1), f"{where}.parallelism", minimum=1)
    completions = spec.get("completions")
    if completions is not None:
        pods = min(pods, whole_count(completions, f"{where}.completions", minimum=1))
    return pods


def gpu_model_constraint(job: Obj) -> str | None:
    """The GPU model a Job insists on: `alnair.io/gpu-model` as annotation or node selector."""
    meta = job.get("metadata") or {}
    annotated = (meta.get("annotations") or {}).get(res.LABEL_GPU_MODEL)
    template = (job.get("spec") or {}).get("template") or {}
    selected = ((template.get("spec") or {}).get("nodeSelector") or {}).get(res.LABEL_GPU_MODEL)
    if (meta.get("annotations") or {}).get(ANN_SELECTED_TYPE) == selected:
        selected = None  # our own choice from an earlier admission, not the user's
    return annotated or selected or None


def is_finished(job: Obj) -> str | None:
    """'Complete' or 'Failed' once the Job controller says so, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


@dataclass(slots=True)
class Workload:
    """One queued Job as the dispatcher tracks it."""

    key: str
    obj: Obj
    local_queue: str
    request: GpuRequest
    features: dict[str, str] = field(default_factory=dict)
    """What the predictor needs (model name, batch size, data size, epochs), when annotated."""
    gpu_model: str | None = None
    restart_cost_s: float = 0.0
    resource: Resource = JOBS
    kind: str = "Job"
    api_version: str = "batch/v1"
    surplus_gpus: int = 0
    """ElasticJob: GPUs of the workers it runs above its minimum (counted as borrowed quota)."""
    held: bool = False
    """Held for its queue: suspended (Job, ElasticJob) or gated (Pod)."""
    pod_sets: tuple[PodSet, ...] = ()
    """Every pod it runs at once, by template (what a namespace's ResourceQuota charges)."""

    @property
    def elastic(self) -> bool:
        return self.kind == "ElasticJob"

    def ref(self) -> Obj:
        """The object with its kind, for Events (list results carry no kind)."""
        return {**self.obj, "apiVersion": self.api_version, "kind": self.kind}

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"].get("uid", ""))

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.obj["metadata"].get("annotations") or {}

    @property
    def admitted_type(self) -> str | None:
        """The GPU model it was admitted on, while it is admitted (not held)."""
        if self.held:
            return None
        return self.annotations.get(ANN_ADMITTED_TYPE)


def restart_cost(meta: Obj, default_s: float) -> float:
    """`alnair.io/restart-cost-s`: the work a preemption loses (default: the setting)."""
    raw = (meta.get("annotations") or {}).get(ANN_RESTART_COST)
    if raw is None:
        return default_s
    try:
        restart = float(raw)
    except ValueError:
        raise InvalidValueError(ANN_RESTART_COST, raw, "not a number") from None
    if not 0 <= restart < math.inf:
        raise InvalidValueError(ANN_RESTART_COST, raw, "must be >= 0")
    return restart


def parse_workload(job: Obj, default_restart_cost_s: float) -> Workload:
    meta = job["metadata"]
    features = object_model(job).present()
    restart = restart_cost(meta, default_restart_cost_s)
    return Workload(
        key=f"{meta['namespace']}/{meta['name']}",
        obj=job,
        local_queue=queue_label(meta),
        request=gpu_request(job),
        features=features,
        gpu_model=gpu_model_constraint(job),
        restart_cost_s=restart,
        held=bool((job.get("spec") or {}).get("suspend")),
        pod_sets=(_job_pod_set(job),),
    )


def parse_plain_job(job: Obj, default_restart_cost_s: float) -> Workload:
    """A queued Job that asks no GPU (admitted by quota over other resources alone, which
    only Kueue's queues hold); InvalidValueError when it asks for one after all."""
    if gpus_asked(job) is not None:
        raise InvalidValueError("spec.template.spec.containers[].resources", GPU, "asks GPUs")
    meta = job["metadata"]
    pods = job_pods(job.get("spec") or {}, "spec")
    return Workload(
        key=f"{meta['namespace']}/{meta['name']}",
        obj=job,
        local_queue=queue_label(meta),
        request=GpuRequest(gpus=0, pods=pods, gpus_per_pod=0),
        restart_cost_s=restart_cost(meta, default_restart_cost_s),
        held=bool((job.get("spec") or {}).get("suspend")),
        pod_sets=(_job_pod_set(job),),
    )


def _job_pod_set(job: Obj) -> PodSet:
    spec = job.get("spec") or {}
    return PodSet("spec.template", spec.get("template") or {}, job_pods(spec, "spec"))


def pod_key(namespace: str, name: str) -> str:
    """Pods share the queue with Jobs and ElasticJobs: their keys must not collide."""
    return f"pod:{namespace}/{name}"


def gated(pod: Obj) -> bool:
    """Whether the pod still carries the admission gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def parse_pod_workload(pod: Obj, default_restart_cost_s: float) -> Workload:
    """A plain Pod as a queued workload: one pod of its own GPU request."""
    job_like = {"metadata": pod["metadata"], "spec": {"template": {"spec": pod.get("spec") or {}}}}
    try:
        wl = parse_workload(job_like, default_restart_cost_s)
    except InvalidValueError as exc:
        # Named as the Pod has it (`spec.containers[0]...`), not as the Job it was read as.
        field = exc.field.replace("spec.template.spec.", "spec.", 1)
        raise InvalidValueError(field, exc.value, exc.reason) from None
    return Workload(
        key=pod_key(pod["metadata"]["namespace"], pod["metadata"]["name"]),
        obj=pod,
        local_queue=wl.local_queue,
        request=wl.request,
        features=wl.features,
        gpu_model=wl.gpu_model,
        restart_cost_s=wl.restart_cost_s,
        resource=PODS,
        kind="Pod",
        api_version="v1",
        held=gated(pod),
        pod_sets=(PodSet("", {"spec": pod.get("spec") or {}}, 1),),
    )


def workload_label(kind: str, name: str) -> str:
    """The `alnair.io/workload` value of a serving workload's pods."""
    return f"{kind.lower()}.{name}"


def pod_finished(pod: Obj) -> str | None:
    phase = (pod.get("status") or {}).get("phase")
    return str(phase) if phase in ("Succeeded", "Failed") else None


@dataclass(frozen=True, slots=True)
class NodeGpus:
    model: str
    gpus: int
    memory_mib: float


def node_gpus(node: Obj) -> NodeGpus | None:
    """A Ready, schedulable node's GPUs by model; None for nodes without labelled GPUs."""
    labels = node["metadata"].get("labels") or {}
    model = labels.get(res.LABEL_GPU_MODEL)
    if not model or (node.get("spec") or {}).get("unschedulable"):
        return None
    conds = (node.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
        return None
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        gpus = int(alloc.get(GPU, labels.get(res.LABEL_GPU_COUNT, 0)))
        memory = float(labels.get(res.LABEL_GPU_MEMORY_MIB, 0))
    except ValueError:
        return None
    if gpus <= 0:
        return None
    return NodeGpus(model=model, gpus=gpus, memory_mib=memory)


def carried_model_annotations(obj: Obj) -> dict[str, str]:
    """The workload's own model annotations its pod template does not already say."""
    own = (obj.get("metadata") or {}).get("annotations") or {}
    template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    there = template.get("annotations") or {}
    return {k: str(v) for k, v in own.items() if k in MODEL_ANNOTATION_KEYS and k not in there}


def trialjob_manifest(wl: Workload, name: str, models: list[str], duration_s: int) -> Obj:
    """A TrialJob measuring `wl` on 1 GPU of each of `models`, owned by the Job (deleted with
    it). The profiler's TrialJob controller runs it; its records feed the predictor."""
    meta = wl.obj["metadata"]
    template = copy.deepcopy((wl.obj.get("spec") or {}).get("template") or {})
    labels = (template.get("metadata") or {}).get("labels") or {}
    for key in res.JOB_CONTROLLER_LABELS:  # the Job's own, which its trials must not carry
        labels.pop(key, None)
    model_ann = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k in MODEL_ANNOTATION_KEYS
    }
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "TrialJob",
        "metadata": {
            "name": name,
            "namespace": wl.namespace,
            "labels": {LABEL_TRIAL_FOR: wl.name},
            "annotations": model_ann,
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": wl.name, "uid": wl.uid}
            ],
        },
        "spec": {
            "template": template,
            "candidates": [{"gpuModel": m, "gpuCount": 1} for m in models],
            "durationSeconds": duration_s,
        },
    }


def trial_phase(trialjob: Obj | None) -> str | None:
    return ((trialjob or {}).get("status") or {}).get("phase")
