"""The kind adapters: which objects of each kind go through a queue, how they are keyed, what
they ask for, when they have finished; the admission webhook holds exactly what they queue."""

from __future__ import annotations

from typing import Any

import pytest

from alnair.common.errors import InvalidValueError
from alnair.scheduler.dispatcher.kinds import ELASTIC, JOB, JOBSET, KINDS, POD
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE
from alnair.scheduler.dispatcher.webhook import hold_patch


def job(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    return {
        "metadata": {"name": "train", "namespace": "team-a", "labels": labels or {}},
        "spec": {"parallelism": 3, "template": {"spec": {"containers": [container]}}, **spec},
    }


def elastic(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"minReplicas": 2, "maxReplicas": 4, "gpusPerWorker": 1, "template": {}, **spec},
    }


@pytest.mark.parametrize(
    ("kind", "obj", "queued"),
    [
        (JOB, job({LABEL_QUEUE: "lq"}), True),
        (JOB, job({LABEL_QUEUE: "lq"}, managedBy="kubernetes.io/job-controller"), True),
        (JOB, job({LABEL_QUEUE: "lq"}, managedBy="alnair.io/multicluster"), False),
        (JOB, job({LABEL_QUEUE: "lq"}, managedBy="jobset.sigs.k8s.io/jobset-controller"), False),
        (JOB, job(), False),
        (ELASTIC, elastic(queue="lq"), True),
        (ELASTIC, {**elastic(), "metadata": {"name": "e", "labels": {LABEL_QUEUE: "lq"}}}, True),
        (ELASTIC, elastic(), False),
        (ELASTIC, elastic(queue=""), False),
    ],
)
def test_queued_is_what_the_webhook_holds(kind: Any, obj: dict[str, Any], queued: bool) -> None:
    assert kind.queued(obj) is queued
    holds = [op for op in hold_patch(kind.kind, obj) if op["path"] == "/spec/suspend"]
    assert bool(holds) is queued


def test_a_job_and_an_elastic_job_of_one_name_do_not_collide() -> None:
    assert JOB.key("team-a", "train") != ELASTIC.key("team-a", "train")
    assert JOB.key_of(job()) == "team-a/train"


def test_each_kind_parses_its_pod_sets_and_says_when_it_finished() -> None:
    wl = JOB.parse(job({LABEL_QUEUE: "lq"}), 60.0)
    assert (wl.request.gpus, wl.request.pods, wl.kind, wl.local_queue) == (6, 3, "Job", "lq")
    ewl = ELASTIC.parse(elastic(queue="lq"), 60.0)
    assert (ewl.request.gpus, ewl.request.pods, ewl.kind, ewl.local_queue) == (
        2, 2, "ElasticJob", "lq",
    )  # fmt: skip
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert JOB.finished({**job(), **done}) == "Complete"
    assert ELASTIC.finished({**elastic(), "status": {"phase": "Failed"}}) == "Failed"
    assert JOB.finished(job()) is None and ELASTIC.finished(elastic()) is None


def test_events_name_the_kind() -> None:
    assert KINDS["ElasticJob"].ref(elastic())["kind"] == "ElasticJob"
    assert KINDS["Job"].ref(job())["apiVersion"] == "batch/v1"
    assert JOB.writes_conditions and not ELASTIC.writes_conditions


