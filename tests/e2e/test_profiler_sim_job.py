"""End to end on the local control plane with the sim backend.

A Job runs on a KWOK GPU node and completes. Along the way: the sim agent publishes per-pod
metrics (and Prometheus shows per-pod gauges while the pod runs), the aggregator is
restarted mid-job, and at the end the Job carries the utilization annotations, its
execution record is in Redis exactly once, and a job-completed event reached a subscriber.
A TrialJob annotated the seeds' way (`model_name`, `data_size`, `epoch`) is measured and
recorded just the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from alnair.common import resources as res
from alnair.common.bus import Bus
from alnair.common.data import gavel_throughputs
from alnair.common.events import Envelope, GpuInventory, JobEvent, JobPhase, PodMetric
from alnair.common.kube import EVENTS, JOBS, TRIALJOBS, KubeClient
from alnair.common.records import RECORDS_INDEX
from alnair.common.tasks import within
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import consumed, wait_for
from alnair.profiler.aggregator.records import RecordStore
from alnair.profiler.aggregator.store import P
from alnair.profiler.app import Running, start_agent, start_aggregator
from profiler_support import bind_pending_pods, profiler_settings

pytestmark = pytest.mark.e2e

JOB_SECONDS = 12


def job_manifest(namespace: str, node: str) -> dict[str, Any]:
    model = {
        res.ANN_MODEL_NAME: "ResNet-50",
        res.ANN_BATCH_SIZE: "64",
        res.ANN_DATA_SIZE: "1281167",
        res.ANN_EPOCH: "3",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": namespace, "annotations": model},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        **model,
                        res.ANN_DURATION: res.duration_value(JOB_SECONDS),
                        res.ANN_GPU_INDICES: "0,1",
                    }
                },
                "spec": {
                    # No scheduler runs in this test: the pod is placed directly.
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.invalid/train:1",
                            "resources": {
                                "limits": {res.GPU: "2"},
                                "requests": {"cpu": "4", "memory": "16Gi"},
                            },
                        }
                    ],
                },
            },
        },
    }


async def test_job_profiled_recorded_once_across_aggregator_restart(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str
) -> None:
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=f"prof-{namespace}"
    )
    agent = await start_agent(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, node)
    )
    aggregator: Running = await start_aggregator(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, node, role="aggregator")
    )
    watcher = await Bus.connect(nats_url, name="e2e-watcher")
    redis = aioredis.from_url(redis_url)
    completed: list[JobEvent] = []
    done = asyncio.Event()
    ours: list[PodMetric] = []
    enough_samples = asyncio.Event()

    async def on_job(event: JobEvent, _env: Envelope[JobEvent]) -> None:
        completed.append(event)
        done.set()

    async def on_metric(event: PodMetric, _env: Envelope[PodMetric]) -> None:
        if event.namespace == namespace:
            ours.append(event)
            if len(ours) >= 6:
                enough_samples.set()

    try:
        # A durable consumer of this namespace's job events, as any subscriber would have.
        jobs_durable = f"e2e-jobs-{namespace}"
        await watcher.subscribe(
            JobEvent, on_job, durable=jobs_durable, subject=f"alnair.jobs.*.{namespace}.>"
        )
        await watcher.subscribe(PodMetric, on_metric, durable=f"e2e-metrics-{namespace}")

        # The agent published the node's inventory and labelled it.
        inv_entry = await (await watcher.kv(GpuInventory.BUCKET)).get(node)
        assert inv_entry.value is not None
        inventory = GpuInventory.model_validate_json(inv_entry.value)
        assert [g.model for g in inventory.gpus] == ["V100M32"] * 4

        job = await kube.create(JOBS, job_manifest(namespace, node), namespace)
        uid = job["metadata"]["uid"]
        await within(enough_samples.wait(), 60)
        assert {m.gpu_index for m in ours} == {0, 1}
        assert all(m.gpu_util_pct > 0 and m.gpu_mem_used_mib > 0 for m in ours)

        # While the pod runs, Prometheus shows per-pod GPU gauges on both processes.
        async with httpx.AsyncClient() as http:
            for running in (agent, aggregator):
                text = (await http.get(f"{running.url}/metrics")).text
                lines = [
                    line
                    for line in text.splitlines()
                    if line.startswith("alnair_profiler_pod_gpu_util_pct{")
                    and f'namespace="{namespace}"' in line
                ]
                assert len(lines) == 2, text
                assert all(f'node="{node}"' in line and 'gpu_uuid="GPU-' in line for line in lines)
            pod_name = ours[0].pod
            live = (
                await http.get(f"{aggregator.url}/v1/pods/{namespace}/{pod_name}/metrics")
            ).json()
            assert len(live["samples"]) == 2

        # The running Job already shows its utilization so far (refreshed as samples arrive).
        running_job = await kube.get(JOBS, "train", namespace)
        assert (
            float(running_job["metadata"]["annotations"]["alnair.io/profile-gpu-util-max-pct"]) > 0
        )

        # Restart the aggregator mid-job.
        assert not done.is_set()
        await aggregator.stop()
        aggregator = await start_aggregator(
            profiler_settings(
                control_plane.kubeconfig, nats_url, redis_url, node, role="aggregator"
            )
        )

        await within(done.wait(), JOB_SECONDS + 60)
        # The job is marked done (after its event was stored: nothing publishes it again)
        # and every stored job event has reached the consumer: a duplicate would be here.
        await wait_for(lambda: redis.exists(f"{P}done:{uid}"), 20)
        await consumed(watcher, JobEvent, jobs_durable)
        assert [(e.phase, e.uid, e.kind, e.name) for e in completed] == [
            (JobPhase.COMPLETED, uid, "Job", "train")
        ]

        store = RecordStore(redis)
        record = await store.get(namespace, "train", uid)
        assert record is not None
        assert record.outcome == "succeeded"
        assert (record.model_name, record.batch_size, record.epoch) == ("ResNet-50", "64", "3")
        assert record.gpu_model == "V100M32"
        assert record.gpu_count == 2
        assert JOB_SECONDS - 2 <= record.duration_s <= JOB_SECONDS + 15
        assert record.submit_ts <= record.start_ts <= record.end_ts
        assert 0 < record.peak_gpu_mem_mib <= 32510
        assert 0 < record.mean_gpu_util_pct <= 100
        # The sim agent reported Gavel's measured throughput for ResNet-50/64 on 2 V100s.
        assert record.throughput_steps_per_s == pytest.approx(7.922054367597505, rel=1e-3)
        assert record.steps is not None
        assert record.steps == pytest.approx(
            record.throughput_steps_per_s * record.duration_s, abs=1
        )
        assert completed[0].detail["record"] == record.key
        keys = [k.decode() for k in await redis.zrange(RECORDS_INDEX, 0, -1)]
        assert keys.count(record.key) == 1

        # The Job carries the utilization annotations.
        job = await kube.get(JOBS, "train", namespace)
        ann = job["metadata"]["annotations"]
        assert (
            float(ann["alnair.io/profile-gpu-util-max-pct"])
            >= float(ann["alnair.io/profile-gpu-util-mean-pct"])
            > 0
        )
        assert float(ann["alnair.io/profile-gpu-mem-max-mib"]) == pytest.approx(
            record.peak_gpu_mem_mib, abs=0.01
        )
        assert float(ann["alnair.io/profile-cpu-util-max-cores"]) > 0

        # Finishing again (a replayed watch event) changes nothing.
        assert aggregator.aggregator is not None
        # The finished pod left the live view (it would only fill the cache).
        assert not [key for key in aggregator.aggregator.latest if key[0] == namespace]
        assert await aggregator.aggregator.finalize(job, JOBS, "succeeded", None) is None
        assert not await store.write_once(record)

        # The HTTP API answers from the same state.
        async with httpx.AsyncClient() as http:
            found = (
                await http.get(
                    f"{aggregator.url}/v1/records", params={"model": "ResNet-50", "gpu": "V100M32"}
                )
            ).json()
            assert [r["uid"] for r in found if r["namespace"] == namespace] == [uid]
            profile = (await http.get(f"{aggregator.url}/v1/jobs/{namespace}/train/profile")).json()
            assert profile["uid"] == uid
            assert profile["record"]["key"] == record.key
            assert profile["series"]["gpu_util_pct"]["count"] > 0
            gpus = (await http.get(f"{aggregator.url}/v1/nodes/{node}/gpus")).json()
            assert len(gpus["gpus"]) == 4
            nodes = (await http.get(f"{aggregator.url}/v1/nodes")).json()
            assert node in [n["node"] for n in nodes]
            missing = await http.get(f"{aggregator.url}/v1/nodes/no-such-node/gpus")
            assert missing.status_code == 404
            assert missing.headers["content-type"] == "application/problem+json"
            assert "no-such-node" in missing.json()["detail"]
    finally:
        await watcher.close()
        await redis.aclose()
        await aggregator.stop()
        await agent.stop()


def gavel_rate(gpu: str, job: str, scale: int) -> float:
    return next(
        r.own
        for r in gavel_throughputs()
        if (r.gpu, r.job, r.scale, r.partner) == (gpu, job, scale, "")
    )


def node_by_model(nodes_by_model: dict[str, str], pod: dict[str, Any]) -> str | None:
    """The node whose GPU model the pod's node selector names."""
    model = (pod["spec"].get("nodeSelector") or {}).get(res.LABEL_GPU_MODEL)
    return nodes_by_model.get(model) if model else None


