"""TrialJob: one trial Job per candidate, status from what the trials measured."""

from __future__ import annotations

from typing import Any

from alnair.common import resources as res
from alnair.common.annotations import JobModel, job_model, object_model
from alnair.common.records import ExecutionRecord
from alnair.profiler.trialjob import (
    ANN_TRIAL_OF,
    LABEL_TRIALJOB,
    candidates,
    trial_entry,
    trial_job_manifest,
    trial_job_name,
    trial_status,
)


def trialjob(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "TrialJob",
        "metadata": {
            "name": "resnet-dry-run",
            "namespace": "ml",
            "uid": "tj-uid",
            "annotations": {
                res.ANN_MODEL_NAME: "ResNet-50",
                res.ANN_BATCH_SIZE: "64",
                "unrelated": "x",
            },
        },
        "spec": {
            "durationSeconds": 20,
            "candidates": [
                {"gpuModel": "V100M32", "gpuCount": 1},
                {"gpuModel": "K80", "gpuCount": 2},
            ],
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "train",
                            "image": "train:1",
                            "resources": {"requests": {"cpu": "2"}},
                        }
                    ]
                }
            },
            **spec,
        },
    }


def finished_job(name: str, condition: str = "Complete") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"{name}-uid"},
        "status": {
            "conditions": [
                {"type": condition, "status": "True", "lastTransitionTime": "2026-01-01T00:00:20Z"}
            ]
        },
    }


def test_names_are_stable_and_valid() -> None:
    assert trial_job_name("resnet-dry-run", "V100M32", 1) == "resnet-dry-run-v100m32-x1"
    long = trial_job_name("x" * 80, "A100M80", 8)
    assert len(long) <= 63
    assert long.endswith("-a100m80-x8")
    assert candidates(trialjob()) == [("V100M32", 1), ("K80", 2)]


def test_trial_job_pins_model_sets_gpus_and_carries_model_annotations() -> None:
    tj = trialjob()
    job = trial_job_manifest(tj, "K80", 2)
    meta = job["metadata"]
    assert meta["name"] == "resnet-dry-run-k80-x2"
    assert meta["labels"] == {LABEL_TRIALJOB: "resnet-dry-run"}
    assert meta["annotations"] == {
        res.ANN_MODEL_NAME: "ResNet-50",
        res.ANN_BATCH_SIZE: "64",
        ANN_TRIAL_OF: "resnet-dry-run",
    }
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrialJob", "tj-uid", True)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {res.LABEL_GPU_MODEL: "K80"}
    assert pod["schedulerName"] == res.SCHEDULER_NAME
    assert pod["containers"][0]["resources"]["limits"] == {res.GPU: "2"}
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "2"}
    tann = job["spec"]["template"]["metadata"]["annotations"]
    assert tann[res.ANN_DURATION] == "20s"
    assert tann[res.ANN_MODEL_NAME] == "ResNet-50"
    assert job["spec"]["activeDeadlineSeconds"] > 20
    # The TrialJob's own template is not modified.
    assert "limits" not in tj["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_seed_spelled_model_annotations_reach_the_trial_job() -> None:
    tj = trialjob()
    tj["metadata"]["annotations"] = {"model_name": "ResNet-50", "epoch": "3", "unrelated": "x"}
    job = trial_job_manifest(tj, "V100M32", 1)
    assert object_model(job) == JobModel(model_name="ResNet-50", epoch="3")
    tann = job["spec"]["template"]["metadata"]["annotations"]
    assert job_model(tann) == JobModel(model_name="ResNet-50", epoch="3")
    assert "unrelated" not in job["metadata"]["annotations"]


def record(name: str, throughput: float | None = None) -> ExecutionRecord:
    return ExecutionRecord(
        namespace="ml",
        job_name=name,
        uid=f"{name}-uid",
        model_name="ResNet-50",
        gpu_model="V100M32",
        gpu_count=1,
        submit_ts=0.0,
        start_ts=1.0,
        end_ts=21.0,
        throughput_steps_per_s=throughput,
        peak_gpu_mem_mib=6200.0,
        mean_gpu_util_pct=91.5,
        outcome="succeeded",
    )


def test_status_follows_the_trials() -> None:
    pending = trial_entry("V100M32", 1, None, None)
    running = trial_entry("K80", 2, {"metadata": {"name": "j2"}, "status": {}}, None)
    assert (pending["phase"], running["phase"]) == ("Pending", "Running")
    assert trial_status([pending, running])["phase"] == "Running"
    assert trial_status([pending])["phase"] == "Pending"
    measured = trial_entry("V100M32", 1, finished_job("j1"), record("j1", throughput=4.5))
    assert measured == {
        "gpuModel": "V100M32",
        "gpuCount": 1,
        "job": "j1",
        "phase": "Measured",
        "record": "alnair:record:ml/j1/j1-uid",
        "durationSeconds": 20.0,
        "peakGpuMemMib": 6200.0,
        "meanGpuUtilPct": 91.5,
        "throughputStepsPerS": 4.5,
    }
    # Ended and profiled, record not written yet: not final.
    assert trial_entry("K80", 2, finished_job("j2"), None, recording=True)["phase"] == "Running"
    unprofiled = trial_entry("K80", 2, finished_job("j2", "Failed"), None)
    assert unprofiled["phase"] == "Finished"
    done = trial_status([measured, unprofiled])
    assert (done["phase"], done["total"], done["finished"]) == ("Succeeded", 2, 2)
    assert trial_status([unprofiled])["phase"] == "Failed"


def test_a_template_copied_from_a_job_loses_that_jobs_controller_labels() -> None:
    """Found by `make demo`: the dispatcher's TrialJob carried the measured Job's template,
    labels from Kubernetes' Job controller included, and the API server refused every trial
    Job made from it (422: its selector does not match `controller-uid`)."""
    tj = trialjob()
    labels = tj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
    labels.update({"controller-uid": "u1", "job-name": "train", "team": "ml",
                   "batch.kubernetes.io/controller-uid": "u1",
                   "batch.kubernetes.io/job-name": "train"})  # fmt: skip
    job = trial_job_manifest(tj, "K80", 1)
    assert job["spec"]["template"]["metadata"]["labels"] == {
        "team": "ml", LABEL_TRIALJOB: "resnet-dry-run",
    }  # fmt: skip


def test_a_gpu_request_copied_from_the_job_follows_the_trials_count() -> None:
    """Found by `make chaos`: a 2-GPU Job's template asked 2 GPUs where the trial limits 1,
    and the API server refuses an extended resource whose request is not its limit."""
    tj = trialjob()
    resources = tj["spec"]["template"]["spec"]["containers"][0]["resources"]
    resources["requests"][res.GPU] = "2"
    resources["limits"] = {res.GPU: "2"}
    job = trial_job_manifest(tj, "V100M32", 1)
    got = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert got == {"requests": {"cpu": "2", res.GPU: "1"}, "limits": {res.GPU: "1"}}