def pod(labels: dict[str, str] | None = None, gpus: str = "1", **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {
        "metadata": {"name": "train", "namespace": "team-a", "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def test_a_pod_of_its_own_is_one_pod_held_by_its_gate_and_released_with_the_model() -> None:
    gate = {"name": "alnair.io/admission"}
    p = pod({LABEL_QUEUE: "lq"}, gpus="2", schedulingGates=[gate, {"name": "other"}])
    assert POD.queued(p)
    wl = POD.parse(p, 60.0)
    assert (wl.request.gpus, wl.request.pods, wl.held, wl.kind) == (2, 1, True, "Pod")
    assert wl.key == POD.key_of(p) != JOB.key_of(p)
    assert POD.release(wl, "A100") == {
        "schedulingGates": [{"name": "other"}],
        "nodeSelector": {"alnair.io/gpu-model": "A100"},
    }
    ungated = POD.parse(pod({LABEL_QUEUE: "lq"}), 60.0)
    assert not ungated.held  # running outside the queue (created while the webhook was off)
    assert POD.release(ungated, "T4")["schedulingGates"] is None
    assert POD.reclaim == "evict" and JOB.reclaim == ELASTIC.reclaim == "suspend"
    assert POD.finished({**p, "status": {"phase": "Succeeded"}}) == "Succeeded"
    assert POD.finished({**p, "status": {"phase": "Running"}}) is None


def test_a_pod_whose_request_cannot_be_read_is_told_its_own_field() -> None:
    with pytest.raises(InvalidValueError) as bad:
        POD.parse(pod({LABEL_QUEUE: "lq"}, gpus="two"), 60.0)
    assert bad.value.field == "spec.containers[0].resources.nvidia.com/gpu"


def jobset_obj(**spec: Any) -> dict[str, Any]:
    def rj(name: str, replicas: int, gpus: str | None, parallelism: int = 1) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name}
        if gpus is not None:
            c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        job = {"parallelism": parallelism, "template": {"spec": {"containers": [c]}}}
        return {"name": name, "replicas": replicas, "template": {"spec": job}}

    return {
        "metadata": {"name": "js", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}},
        "spec": {
            "replicatedJobs": [rj("workers", 3, "2", parallelism=2), rj("driver", 1, None)],
            **spec,
        },
    }


def test_a_jobset_counts_every_replicated_job_and_releases_each_with_the_model() -> None:
    js = jobset_obj(suspend=True)
    assert JOBSET.queued(js)
    assert not JOBSET.queued({**js, "spec": {**js["spec"], "managedBy": "kueue.x-k8s.io/x"}})
    wl = JOBSET.parse(js, 60.0)
    # 3 replicas x 2 pods x 2 GPUs; the driver asks for none and counts for nothing.
    assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod, wl.held) == (12, 6, 2, True)
    assert wl.key == "jobset:team-a/js"
    released = JOBSET.release(wl, "H100")
    assert released["suspend"] is False
    for rj in released["replicatedJobs"]:
        pod_spec = rj["template"]["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"] == {"alnair.io/gpu-model": "H100"}
        assert pod_spec["containers"]  # the rest of the template kept
    assert (
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].get("nodeSelector")
        is None
    )  # the informer's copy is not changed in place
    done = {"status": {"conditions": [{"type": "Completed", "status": "True"}]}}
    assert JOBSET.finished({**js, **done}) == "Completed" and JOBSET.finished(js) is None
    assert JOBSET.optional and not JOB.optional


