"""The job dispatcher on the local control plane: queues, quotas, borrowing, preemption, memory.

Real kube-apiserver, Job controller and KWOK; the Alnair scheduler binds the admitted Jobs'
pods in this process; KWOK completes them after their `alnair.io/duration`. Each test has its
own node pool (a label the dispatcher selects on) and its own queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from alnair.common import resources as r
from alnair.common.bus import Bus
from alnair.common.events import JobEvent, JobPhase
from alnair.common.kube import (
    ADMISSION_POLICIES,
    ADMISSION_POLICY_BINDINGS,
    CLUSTERQUEUES,
    ELASTICJOBS,
    JOBS,
    LOCALQUEUES,
    TRIALJOBS,
    ApiError,
    KubeClient,
)
from alnair.common.progress import ANN_PREEMPTIONS
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.scheduler.dispatcher.app import Running as RunningDispatcher
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.parsing import (
    ANN_ADMITTED_TYPE,
    ANN_BORROWING,
    LABEL_QUEUE,
)
from dispatcher_support import (
    POOL,
    admitted_type,
    cluster_queue,
    cohort_queues,
    dispatcher_settings,
    events,
    explain,
    gpu_job,
    job,
    local_queue,
    scheduler,
)

pytestmark = pytest.mark.e2e


def finished_at(j: dict[str, Any]) -> float | None:
    for cond in (j.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Complete" and cond["status"] == "True":
            return time.time()
    return None


async def test_quota_borrowing_preemption_completion_and_restart(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "c", {"team-a": (4, 4), "team-b": (4, 4)})
    async with scheduler(kube):
        running: RunningDispatcher = await start_dispatcher(dispatcher_settings(control_plane, ns))
        try:
            # Team A fills its quota and borrows team B's idle half of the node.
            await kube.create(JOBS, gpu_job("a1", ns, "team-a", 4), ns)
            await wait_for(lambda: admitted_type(kube, ns, "a1"), 20)
            await kube.create(JOBS, gpu_job("a2", ns, "team-a", 4), ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "a2"), 20) == "V100M32"
            a2 = await job(kube, ns, "a2")
            assert a2["metadata"]["annotations"][ANN_BORROWING] == "true"
            assert a2["spec"]["template"]["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] == "V100M32"

            # The lender submits: the borrowed job is suspended and team B's job admitted.
            await kube.create(JOBS, gpu_job("b1", ns, "team-b", 4, duration_s=3), ns)
            await wait_for(lambda: admitted_type(kube, ns, "b1"), 20)
            a2 = await job(kube, ns, "a2")
            assert a2["spec"]["suspend"] is True
            assert a2["metadata"]["annotations"][ANN_PREEMPTIONS] == "1"
            assert await admitted_type(kube, ns, "a1") == "V100M32"  # in quota: untouched
            preempted = await wait_for(lambda: events(kube, ns, "a2", "Preempted"), 10)
            assert "b1" in preempted[0]["message"]

            # Queued behind b1 in team B's quota; b1's completion admits it (no timer).
            await kube.create(JOBS, gpu_job("b2", ns, "team-b", 4), ns)
            explained = await wait_for(
                lambda: explain(running, ns, "b2", lambda d: d["reason"] is not None), 10
            )
            assert explained["status"] == "waiting"
            assert explained["reason"]["kind"] in ("quota", "capacity", "reservation")
            assert explained["position"] == 1
            cond = await wait_for(lambda: _condition(kube, ns, "b2"), 10)
            assert (
                cond["status"] == "False" and cond["reason"] == explained["reason"]["kind"].title()
            )
            assert (await _condition(kube, ns, "a1") or {}).get("status") == "True"
            done = await wait_for(lambda: _completed(kube, ns, "b1"), 30, 0.02)
            await wait_for(lambda: admitted_type(kube, ns, "b2"), 5, 0.02)
            delay = time.time() - done
            assert delay < 1.0, f"b2 admitted {delay:.2f} s after b1 completed"

            cq = await kube.get(CLUSTERQUEUES, f"team-b-{ns}")
            assert cq["status"]["admittedWorkloads"] >= 1
            lq = await kube.get(LOCALQUEUES, "team-a", ns)
            assert lq["status"]["pendingWorkloads"] == 1  # a2 waits for room again
        finally:
            await running.stop()

        # A restarted dispatcher decides from the Jobs themselves: nothing admitted twice.
        before = {n: await admitted_type(kube, ns, n) for n in ("a1", "a2", "b2")}
        running = await start_dispatcher(dispatcher_settings(control_plane, ns))
        try:
            # Its first reconcile over the synced Jobs has ended: what it would admit, it has.
            await wait_for(lambda: running.dispatcher.reconciled >= 1, 10)
            after = {n: await admitted_type(kube, ns, n) for n in ("a1", "a2", "b2")}
            assert after == before
            for name in ("a1", "b1", "b2"):
                assert len(await events(kube, ns, name, "Admitted")) == 1, name
        finally:
            await running.stop()


def _reason(doc: dict[str, Any]) -> str | None:
    return (doc.get("reason") or {}).get("kind")


async def _condition(kube: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    conds = ((await job(kube, ns, name)).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "alnair.io/Admitted"), None)


def _since(j: dict[str, Any], kind: str) -> datetime | None:
    """When the Job's condition `kind` last turned True (None: it is not True)."""
    for cond in (j.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind and cond["status"] == "True":
            return datetime.fromisoformat(cond["lastTransitionTime"])
    return None


async def _completed(kube: KubeClient, ns: str, name: str) -> float | None:
    return finished_at(await job(kube, ns, name))


async def test_a_job_that_would_oom_on_t4_waits_for_a_v100(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    from alnair.predictor.app import start as start_predictor
    from alnair.predictor.settings import PredictorSettings

    ns = namespace
    await control_plane.create_gpu_nodes(
        "1x T4:4, 1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns}
    )
    await kube.create(CLUSTERQUEUES, cluster_queue(f"m-{ns}", None, {"T4": 4, "V100M32": 8}))
    await kube.create(LOCALQUEUES, local_queue("ml", ns, f"m-{ns}"), ns)
    predictor = await start_predictor(
        PredictorSettings(nats_url=nats_url, redis_url=redis_url, http_port=0,
                          http_host="127.0.0.1"),
        CollectorRegistry(),
    )  # fmt: skip
    bus = await Bus.connect(nats_url, name="test-observer")
    seen: list[JobEvent] = []

    async def observe(event: JobEvent, _env: Any) -> None:
        seen.append(event)

    await bus.subscribe(JobEvent, observe, durable="test-observer")
    async with scheduler(kube):
        running = await start_dispatcher(
            dispatcher_settings(
                control_plane, ns, nats_enabled=True, nats_url=nats_url, trials=False
            )
        )
        try:
            # The V100s are busy with a job that says nothing of its model.
            filler = gpu_job("filler", ns, "ml", 4, duration_s=4)
            filler["spec"]["template"]["spec"]["nodeSelector"][r.LABEL_GPU_MODEL] = "V100M32"
            await kube.create(JOBS, filler, ns)
            assert await wait_for(lambda: admitted_type(kube, ns, "filler"), 20) == "V100M32"
            # ResNet-50 at batch 192 peaks near 19 GB per GPU: more than a T4's 16 GB.
            big = {"model_name": "resnet50", "batch_size": "192", "data_size": "50000",
                   "epoch": "1"}  # fmt: skip
            await kube.create(JOBS, gpu_job("big", ns, "ml", 1, model=big), ns)
            explained = await wait_for(
                lambda: explain(running, ns, "big", lambda d: d["status"] == "waiting"
                                 and d["prediction"] is not None), 20,
            )  # fmt: skip
            assert explained["reason"]["kind"] in ("memory", "capacity", "reservation")
            assert explained["prediction"]["peak_memory_mib"] > 16384
            assert await admitted_type(kube, ns, "big") is None  # the free T4s are refused
            # The filler ends; the big job goes to the V100s, never the T4s.
            assert await wait_for(lambda: admitted_type(kube, ns, "big"), 30) == "V100M32"
            phases = {(e.name, e.phase) for e in seen}
            assert ("big", JobPhase.SUBMITTED) in phases
            await wait_for(lambda: _has(seen, "big", JobPhase.ADMITTED), 5)
        finally:
            await running.stop()
            await bus.close()
            await predictor.stop()


async def _has(seen: list[JobEvent], name: str, phase: JobPhase) -> bool:
    return any(e.name == name and e.phase == phase for e in seen)


async def test_bad_queues_and_jobs_are_named(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:2", kube=kube, prefix=ns, labels={POOL: ns})
    # The CRD schema refuses a negative quota, naming the field.
    with pytest.raises(ApiError) as refused:
        await kube.create(CLUSTERQUEUES, cluster_queue(f"neg-{ns}", None, {"V100M32": -1}))
    assert "nominalQuota" in str(refused.value)
    # An unknown cohort: the queue is inactive, says why, and admits nothing.
    await kube.create(CLUSTERQUEUES, cluster_queue(f"lost-{ns}", f"nope-{ns}", {"V100M32": 2}))
    await kube.create(LOCALQUEUES, local_queue("lost", ns, f"lost-{ns}"), ns)
    running = await start_dispatcher(dispatcher_settings(control_plane, ns))
    try:
        await kube.create(JOBS, gpu_job("orphan", ns, "missing", 1), ns)
        await kube.create(JOBS, gpu_job("stuck", ns, "lost", 1), ns)
        ev = (await wait_for(lambda: events(kube, ns, "orphan", "QueueNotFound"), 10))[0]
        assert "missing" in ev["message"]

        async def inactive() -> Any:
            cq = await kube.get(CLUSTERQUEUES, f"lost-{ns}")
            conds = (cq.get("status") or {}).get("conditions") or []
            return next(
                (c for c in conds if c["type"] == "Active" and c["status"] == "False"), None
            )

        cond = await wait_for(inactive, 10)
        assert "spec.cohort" in cond["message"]
        ev = (await wait_for(lambda: events(kube, ns, "stuck", "QueueNotFound"), 10))[0]
        assert "inactive" in ev["message"] and "spec.cohort" in ev["message"]
        assert await admitted_type(kube, ns, "stuck") is None
        # A Job asking for no GPUs is refused with an Event, not a crash.
        nogpu = gpu_job("nogpu", ns, "lost", 1)
        nogpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
        await kube.create(JOBS, nogpu, ns)
        ev = (await wait_for(lambda: events(kube, ns, "nogpu", "InvalidRequest"), 10))[0]
        assert r.GPU in ev["message"]
        assert not running.loop.done()
    finally:
        await running.stop()


async def test_a_big_job_holds_its_reservation_against_later_small_ones(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"g-{ns}", None, {"V100M32": 8}))
    await kube.create(LOCALQUEUES, local_queue("ml", ns, f"g-{ns}"), ns)
    async with scheduler(kube):
        # A job waiting over 1 s is owed a reservation (production default: 4 hours).
        running = await start_dispatcher(dispatcher_settings(control_plane, ns, max_wait_s=1))
        try:
            # s1 and s2 hold the 8 GPUs until the test deletes them: no step below depends on
            # how fast a loaded machine runs (with s1 ending on a timer, a slow start left the
            # big job under max_wait_s old when s1 ended, and s3 took its GPUs legitimately).
            for name in ("s1", "s2"):
                await kube.create(JOBS, gpu_job(name, ns, "ml", 4), ns)
                await wait_for(lambda n=name: admitted_type(kube, ns, n), 20)
            # An 8-GPU job (parallelism 2 x 4 GPUs, all at once) arrives, then small ones.
            big = gpu_job("big", ns, "ml", 4, duration_s=2)
            big["spec"]["parallelism"] = big["spec"]["completions"] = 2
            await kube.create(JOBS, big, ns)
            created = time.monotonic()
            await wait_for(lambda: explain(running, ns, "big", lambda d: d["reason"]), 10)
            for name in ("s3", "s4"):
                await kube.create(JOBS, gpu_job(name, ns, "ml", 4, duration_s=2), ns)
                await wait_for(lambda n=name: explain(running, ns, n, _reason), 10)
            await asyncio.sleep(max(0.0, 1.5 - (time.monotonic() - created)))
            # s1 ends: its 4 GPUs stay free for the big job (waiting past max_wait_s) rather
            # than going to s3, and the dispatcher says so.
            await kube.delete(JOBS, "s1", ns, propagation="Background")
            held = await wait_for(
                lambda: explain(running, ns, "s3", lambda d: _reason(d) == "reservation"), 30
            )
            assert "big" in held["reason"]["message"], held
            assert await admitted_type(kube, ns, "s3") is None
            assert await admitted_type(kube, ns, "big") is None
            # s2 ends: the big job starts, and the small ones only once it is done.
            await kube.delete(JOBS, "s2", ns, propagation="Background")
            await wait_for(lambda: admitted_type(kube, ns, "big"), 45)
            await wait_for(lambda: admitted_type(kube, ns, "s3"), 45)
            big_done = _since(await job(kube, ns, "big"), "Complete")
            s3_admitted = _since(await job(kube, ns, "s3"), "alnair.io/Admitted")
            assert big_done is not None and s3_admitted is not None
            assert s3_admitted >= big_done, (s3_admitted, big_done)
        finally:
            await running.stop()


async def test_a_job_never_measured_on_a_gpu_model_runs_its_trial_first(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str
) -> None:
    from alnair.predictor.app import start as start_predictor
    from alnair.predictor.settings import PredictorSettings

    ns = namespace
    # Gavel measured ResNet-50 on K80, P100 and V100, never on a T4.
    await control_plane.create_gpu_nodes("1x T4:4", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"t-{ns}", None, {"T4": 4}))
    await kube.create(LOCALQUEUES, local_queue("ml", ns, f"t-{ns}"), ns)
    predictor = await start_predictor(
        PredictorSettings(
            nats_url=nats_url, redis_url=redis_url, http_port=0, http_host="127.0.0.1"
        ),
        CollectorRegistry(),
    )
    running = await start_dispatcher(
        dispatcher_settings(control_plane, ns, nats_enabled=True, nats_url=nats_url)
    )
    try:
        model = {"model_name": "resnet50", "batch_size": "64", "data_size": "50000", "epoch": "1"}
        await kube.create(JOBS, gpu_job("cold", ns, "ml", 2, model=model), ns)
        trial = await wait_for(lambda: _get(kube, TRIALJOBS, "cold-trial", ns), 20)
        assert trial["spec"]["candidates"] == [{"gpuModel": "T4", "gpuCount": 1}]
        assert trial["metadata"]["annotations"]["model_name"] == "resnet50"
        assert trial["metadata"]["ownerReferences"][0]["name"] == "cold"
        assert (await wait_for(lambda: events(kube, ns, "cold", "TrialStarted"), 10))[0]
        explained = await wait_for(
            lambda: explain(running, ns, "cold", lambda d: d["reason"] is not None), 10
        )
        assert (
            explained["reason"]["kind"] == "prediction"
            and "trial" in explained["reason"]["message"]
        )
        assert await admitted_type(kube, ns, "cold") is None
        # The profiler's TrialJob controller (tests/e2e/test_profiler_sim_job.py) ends a trial by
        # writing its phase; here the test writes it, standing in for that controller.
        await kube.patch(
            TRIALJOBS, "cold-trial", {"status": {"phase": "Succeeded"}}, ns, sub="status"
        )
        assert await wait_for(lambda: admitted_type(kube, ns, "cold"), 20) == "T4"
    finally:
        await running.stop()
        await predictor.stop()


async def _get(kube: KubeClient, res: Any, name: str, ns: str) -> dict[str, Any] | None:
    with contextlib.suppress(ApiError):
        return await kube.get(res, name, ns)
    return None


async def test_an_elastic_job_is_admitted_at_its_minimum_and_its_borrowed_surplus_reclaimed(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str
) -> None:
    from alnair.dev.elastic import elastic_job, start_controller

    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "e", {"elastic": (4, 4), "other": (4, 4)})
    ej = elastic_job("ej", ns, lo=2, hi=8, pool=ns, scaleCooldownSeconds=0, suspend=True)
    ej["metadata"]["labels"] = {LABEL_QUEUE: "elastic"}
    ej["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    async with scheduler(kube):
        elastic = await start_controller(control_plane, ns, nats_url)
        running = await start_dispatcher(
            dispatcher_settings(control_plane, ns, nats_enabled=True, nats_url=nats_url)
        )
        try:
            await kube.create(ELASTICJOBS, ej, ns)

            async def elastic_status() -> dict[str, Any]:
                return (await kube.get(ELASTICJOBS, "ej", ns)).get("status") or {}

            # Admitted at its minimum; the controller then grows it into the idle GPUs, the
            # workers above the minimum counted as quota borrowed from the cohort.
            await wait_for(lambda: _elastic_admitted(kube, ns), 20)
            await wait_for(lambda: _has_replicas(elastic_status, 8), 40)

            async def queue_borrows() -> Any:
                st = (await kube.get(CLUSTERQUEUES, f"elastic-{ns}")).get("status") or {}
                return st if st.get("usedGPUs") == 8 and st.get("borrowedGPUs") == 6 else None

            await wait_for(queue_borrows, 20)
            # The lender needs its quota back: the surplus shrinks (a scale request), the
            # elastic job keeps running at its minimum, the lender's job is admitted.
            await kube.create(JOBS, gpu_job("lender", ns, "other", 4), ns)
            await wait_for(lambda: admitted_type(kube, ns, "lender"), 60)
            st = await elastic_status()
            assert 2 <= st["currentReplicas"] <= 4 and st["phase"] == "Running", (
                st["message"],
                st["phase"],
                st.get("lastResize"),
            )
            assert (await kube.get(ELASTICJOBS, "ej", ns))["spec"]["suspend"] is False
            assert await events(kube, ns, "ej", "Shrinking")
        finally:
            await running.stop()
            await elastic.stop()


async def _elastic_admitted(kube: KubeClient, ns: str) -> bool:
    ej = await kube.get(ELASTICJOBS, "ej", ns)
    return not ej["spec"].get("suspend") and ANN_ADMITTED_TYPE in ej["metadata"].get(
        "annotations", {}
    )


async def _has_replicas(status: Any, n: int) -> bool:
    st = await status()
    return st.get("currentReplicas") == n and st.get("readyReplicas") == n


async def test_a_decision_the_api_refuses_on_one_job_never_stops_the_queue(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """A ValidatingAdmissionPolicy (the API server's own CEL admission) refuses to suspend one
    running Job: the dispatcher's preemption of it fails with a Warning on that Job, and the
    queue goes on deciding for every other workload (issue 26: it used to end the loop)."""
    ns = namespace
    await control_plane.create_gpu_nodes(
        "1x V100M32:4, 1x T4:2", kube=kube, prefix=ns, labels={POOL: ns}
    )
    await cohort_queues(kube, ns, "v", {"pin": (2, 2), "lender": (2, 0)})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"t4-{ns}", None, {"T4": 2}))
    await kube.create(LOCALQUEUES, local_queue("t4", ns, f"t4-{ns}"), ns)
    policy = f"pinned-{ns}"
    await kube.create(ADMISSION_POLICIES, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["jobs"],
            }]},
            "validations": [{
                "expression": "!(object.metadata.name == 'pinned' && "
                              "object.spec.suspend == true && oldObject.spec.suspend == false)",
                "message": "pinned runs to the end",
            }],
        },
    })  # fmt: skip
    await kube.create(ADMISSION_POLICY_BINDINGS, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {
            "policyName": policy, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    })  # fmt: skip
    running = await start_dispatcher(dispatcher_settings(control_plane, ns))
    try:
        await kube.create(JOBS, gpu_job("first", ns, "pin", 2), ns)
        await wait_for(lambda: admitted_type(kube, ns, "first"), 20)
        await kube.create(JOBS, gpu_job("pinned", ns, "pin", 2), ns)
        await wait_for(lambda: admitted_type(kube, ns, "pinned"), 20)
        pinned = await job(kube, ns, "pinned")
        assert pinned["metadata"]["annotations"][ANN_BORROWING] == "true"

        async def policy_loaded() -> bool:
            try:
                await kube.request(
                    "PATCH", JOBS.path(ns, "pinned"), body={"spec": {"suspend": True}},
                    params={"dryRun": "All"}, content_type="application/merge-patch+json",
                )  # fmt: skip
            except ApiError as exc:
                return "pinned runs to the end" in str(exc)
            return False

        await wait_for(policy_loaded, 30, 0.2)
        # The lender wants its quota back; the borrower cannot be suspended.
        await kube.create(JOBS, gpu_job("l1", ns, "lender", 2), ns)
        failed = await wait_for(lambda: events(kube, ns, "pinned", "PreemptionFailed"), 20)
        assert "pinned runs to the end" in failed[0]["message"]
        assert failed[0]["type"] == "Warning"
        assert await admitted_type(kube, ns, "pinned") == "V100M32"
        # The queue goes on: a job of another queue is admitted after the refusal.
        await kube.create(JOBS, gpu_job("after", ns, "t4", 1), ns)
        assert await wait_for(lambda: admitted_type(kube, ns, "after"), 20) == "T4"
        assert not running.loop.done()
        assert running.dispatcher.metrics.write_refusals._value.get() >= 1
    finally:
        await running.stop()
        await kube.delete(ADMISSION_POLICY_BINDINGS, policy)
        await kube.delete(ADMISSION_POLICIES, policy)


