"""TrialJob (alnair.io/v1alpha1): short profiling runs on candidate GPU types and counts.

The seeds call it dry-run: before a long job is placed, run it briefly on each GPU type/count
it could use and measure. A TrialJob holds a pod template and a list of candidates; for each
candidate the controller creates one ordinary batch Job (owned by the TrialJob, labelled
`alnair.io/trialjob`), pinned to the GPU model by node selector, with that many GPUs, stopped
after `durationSeconds` (KWOK: the `alnair.io/duration` annotation; a real cluster:
`activeDeadlineSeconds`). Each trial Job is profiled like any job, so the aggregator writes an
execution record for it and publishes its completion event: that is how the predictor is
fed, through the same channel as every other job. The controller then copies each trial's
measured numbers (duration, peak GPU memory, mean utilization, throughput when the workload
reported steps) into the TrialJob's status.

Reconciliation is level-based and idempotent: it derives the wanted Jobs and the status from
what exists, so it can be re-run on any event (TrialJob changed, a trial Job finished) and
after restarts without creating anything twice.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from alnair.common import resources as res
from alnair.common.annotations import MODEL_ANNOTATION_KEYS
from alnair.common.kube import (
    JOBS,
    TRIALJOBS,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    Unavailable,
)
from alnair.common.records import ExecutionRecord
from alnair.profiler.aggregator.owners import finished
from alnair.profiler.aggregator.records import RecordStore

log = logging.getLogger(__name__)

LABEL_TRIALJOB = "alnair.io/trialjob"
ANN_TRIAL_OF = "alnair.io/trial-of"
# Copied as written (either spelling) so each trial Job is described as its TrialJob was.
MODEL_ANNOTATIONS = (*MODEL_ANNOTATION_KEYS, "alnair.io/steps")
_NAME = re.compile(r"[^a-z0-9-]")


def trial_job_name(trialjob: str, gpu_model: str, gpu_count: int) -> str:
    """A DNS-1123 name for one trial Job, stable so reconciling twice finds it again."""
    suffix = f"-{_NAME.sub('-', gpu_model.lower())}-x{gpu_count}"
    return (trialjob[: 63 - len(suffix)] + suffix).strip("-")


def candidates(trialjob: Mapping[str, Any]) -> list[tuple[str, int]]:
    spec = trialjob.get("spec") or {}
    return [(str(c["gpuModel"]), int(c["gpuCount"])) for c in spec.get("candidates") or []]


def trial_job_manifest(
    trialjob: Mapping[str, Any], gpu_model: str, gpu_count: int
) -> dict[str, Any]:
    """The batch Job that runs one candidate of a TrialJob."""
    meta = trialjob["metadata"]
    spec = trialjob.get("spec") or {}
    duration = int(spec.get("durationSeconds", 60))
    template = copy.deepcopy(spec.get("template") or {})
    tmeta = template.setdefault("metadata", {})
    tann = tmeta.setdefault("annotations", {})
    owner_ann = meta.get("annotations") or {}
    model_ann = {k: str(owner_ann[k]) for k in MODEL_ANNOTATIONS if k in owner_ann}
    tann.update(model_ann)
    tann[res.ANN_DURATION] = res.duration_value(duration)
    labels = tmeta.setdefault("labels", {})
    for key in res.JOB_CONTROLLER_LABELS:  # a template copied from a Job: not this one's
        labels.pop(key, None)
    labels[LABEL_TRIALJOB] = meta["name"]
    pod = template.setdefault("spec", {})
    pod.setdefault("restartPolicy", "Never")
    pod.setdefault("schedulerName", spec.get("schedulerName") or res.SCHEDULER_NAME)
    pod.setdefault("nodeSelector", {})[res.LABEL_GPU_MODEL] = gpu_model
    containers = pod.get("containers") or []
    if containers:
        # The API server takes an extended resource's request only equal to its limit: a
        # template copied from a 2-GPU Job asks 2 where the trial runs on `gpu_count`.
        resources = containers[0].setdefault("resources", {})
        resources.setdefault("limits", {})[res.GPU] = str(gpu_count)
        if res.GPU in (resources.get("requests") or {}):
            resources["requests"][res.GPU] = str(gpu_count)
    name = trial_job_name(meta["name"], gpu_model, gpu_count)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {LABEL_TRIALJOB: meta["name"]},
            "annotations": {**model_ann, ANN_TRIAL_OF: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": f"{res.ALNAIR_API_GROUP}/{res.ALNAIR_API_VERSION}",
                    "kind": "TrialJob",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            # A real workload does not stop by itself after the trial: the deadline stops it
            # (a little later than KWOK's duration, so simulated trials end as "succeeded").
            "activeDeadlineSeconds": duration + 30,
            "template": template,
        },
    }


def trial_entry(
    gpu_model: str,
    gpu_count: int,
    job: Mapping[str, Any] | None,
    record: ExecutionRecord | None,
    *,
    recording: bool = False,
) -> dict[str, Any]:
    """One element of status.trials (`recording`: ended, profiled, record not yet written)."""
    entry: dict[str, Any] = {"gpuModel": gpu_model, "gpuCount": gpu_count}
    if job is None:
        entry["phase"] = "Pending"
        return entry
    entry["job"] = job["metadata"]["name"]
    done = finished(job)
    if done is None or recording:
        entry["phase"] = "Running"
        return entry
    # A deadline stop is how a real trial ends; it still measured what it was there to measure.
    # A record without usage is of a run no sample reached: it finished, measuring nothing.
    sampled = record is not None and record.peak_gpu_mem_mib is not None
    entry["phase"] = "Measured" if sampled else "Finished"
    if record is not None:
        entry["record"] = record.key
        entry["durationSeconds"] = round(record.duration_s, 3)
        if record.peak_gpu_mem_mib is not None:
            entry["peakGpuMemMib"] = round(record.peak_gpu_mem_mib, 3)
        if record.mean_gpu_util_pct is not None:
            entry["meanGpuUtilPct"] = round(record.mean_gpu_util_pct, 3)
        if record.throughput_steps_per_s is not None:
            entry["throughputStepsPerS"] = round(record.throughput_steps_per_s, 6)
    return entry


REFUSED = "Refused"
"""A trial whose Job the API server would not create (its entry says why): it will not run."""


def trial_status(trials: list[dict[str, Any]]) -> dict[str, Any]:
    finished_count = sum(1 for t in trials if t["phase"] in {"Measured", "Finished", REFUSED})
    if finished_count < len(trials):
        phase = "Running" if any(t["phase"] != "Pending" for t in trials) else "Pending"
    else:
        phase = "Succeeded" if any(t["phase"] == "Measured" for t in trials) else "Failed"
    return {"phase": phase, "total": len(trials), "finished": finished_count, "trials": trials}


class TrialController:
    """Creates the trial Jobs of TrialJobs and keeps their status current."""

    def __init__(
        self,
        kube: KubeClient,
        records: RecordStore,
        profiled: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.kube = kube
        self.records = records
        self.profiled = profiled

    async def reconcile(self, trialjob: Mapping[str, Any]) -> dict[str, Any]:
        meta = trialjob["metadata"]
        ns, name = meta["namespace"], meta["name"]
        existing = await self.kube.list(JOBS, ns, label_selector=f"{LABEL_TRIALJOB}={name}")
        by_name = {j["metadata"]["name"]: j for j in existing.get("items", [])}
        before = (trialjob.get("status") or {}).get("trials") or []
        refused = {(t.get("gpuModel"), t.get("gpuCount")): t for t in before
                   if t.get("phase") == REFUSED}  # fmt: skip
        trials = []
        for gpu_model, gpu_count in candidates(trialjob):
            manifest = trial_job_manifest(trialjob, gpu_model, gpu_count)
            job = by_name.get(manifest["metadata"]["name"])
            if job is None and (gpu_model, gpu_count) in refused:
                trials.append(refused[(gpu_model, gpu_count)])
                continue
            if job is None and (trialjob.get("status") or {}).get("phase") not in {
                "Succeeded",
                "Failed",
            }:
                try:
                    job = await self.kube.create(JOBS, manifest, ns)
                    log.info(
                        "trial job created",
                        extra={"trialjob": name, "job": manifest["metadata"]["name"]},
                    )
                except Conflict:
                    job = await self.kube.get(JOBS, manifest["metadata"]["name"], ns)
                except ApiError as exc:
                    # Refused for good (invalid, forbidden): the trial ends here, said where a
                    # user looks, instead of holding the measured job for ever.
                    trials.append(await self._refused(trialjob, gpu_model, gpu_count, exc))
                    continue
            record = None
            recording = False
            if job is not None and finished(job) is not None:
                uid = job["metadata"]["uid"]
                record = await self.records.get(ns, job["metadata"]["name"], uid)
                recording = record is None and await self.profiled(uid)
            trials.append(trial_entry(gpu_model, gpu_count, job, record, recording=recording))
        status = trial_status(trials)
        if (trialjob.get("status") or {}) != status:
            # Deleted meanwhile? Its Jobs go with it (owner references).
            with contextlib.suppress(NotFound):
                await self.kube.patch(TRIALJOBS, name, {"status": status}, ns, sub="status")
        return status

    async def _refused(
        self, trialjob: Mapping[str, Any], gpu_model: str, gpu_count: int, exc: ApiError
    ) -> dict[str, Any]:
        message = f"trial Job on {gpu_count}x {gpu_model} refused by the API server: {exc}"
        log.error("trial job refused", extra={"trialjob": trialjob["metadata"]["name"],
                                              "error": str(exc)})  # fmt: skip
        with contextlib.suppress(ApiError, Unavailable):
            await self.kube.event(
                dict(trialjob), reason="TrialRefused", message=message[:1000], type_="Warning"
            )
        return {"gpuModel": gpu_model, "gpuCount": gpu_count, "phase": REFUSED,
                "message": message[:1000]}  # fmt: skip

    async def on_trialjob(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            await self.reconcile(obj)

    async def on_finalized(self, owner: Mapping[str, Any]) -> None:
        """The aggregator wrote a job's record: if it was a trial, update the parent."""
        await self.on_job("MODIFIED", dict(owner))

    async def on_job(self, kind: str, job: dict[str, Any]) -> None:
        """A trial Job changed: the parent's status may have to follow."""
        parent = (job.get("metadata", {}).get("labels") or {}).get(LABEL_TRIALJOB)
        if kind == "DELETED" or not parent or finished(job) is None:
            return
        try:
            trialjob = await self.kube.get(TRIALJOBS, parent, job["metadata"]["namespace"])
        except NotFound:
            return
        await self.reconcile(trialjob)