def test_a_jobset_without_gpus_or_with_a_bad_count_is_named() -> None:
    js = jobset_obj()
    js["spec"]["replicatedJobs"] = js["spec"]["replicatedJobs"][1:]
    with pytest.raises(InvalidValueError, match="at least one replicated Job"):
        JOBSET.parse(js, 60.0)
    bad = jobset_obj()
    containers = bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    containers["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots"
    with pytest.raises(InvalidValueError) as named:
        JOBSET.parse(bad, 60.0)
    assert named.value.field.startswith("spec.replicatedJobs[0].template.spec.template.spec.")


def test_kueues_queue_label_queues_too_and_alnairs_wins_when_both_are_set() -> None:
    kueue = job({"kueue.x-k8s.io/queue-name": "kq"})
    assert JOB.queued(kueue) and JOB.parse(kueue, 60.0).local_queue == "kq"
    both = job({"kueue.x-k8s.io/queue-name": "kq", LABEL_QUEUE: "lq"})
    assert JOB.parse(both, 60.0).local_queue == "lq"
    assert POD.queued(pod({"kueue.x-k8s.io/queue-name": "kq"}))
    assert list(JOB.label_selectors) == [LABEL_QUEUE, "kueue.x-k8s.io/queue-name"]
    assert ELASTIC.label_selectors == (None,)
    held = [op["path"] for op in hold_patch("Job", kueue)]
    assert held == ["/spec/suspend"]


def test_after_pods_were_not_ready_a_job_backs_off_then_is_deactivated() -> None:
    from alnair.scheduler.dispatcher.pods_ready import backing_off

    def held(**annotations: str) -> Any:
        obj = job({LABEL_QUEUE: "lq"}, suspend=True)
        obj["metadata"]["annotations"] = annotations
        return JOB.parse(obj, 60.0)

    assert backing_off(held(), 100.0, 3) is None
    once = held(**{"alnair.io/pods-not-ready-evictions": "1", "alnair.io/requeue-at": "160"})
    assert backing_off(once, 100.0, 3) == (
        "backing off after its pods were not ready, until 160",
        160.0,
    )
    assert backing_off(once, 170.0, 3) is None  # queued again
    thrice = held(**{"alnair.io/pods-not-ready-evictions": "3"})
    reason = backing_off(thrice, 100.0, 3)
    assert reason is not None and reason[0].startswith("deactivated") and reason[1] is None
    nonsense = held(**{"alnair.io/pods-not-ready-evictions": "x", "alnair.io/requeue-at": "y"})
    assert backing_off(nonsense, 100.0, 3) is None


@pytest.mark.parametrize(
    ("kind", "status", "ready"),
    [
        (JOB, {"ready": 4, "succeeded": 2}, True),  # parallelism 3 x 2 GPUs: 6 pods
        (JOB, {"ready": 5}, False),
        (POD, {"conditions": [{"type": "Ready", "status": "True"}]}, True),
        (POD, {"phase": "Pending"}, False),
        (ELASTIC, {"readyReplicas": 2}, True),
        (ELASTIC, {"readyReplicas": 1}, False),
        (JOBSET, {"replicatedJobsStatus": [{"ready": 3}, {"succeeded": 1}]}, True),
        (JOBSET, {"replicatedJobsStatus": [{"ready": 3}]}, False),
    ],
)
def test_ready_means_every_pod_admitted_for(kind: Any, status: dict[str, Any], ready: bool) -> None:
    objs = {
        "Job": job({LABEL_QUEUE: "lq"}, parallelism=6),
        "Pod": pod({LABEL_QUEUE: "lq"}),
        "ElasticJob": elastic(queue="lq"),
        "JobSet": jobset_obj(),
    }
    obj = {**objs[kind.kind], "status": status}
    assert kind.ready(kind.parse(obj, 60.0)) is ready


def test_a_serving_deployment_is_held_by_its_pods_and_admitted_whole() -> None:
    from alnair.scheduler.dispatcher.kinds import DEPLOYMENT, STATEFULSET

    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    dep = {
        "metadata": {"name": "web", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}},
        "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "web"}},
                                             "spec": {"containers": [container]}}},
    }  # fmt: skip
    assert DEPLOYMENT.queued(dep)
    assert not DEPLOYMENT.queued({**dep, "spec": {**dep["spec"], "replicas": 0}})
    assert hold_patch("Deployment", dep) == [
        {"op": "add", "path": "/spec/template/metadata/labels/alnair.io~1workload",
         "value": "deployment.web"}
    ]  # fmt: skip
    bare = {**dep, "spec": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}
    assert STATEFULSET.hold(bare) == [
        {"op": "add", "path": "/spec/template/metadata",
         "value": {"labels": {"alnair.io/workload": "statefulset.web"}}}
    ]  # fmt: skip
    wl = DEPLOYMENT.parse(dep, 60.0)
    assert (wl.request.gpus, wl.request.pods, wl.held, wl.key) == (
        6,
        3,
        True,
        "deployment:team-a/web",
    )
    assert DEPLOYMENT.release(wl, "A100") == {}  # nothing in the spec: its pods are ungated
    assert not DEPLOYMENT.writable and DEPLOYMENT.reclaim == "regate"
    assert DEPLOYMENT.finished(dep) is None  # serving: runs until deleted
    # A pod its ReplicaSet makes carries the label: gated, though a controller owns it.
    owner = {"kind": "ReplicaSet", "name": "web-1", "uid": "u", "controller": True}
    rs_pod = {"metadata": {"name": "web-1-x", "labels": {"alnair.io/workload": "deployment.web"},
                           "ownerReferences": [owner]}, "spec": {}}  # fmt: skip
    assert hold_patch("Pod", rs_pod) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "alnair.io/admission"}]}
    ]