async def test_trialjob_measures_each_candidate(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str
) -> None:
    v100, k80 = await control_plane.create_gpu_nodes(
        "1x V100M32:4, 1x K80:4", kube=kube, prefix=f"trial-{namespace}"
    )
    agent = await start_agent(
        profiler_settings(
            control_plane.kubeconfig, nats_url, redis_url, v100, sim_node_selector="type=kwok"
        )
    )
    aggregator = await start_aggregator(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, v100, role="aggregator")
    )
    binder = asyncio.create_task(
        bind_pending_pods(kube, namespace, partial(node_by_model, {"V100M32": v100, "K80": k80}))
    )
    redis = aioredis.from_url(redis_url)
    try:
        trial = {
            "apiVersion": "alnair.io/v1alpha1",
            "kind": "TrialJob",
            "metadata": {
                "name": "dry-run",
                "namespace": namespace,
                # Annotated the seeds' way: bare names, as the original system's manifests.
                "annotations": {
                    "model_name": "ResNet-50",
                    "batch_size": "64",
                    "data_size": "1281167",
                    "epoch": "3",
                },
            },
            "spec": {
                "durationSeconds": 6,
                "candidates": [
                    {"gpuModel": "V100M32", "gpuCount": 1},
                    {"gpuModel": "K80", "gpuCount": 2},
                ],
                "template": {
                    "spec": {"containers": [{"name": "train", "image": "example.invalid/train:1"}]}
                },
            },
        }
        created = await kube.create(TRIALJOBS, trial, namespace)
        status: dict[str, Any] = {}
        version = created["metadata"]["resourceVersion"]
        async with asyncio.timeout(90):
            while status.get("phase") not in {"Succeeded", "Failed"}:
                async for _kind, obj in kube.watch(TRIALJOBS, namespace, resource_version=version):
                    version = obj["metadata"]["resourceVersion"]
                    status = obj.get("status") or {}
                    if status.get("phase") in {"Succeeded", "Failed"}:
                        break
        assert status["phase"] == "Succeeded", status
        assert (status["total"], status["finished"]) == (2, 2)
        by_model = {t["gpuModel"]: t for t in status["trials"]}
        assert set(by_model) == {"V100M32", "K80"}
        # Gavel's measurements for ResNet-50/64: 1 V100, and 2 K80s.
        expected_rate = {
            "V100M32": 4.525762041224065,
            "K80": gavel_rate("k80", "ResNet-50 (batch size 64)", 2),
        }
        store = RecordStore(redis)
        for model, count in (("V100M32", 1), ("K80", 2)):
            entry = by_model[model]
            assert entry["phase"] == "Measured"
            assert entry["gpuCount"] == count
            assert 4 <= entry["durationSeconds"] <= 30
            assert entry["peakGpuMemMib"] > 0
            assert entry["throughputStepsPerS"] == pytest.approx(expected_rate[model], rel=1e-3)
            found = [
                r
                for r in await store.query(model="ResNet-50", gpu=model)
                if r.namespace == namespace
            ]
            assert [r.key for r in found] == [entry["record"]]
            assert found[0].gpu_count == count
            assert (found[0].model_name, found[0].batch_size) == ("ResNet-50", "64")
            assert (found[0].data_size, found[0].epoch) == ("1281167", "3")
    finally:
        binder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await binder
        await redis.aclose()
        await aggregator.stop()
        await agent.stop()


