"""An ElasticJob's spec, parsed and checked: what the CRD cannot check is refused here.

The CRD's OpenAPI schema and CEL rules refuse most bad specs at the API server with the field
named (`1 <= minReplicas <= maxReplicas`, allowed sizes within the range, a running job's minimum
not raised). What only the controller can judge, such as a pod template that asks for no GPUs,
raises `SpecError` listing every bad field at once; the controller records it as an Event on
the ElasticJob and sets the phase `Invalid` instead of crashing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from alnair.common import resources as r
from alnair.common.errors import InvalidValueError, PermanentError
from alnair.common.kube import Obj

JOB_LABEL = "alnair.io/elastic-job"
"""Label on every object the controller owns for a job (value: the job's name)."""
ROLE_LABEL = "alnair.io/elastic-role"
"""`worker` on worker pods, `rendezvous` on the torchrun store pod."""
POD_INDEX_LABEL = r.POD_INDEX_LABEL
RDZV_PORT = 29400


class Rendezvous(StrEnum):
    TORCHRUN = "torchrun"
    HOROVOD = "horovod"


class SpecError(PermanentError):
    """The spec cannot run as written; `problems` holds (field, reason) for every bad field."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        text = "; ".join(f"{f}: {why}" for f, why in problems)
        super().__init__(f"invalid ElasticJob spec: {text}")
        self.problems = problems


@dataclass(frozen=True)
class ElasticSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    min_replicas: int
    max_replicas: int
    allowed_sizes: tuple[int, ...]
    gpus_per_worker: int
    rendezvous: Rendezvous
    cooldown_s: float
    max_restarts: int
    suspend: bool
    template: Obj
    succeeded: bool = False
    """The trainer reported completion (status.phase Succeeded): no workers, phase kept."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every size the job may run at, ascending."""
        if self.allowed_sizes:
            return self.allowed_sizes
        return tuple(range(self.min_replicas, self.max_replicas + 1))

    def largest_size_at_most(self, n: int) -> int | None:
        """The largest allowed size <= n, or None when even the minimum does not fit."""
        fitting = [s for s in self.sizes if s <= n]
        return fitting[-1] if fitting else None


def template_gpus(template: Obj) -> int:
    """Whole GPUs one worker asks for (`alnair.common.resources.whole_gpus`)."""
    return r.whole_gpus(template.get("spec") or {}, "spec.template.spec")


def _int(spec: dict[str, Any], field: str, default: int | None, problems: list[Any]) -> int:
    value = spec.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((f"spec.{field}", f"must be an integer, got {value!r}"))
        return default or 0
    return value


def parse(obj: Obj) -> ElasticSpec:
    """The spec of ElasticJob `obj`; `SpecError` names every field that cannot work."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    problems: list[tuple[str, str]] = []
    lo = _int(spec, "minReplicas", None, problems)
    hi = _int(spec, "maxReplicas", None, problems)
    if lo < 1:
        problems.append(("spec.minReplicas", f"must be >= 1, got {lo}"))
    if hi < lo:
        problems.append(("spec.maxReplicas", f"must be >= minReplicas ({lo}), got {hi}"))
    sizes = tuple(sorted(set(spec.get("allowedSizes") or ())))
    bad = [s for s in sizes if not lo <= s <= hi]
    if bad:
        problems.append(("spec.allowedSizes", f"{bad} outside [{lo}, {hi}]"))
    if sizes and lo not in sizes:
        problems.append(("spec.allowedSizes", f"must contain minReplicas ({lo})"))
    template = spec.get("template")
    if not isinstance(template, dict) or not (template.get("spec") or {}).get("containers"):
        problems.append(("spec.template.spec.containers", "a worker needs at least one container"))
        template = {}
    try:
        asked = template_gpus(template)
    except InvalidValueError as exc:
        problems.append((exc.field, str(exc)))
        asked = 0
    per_worker = spec.get("gpusPerWorker")
    if template and asked == 0:
        problems.append(
            (
                f"spec.template.spec.containers[*].resources.limits[{r.GPU}]",
                "the worker template asks for no GPUs; an elastic job sizes itself by GPUs",
            )
        )
    elif per_worker is not None and asked and per_worker != asked:
        problems.append(
            ("spec.gpusPerWorker", f"{per_worker} but the template asks for {asked} GPU(s)")
        )
    try:
        rdzv = Rendezvous(spec.get("rendezvous", Rendezvous.TORCHRUN))
    except ValueError:
        bad_kind = spec.get("rendezvous")
        problems.append(("spec.rendezvous", f"{bad_kind!r} is not torchrun or horovod"))
        rdzv = Rendezvous.TORCHRUN
    cooldown = _int(spec, "scaleCooldownSeconds", 60, problems)
    restarts = _int(spec, "maxRestarts", 3, problems)
    if cooldown < 0:
        problems.append(("spec.scaleCooldownSeconds", f"must be >= 0, got {cooldown}"))
    if restarts < 0:
        problems.append(("spec.maxRestarts", f"must be >= 0, got {restarts}"))
    if problems:
        raise SpecError(problems)
    return ElasticSpec(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        min_replicas=lo,
        max_replicas=hi,
        allowed_sizes=sizes,
        gpus_per_worker=int(per_worker or asked),
        rendezvous=rdzv,
        cooldown_s=float(cooldown),
        max_restarts=restarts,
        suspend=bool(spec.get("suspend", False))
        or (obj.get("status") or {}).get("phase") == "Succeeded",
        template=template,
        succeeded=(obj.get("status") or {}).get("phase") == "Succeeded",
    )