def lws_obj(size: Any = 3, leader: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    worker = {
        "spec": {"containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    }
    lwt: dict[str, Any] = {"size": size, "workerTemplate": worker}
    if leader is not None:
        lwt["leaderTemplate"] = leader
    return {
        "metadata": {"name": "infer", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}},
        "spec": {"replicas": 2, "leaderWorkerTemplate": lwt, **spec},
    }


def test_a_leaderworkerset_counts_every_group_and_labels_both_templates() -> None:
    from alnair.scheduler.dispatcher.kinds import LEADERWORKERSET

    coordinator = {
        "metadata": {"labels": {"role": "leader"}},
        "spec": {"containers": [{"name": "l"}]},
    }
    obj = lws_obj(leader=coordinator)
    assert LEADERWORKERSET.queued(obj) and LEADERWORKERSET.optional
    assert hold_patch("LeaderWorkerSet", obj) == [
        {"op": "add",
         "path": "/spec/leaderWorkerTemplate/leaderTemplate/metadata/labels/alnair.io~1workload",
         "value": "leaderworkerset.infer"},
        {"op": "add", "path": "/spec/leaderWorkerTemplate/workerTemplate/metadata",
         "value": {"labels": {"alnair.io/workload": "leaderworkerset.infer"}}},
    ]  # fmt: skip
    # Two groups of a leader asking nothing and two workers of 2 GPUs: 8 GPUs, 6 pods gated.
    wl = LEADERWORKERSET.parse(obj, 60.0)
    assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == (8, 6, 2)
    assert wl.key == "leaderworkerset:team-a/infer" and wl.held
    # No leader template: the leader is a worker too (2 groups x 3 pods x 2 GPUs).
    wl = LEADERWORKERSET.parse(lws_obj(), 60.0)
    assert (wl.request.gpus, wl.request.pods) == (12, 6)
    assert hold_patch("LeaderWorkerSet", lws_obj()) == [
        {"op": "add", "path": "/spec/leaderWorkerTemplate/workerTemplate/metadata",
         "value": {"labels": {"alnair.io/workload": "leaderworkerset.infer"}}},
    ]  # fmt: skip
    assert LEADERWORKERSET.reclaim == "regate" and not LEADERWORKERSET.writable
    assert LEADERWORKERSET.finished(obj) is None
    assert LEADERWORKERSET.ready(LEADERWORKERSET.parse({**obj, "status": {"readyReplicas": 2}}, 60))
    assert not LEADERWORKERSET.ready(
        LEADERWORKERSET.parse({**obj, "status": {"readyReplicas": 1}}, 60)
    )


def test_a_leaderworkerset_whose_request_cannot_be_read_is_told_its_field() -> None:
    from alnair.scheduler.dispatcher.kinds import LEADERWORKERSET

    with pytest.raises(InvalidValueError) as bad_size:
        LEADERWORKERSET.parse(lws_obj(size="two"), 60.0)
    assert bad_size.value.field == "spec.leaderWorkerTemplate.size"
    leader = {
        "spec": {"containers": [{"name": "l", "resources": {"limits": {"nvidia.com/gpu": "-1"}}}]}
    }
    with pytest.raises(InvalidValueError) as bad_gpu:
        LEADERWORKERSET.parse(lws_obj(leader=leader), 60.0)
    assert bad_gpu.value.field == (
        "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].resources.nvidia.com/gpu"
    )
    with pytest.raises(InvalidValueError) as missing:
        LEADERWORKERSET.parse({**lws_obj(), "spec": {"replicas": 1}}, 60.0)
    assert missing.value.field == "spec.leaderWorkerTemplate.workerTemplate"


def test_a_pod_group_is_admitted_whole_from_what_it_states_and_done_when_its_pods_are() -> None:
    from alnair.scheduler.dispatcher.kinds import PODGROUP

    group = {
        "metadata": {"name": "g", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}},
        "spec": {"minMember": 3, "minResources": {"nvidia.com/gpu": "4"}},
    }
    assert PODGROUP.queued(group) and not PODGROUP.writable and PODGROUP.reclaim == "regate"
    wl = PODGROUP.parse(group, 60.0)
    assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == (4, 3, 2)
    assert wl.key == "podgroup:team-a/g" and wl.held
    # Its pods are gated and labelled as its members; a Pod of its own is not one.
    member = pod(labels={LABEL_QUEUE: "lq", "scheduling.x-k8s.io/pod-group": "g"})
    assert not POD.queued(member)
    assert hold_patch("Pod", member) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "alnair.io/admission"}]},
        {"op": "add", "path": "/metadata/labels/alnair.io~1workload", "value": "podgroup.g"},
    ]
    # A pod some controller owns is admitted with its owner, group label or not.
    owned = {**member, "metadata": {**member["metadata"], "ownerReferences": [
        {"kind": "Job", "name": "j", "uid": "u", "controller": True}]}}  # fmt: skip
    assert hold_patch("Pod", owned) == []
    # An ElasticJob's own PodGroup carries no queue label: admitted with its job.
    assert not PODGROUP.queued({**group, "metadata": {"name": "e", "namespace": "team-a"}})

    def ran(phase: str) -> dict[str, Any]:
        return {"status": {"phase": phase}}

    assert PODGROUP.finished_by_pods is not None
    done = PODGROUP.finished_by_pods
    assert done(group, [ran("Succeeded")] * 2) is None  # fewer than minMember so far
    assert done(group, [ran("Succeeded"), ran("Succeeded"), ran("Running")]) is None
    assert done(group, [ran("Succeeded")] * 3) == "Succeeded"
    assert done(group, [ran("Succeeded"), ran("Failed"), ran("Succeeded")]) == "Failed"