async def test_a_workload_whose_pods_never_start_gives_its_quota_back(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    """Admitted, but its pods can never be ready (they ask for a node nobody has): after the
    pods-ready timeout it is suspended with a PodsNotReady Warning, its quota goes to the next
    job, and after the allowed tries it is deactivated, not queued again (issue 24)."""
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=ns, labels={POOL: ns})
    await kube.create(CLUSTERQUEUES, cluster_queue(f"ready-{ns}", None, {"V100M32": 2}))
    await kube.create(LOCALQUEUES, local_queue("ready", ns, f"ready-{ns}"), ns)
    settings = dispatcher_settings(
        control_plane, ns, pods_ready_timeout_s=3.0, pods_ready_retries=1
    )
    async with scheduler(kube):
        running = await start_dispatcher(settings)
        try:
            stuck = gpu_job("stuck", ns, "ready", 2)
            stuck["spec"]["template"]["spec"]["nodeSelector"]["example.com/nowhere"] = "true"
            await kube.create(JOBS, stuck, ns)
            await wait_for(lambda: admitted_type(kube, ns, "stuck"), 20)
            await kube.create(JOBS, gpu_job("next", ns, "ready", 2), ns)
            waiting = await wait_for(lambda: events(kube, ns, "next", "Waiting"), 10)
            assert "quota" in waiting[0]["message"]
            # Nothing else happens until the timeout: the reconcile it takes is the one the
            # dispatcher set for itself at the deadline.
            evicted = await wait_for(lambda: events(kube, ns, "stuck", "PodsNotReady"), 20)
            assert "not all ready 3 s after admission" in evicted[0]["message"]
            assert await wait_for(lambda: admitted_type(kube, ns, "next"), 20) == "V100M32"
            gone = await job(kube, ns, "stuck")
            assert gone["spec"]["suspend"] is True
            assert gone["metadata"]["annotations"]["alnair.io/pods-not-ready-evictions"] == "1"
            held = await wait_for(
                lambda: explain(running, ns, "stuck", lambda d: d["reason"] is not None), 10
            )
            assert held["status"] == "waiting" and "deactivated" in held["reason"]["message"]
            # The job that runs was seen ready once: its timeout no longer applies.
            ready_at = await wait_for(
                lambda: _annotation(kube, ns, "next", "alnair.io/pods-ready-at"), 20
            )
            assert float(ready_at) > 0
            # (>= 1: this dispatcher watches every namespace, and earlier tests' admitted jobs
            # whose nodes are gone are not ready either.)
            assert running.dispatcher.metrics.not_ready_evictions._value.get() >= 1
        finally:
            await running.stop()


async def _annotation(kube: KubeClient, ns: str, name: str, key: str) -> str | None:
    return ((await job(kube, ns, name))["metadata"].get("annotations") or {}).get(key)