async def test_a_trial_the_api_server_refuses_fails_with_the_reason_instead_of_waiting(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str, redis_url: str
) -> None:
    """Found by `make chaos`: a trial whose Job the API server refused (a 2-GPU Job's request
    kept beside the trial's 1-GPU limit) stayed Pending for ever, and the dispatcher held the
    measured job behind it. Now the 2 becomes the trial's count, and a trial refused for
    another reason ends Failed with the API server's words, in its status and an Event."""
    (node,) = await control_plane.create_gpu_nodes("1x V100M32:4", kube=kube, prefix=namespace)
    aggregator = await start_aggregator(
        profiler_settings(control_plane.kubeconfig, nats_url, redis_url, node, role="aggregator")
    )
    try:
        container = {
            "name": "train", "image": "example.invalid/train:1",
            "resources": {"requests": {res.GPU: "2", "memory": "-1Gi"},
                          "limits": {res.GPU: "2"}},
        }  # fmt: skip
        trial = {
            "apiVersion": "alnair.io/v1alpha1",
            "kind": "TrialJob",
            "metadata": {"name": "refused", "namespace": namespace},
            "spec": {
                "durationSeconds": 6,
                "candidates": [{"gpuModel": "V100M32", "gpuCount": 1}],
                "template": {"spec": {"containers": [container]}},
            },
        }
        await kube.create(TRIALJOBS, trial, namespace)

        async def ended() -> dict[str, Any] | None:
            status = (await kube.get(TRIALJOBS, "refused", namespace)).get("status") or {}
            return status if status.get("phase") in {"Succeeded", "Failed"} else None

        status = await wait_for(ended, 30, 0.2, what="the refused trial's end")
        assert status["phase"] == "Failed" and status["finished"] == 1, status
        (entry,) = status["trials"]
        assert entry["phase"] == "Refused" and "-1Gi" in entry["message"], entry
        # The GPU request followed the trial's count (only the memory was wrong).
        assert "must be equal to" not in entry["message"]

        async def warned() -> list[dict[str, Any]]:
            events = (await kube.list(EVENTS, namespace))["items"]
            return [e for e in events if e["reason"] == "TrialRefused"]

        (event,) = await wait_for(warned, 10, 0.2, what="the TrialRefused Event")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "refused"
        # It stays Failed: the next reconcile keeps the refusal, creates nothing.
        await kube.patch(TRIALJOBS, "refused", {"metadata": {"labels": {"touched": "1"}}},
                         namespace)  # fmt: skip
        assert (await kube.list(JOBS, namespace))["items"] == []
        assert (await kube.get(TRIALJOBS, "refused", namespace))["status"]["phase"] == "Failed"
    finally:
        await aggregator.stop()