def test_a_pod_group_that_states_no_gpus_is_told_its_field() -> None:
    from alnair.scheduler.dispatcher.kinds import PODGROUP

    meta = {"name": "g", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}}
    with pytest.raises(InvalidValueError) as missing:
        PODGROUP.parse({"metadata": meta, "spec": {"minMember": 2}}, 60.0)
    assert missing.value.field == "spec.minResources"
    with pytest.raises(InvalidValueError) as bad:
        PODGROUP.parse(
            {"metadata": meta, "spec": {"minMember": 2, "minResources": {"nvidia.com/gpu": 0}}},
            60.0,
        )
    assert bad.value.field == "spec.minResources.nvidia.com/gpu"


def ray_template(gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "ray"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"spec": {"containers": [container]}}


def ray_cluster_spec() -> dict[str, Any]:
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": ray_template(0)},
        "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 4,
             "numOfHosts": 2, "rayStartParams": {}, "template": ray_template(1)},
            {"groupName": "idle", "replicas": 3, "suspend": True, "rayStartParams": {},
             "template": ray_template(1)},
        ],
    }  # fmt: skip


def test_ray_clusters_and_jobs_count_every_group_and_release_gpu_templates_with_the_model() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import RAYCLUSTER, RAYJOB

    meta = {"name": "r", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}}
    cluster = {"metadata": meta, "spec": ray_cluster_spec()}
    job = {"metadata": meta, "spec": {"entrypoint": "python train.py",
                                      "rayClusterSpec": ray_cluster_spec()}}  # fmt: skip
    for kind, obj in ((RAYCLUSTER, cluster), (RAYJOB, job)):
        assert kind.queued(obj) and kind.optional and kind.reclaim == "suspend"
        assert hold_patch(kind.kind, obj) == [{"op": "add", "path": "/spec/suspend", "value": True}]
        # 2 replicas x 2 hosts of one GPU; the head asks none; a suspended group has no pods.
        wl = kind.parse({**obj, "spec": {**obj["spec"], "suspend": True}}, 60.0)
        assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == (4, 4, 1)
        assert wl.held and wl.key == f"{kind.kind.lower()}:team-a/r"
        # Someone else's: KubeRay's MultiKueue, or a RayJob's own cluster.
        assert not kind.queued(
            {**obj, "spec": {**obj["spec"], "managedBy": "kueue.x-k8s.io/multikueue"}}
        )
        owned = {
            **meta,
            "ownerReferences": [{"kind": "RayJob", "name": "j", "uid": "u", "controller": True}],
        }
        assert not kind.queued({**obj, "metadata": owned})
    released = RAYCLUSTER.release(RAYCLUSTER.parse(cluster, 60.0), "A100")
    assert released["suspend"] is False
    assert "nodeSelector" not in released["headGroupSpec"]["template"]["spec"]
    for group in released["workerGroupSpecs"]:
        assert group["template"]["spec"]["nodeSelector"] == {"alnair.io/gpu-model": "A100"}
    assert [g["groupName"] for g in released["workerGroupSpecs"]] == ["gpu", "idle"]
    released = RAYJOB.release(RAYJOB.parse(job, 60.0), "A100")
    assert released["suspend"] is False
    worker = released["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["nodeSelector"] == {"alnair.io/gpu-model": "A100"}
    assert RAYJOB.finished({**job, "status": {"jobDeploymentStatus": "Running"}}) is None
    assert RAYJOB.finished({**job, "status": {"jobDeploymentStatus": "Complete"}}) == "Complete"
    assert (
        RAYJOB.finished({**job, "status": {"jobDeploymentStatus": "ValidationFailed"}}) == "Failed"
    )
    assert RAYCLUSTER.finished({**cluster, "status": {"state": "ready"}}) is None


def test_a_ray_job_on_an_existing_cluster_or_without_gpus_is_told_its_field() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import RAYCLUSTER, RAYJOB

    meta = {"name": "r", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}}
    with pytest.raises(InvalidValueError) as selector:
        RAYJOB.parse({"metadata": meta, "spec": {"clusterSelector": {"ray.io/cluster": "c"}}}, 60)
    assert selector.value.field == "spec.rayClusterSpec"
    spec = ray_cluster_spec()
    spec["workerGroupSpecs"][0]["numOfHosts"] = 0
    with pytest.raises(InvalidValueError) as hosts:
        RAYCLUSTER.parse({"metadata": meta, "spec": spec}, 60)
    assert hosts.value.field == "spec.workerGroupSpecs[0].numOfHosts"
    cpu_only = {"headGroupSpec": {"template": ray_template(0)}, "workerGroupSpecs": []}
    with pytest.raises(InvalidValueError) as none:
        RAYCLUSTER.parse({"metadata": meta, "spec": cpu_only}, 60)
    assert "must ask for nvidia.com/gpu" in str(none.value)


def torch_runtime(initializer_gpus: int = 0) -> dict[str, Any]:
    """A ClusterTrainingRuntime shaped as Kubeflow Trainer ships its torch one: a trainer Job
    `node` and a dataset initializer."""

    def job(name: str, step: str, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": name}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        return {
            "name": name,
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}},
                "spec": {"template": {"spec": {"containers": [container]}}},
            },
        }

    return {
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [
                job("dataset-initializer", "dataset-initializer", initializer_gpus),
                job("node", "trainer", 0),
            ]}},
        },
    }  # fmt: skip


def test_a_train_job_asks_what_its_runtime_and_trainer_say_and_is_released_by_overrides() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import TRAINJOB

    meta = {"name": "ft", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}}
    tj = {
        "metadata": meta,
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "2"}}},
            "podSpecOverrides": [{"targetJobs": [{"name": "node"}], "tolerations": []}],
        },
    }
    assert TRAINJOB.queued(tj) and TRAINJOB.optional and TRAINJOB.references
    assert hold_patch("TrainJob", tj) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    runtimes = {"torch-distributed": torch_runtime()}

    def lookup(resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert resource.plural == "clustertrainingruntimes" and namespace is None
        return runtimes.get(name)

    assert TRAINJOB.resolve is not None
    wl = TRAINJOB.parse(TRAINJOB.resolve(tj, lookup), 60.0)
    # The trainer Job: 3 nodes of 2 GPUs; the initializer asks none.
    assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == (6, 3, 2)
    released = TRAINJOB.release(wl, "A100")
    assert released["suspend"] is False
    assert released["podSpecOverrides"] == [
        {"targetJobs": [{"name": "node"}], "tolerations": []},
        {"targetJobs": [{"name": "node"}], "nodeSelector": {"alnair.io/gpu-model": "A100"}},
    ]
    # Admitted again after a preemption: its earlier override is replaced, not repeated.
    again = {**wl.obj, "spec": {**wl.obj["spec"], "podSpecOverrides": released["podSpecOverrides"]}}
    assert TRAINJOB.release(TRAINJOB.parse(again, 60.0), "H100")["podSpecOverrides"][1:] == [
        {"targetJobs": [{"name": "node"}], "nodeSelector": {"alnair.io/gpu-model": "H100"}}
    ]
    # Without numNodes or resources, the runtime's say: one node, asking what its template asks.
    runtimes["torch-distributed"] = torch_runtime(initializer_gpus=1)
    bare = {"metadata": meta, "spec": {"runtimeRef": {"name": "torch-distributed"}}}
    wl = TRAINJOB.parse(TRAINJOB.resolve(bare, lookup), 60.0)
    assert (wl.request.gpus, wl.request.pods) == (1, 1)
    assert TRAINJOB.finished({**tj, "status": {"conditions": [
        {"type": "Complete", "status": "True"}]}}) == "Complete"  # fmt: skip


def test_a_train_job_naming_no_runtime_or_no_gpus_is_told_its_field() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import TRAINJOB

    meta = {"name": "ft", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}}
    tj = {"metadata": meta, "spec": {"runtimeRef": {"name": "nope"}}}
    assert TRAINJOB.resolve is not None
    with pytest.raises(InvalidValueError) as missing:
        TRAINJOB.parse(TRAINJOB.resolve(tj, lambda *_: None), 60.0)
    assert missing.value.field == "spec.runtimeRef.name" and missing.value.value == "nope"
    found = TRAINJOB.resolve(tj, lambda *_: torch_runtime())
    with pytest.raises(InvalidValueError) as no_gpus:
        TRAINJOB.parse(found, 60.0)
    assert no_gpus.value.field == "spec.trainer.resourcesPerNode"


def kubeflow_job(field: str, roles: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """A Kubeflow v1 job: each role (replicas, GPUs per pod)."""
    return {
        "metadata": {"name": "k", "namespace": "team-a", "labels": {LABEL_QUEUE: "lq"}},
        "spec": {
            field: {
                role: {"replicas": replicas, "restartPolicy": "OnFailure",
                       "template": ray_template(gpus)}
                for role, (replicas, gpus) in roles.items()
            },
        },
    }  # fmt: skip


def test_pytorch_and_mpi_jobs_count_every_role_and_are_held_by_their_run_policy() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import MPIJOB, PYTORCHJOB

    pytorch = kubeflow_job("pytorchReplicaSpecs", {"Master": (1, 2), "Worker": (3, 2)})
    mpi = kubeflow_job("mpiReplicaSpecs", {"Launcher": (1, 0), "Worker": (2, 4)})
    for kind, obj, asked in ((PYTORCHJOB, pytorch, (8, 4, 2)), (MPIJOB, mpi, (8, 2, 4))):
        assert kind.queued(obj) and kind.optional and kind.reclaim == "suspend"
        hold = hold_patch(kind.kind, obj)
        assert {"op": "add", "path": "/spec/runPolicy", "value": {"suspend": True}} in hold
        with_policy = {**obj, "spec": {**obj["spec"], "runPolicy": {"cleanPodPolicy": "All"}}}
        assert {"op": "add", "path": "/spec/runPolicy/suspend", "value": True} in hold_patch(
            kind.kind, with_policy
        )
        held = {**obj, "spec": {**obj["spec"], "runPolicy": {"suspend": True}}}
        assert hold_patch(kind.kind, held) == []
        wl = kind.parse(held, 60.0)
        assert (wl.request.gpus, wl.request.pods, wl.request.gpus_per_pod) == asked
        assert wl.held and wl.key == f"{kind.kind.lower()}:team-a/k"
        assert not kind.parse(obj, 60.0).held
        # Reclaimed through the run policy, not `spec.suspend` (which it does not have).
        assert kind.suspension == {"runPolicy": {"suspend": True}}
        owned = {**obj["metadata"], "ownerReferences": [{"kind": "X", "name": "x", "uid": "u",
                                                         "controller": True}]}  # fmt: skip
        assert not kind.queued({**obj, "metadata": owned})
    released = MPIJOB.release(MPIJOB.parse(mpi, 60.0), "A100")
    # The launcher asks no GPU and may run anywhere; the map merges role by role.
    assert released == {
        "runPolicy": {"suspend": False},
        "mpiReplicaSpecs": {
            "Worker": {"template": {"spec": {"nodeSelector": {"alnair.io/gpu-model": "A100"}}}}
        },
    }
    assert set(PYTORCHJOB.release(PYTORCHJOB.parse(pytorch, 60.0), "V100")[
        "pytorchReplicaSpecs"]) == {"Master", "Worker"}  # fmt: skip
    status = {"conditions": [{"type": "Created", "status": "True"},
                             {"type": "Running", "status": "True"}]}  # fmt: skip
    assert PYTORCHJOB.finished({**pytorch, "status": status}) is None
    assert PYTORCHJOB.ready(PYTORCHJOB.parse({**pytorch, "status": status}, 60.0))
    assert not PYTORCHJOB.ready(PYTORCHJOB.parse(pytorch, 60.0))
    done = {"conditions": [{"type": "Running", "status": "False"},
                           {"type": "Succeeded", "status": "True"}]}  # fmt: skip
    assert PYTORCHJOB.finished({**pytorch, "status": done}) == "Succeeded"
    failed = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert MPIJOB.finished({**mpi, "status": failed}) == "Failed"


def test_a_kubeflow_job_without_gpus_or_with_a_bad_replica_spec_is_told_its_field() -> None:
    from alnair.scheduler.dispatcher.peer_kinds import MPIJOB, PYTORCHJOB

    with pytest.raises(InvalidValueError) as none:
        PYTORCHJOB.parse(kubeflow_job("pytorchReplicaSpecs", {"Master": (1, 0)}), 60.0)
    assert none.value.field == "spec.pytorchReplicaSpecs.*.template.spec.containers[].resources"
    bad = kubeflow_job("mpiReplicaSpecs", {"Launcher": (1, 0), "Worker": (2, 1)})
    bad["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = -1
    with pytest.raises(InvalidValueError) as count:
        MPIJOB.parse(bad, 60.0)
    assert count.value.field == "spec.mpiReplicaSpecs.Worker.replicas"
    with pytest.raises(InvalidValueError) as missing:
        MPIJOB.parse({"metadata": bad["metadata"], "spec": {}}, 60.0)
    assert missing.value.field == "spec.mpiReplicaSpecs"
    fraction = kubeflow_job("pytorchReplicaSpecs", {"Worker": (2, 1)})
    fraction["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"] = {"limits": {"alnair.io/gpu-memory": "4096"}}  # fmt: skip
    with pytest.raises(InvalidValueError) as frac:
        PYTORCHJOB.parse(fraction, 60.0)
    assert frac.value.field.startswith("spec.pytorchReplicaSpecs.Worker.template")
    assert "whole GPUs" in frac.value.reason
