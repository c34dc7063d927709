"""Issue 27: a job preempted mid-run keeps its progress, and the queue knows how far it got.

Real parts: the local control plane with a KWOK GPU node, nats-server, redis-server, the
predictor, the scheduler, the dispatcher, the profiler's sim agent and aggregator, and the
example trainer (`examples/checkpointing/trainer.py`) as a real process. The test harness is
the kubelet of the KWOK pod: it starts the trainer when the pod is bound, sends it SIGTERM when
the pod is deleted (a preemption), and marks the pod Succeeded when the trainer exits 0. The
trainer reports its progress on its own pod with a ServiceAccount token that may patch pods in
its namespace, as a trainer in a cluster would.

The flow: team A's job `a2` runs on borrowed quota and checkpoints every 20 of its 100 steps;
past step 60 team B claims its quota back, so `a2` is suspended; its explanation then says how
far it got and plans the rest (the predicted runtime times the share after the checkpoint);
re-admitted, the trainer resumes from its checkpoint (its step count continues) and finishes;
its execution record keeps the progress and the preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from alnair.common import progress as pr
from alnair.common import resources as r
from alnair.common.kube import JOBS, PODS, SERVICEACCOUNTS, KubeClient, Resource
from alnair.common.records import ExecutionRecord, record_key
from alnair.dev.localstack import ControlPlane
from alnair.dev.waiting import wait_for
from alnair.profiler.app import start_agent, start_aggregator
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from dispatcher_support import (
    admitted_type,
    cohort_queues,
    dispatcher_settings,
    events,
    explain,
    gpu_job,
    job,
    scheduler,
)
from profiler_support import profiler_settings
from scheduler_support import table_published

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "checkpointing" / "trainer.py"
TOTAL = 100
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
MODEL = {"model_name": "resnet50", "batch_size": "64", "data_size": "50000", "epoch": "1"}


class Kubelet:
    """Runs the trainer for each bound pod of a Job, as a kubelet would run its container."""

    def __init__(self, kube: KubeClient, ns: str, job_name: str, args: list[str], logs: Path):
        self.kube, self.ns, self.job_name, self.args, self.logs = kube, ns, job_name, args, logs
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.runs = 0
        self.exits: list[int] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> None:
        listed = await self.kube.list(PODS, self.ns)
        version = listed["metadata"]["resourceVersion"]
        for pod in listed["items"]:
            await self._on(pod, deleted=False)
        while True:
            async for kind, pod in self.kube.watch(PODS, self.ns, resource_version=version):
                version = pod["metadata"]["resourceVersion"]
                await self._on(pod, deleted=kind == "DELETED")

    async def _on(self, pod: dict[str, Any], *, deleted: bool) -> None:
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get("job-name") != self.job_name:
            return
        uid, name = meta["uid"], meta["name"]
        proc = self.procs.get(uid)
        if deleted or meta.get("deletionTimestamp"):
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)  # the grace period starts
                proc.send_signal(signal.SIGCONT)  # if frozen, it wakes to the SIGTERM
            return
        if proc is None and pod["spec"].get("nodeName"):
            self.runs += 1
            with (self.logs / f"run-{self.runs}.log").open("w") as out:  # the child's now
                self.procs[uid] = proc = await asyncio.create_subprocess_exec(
                    sys.executable, str(TRAINER), *self.args, "--pod", f"{self.ns}/{name}",
                    stdout=out, stderr=asyncio.subprocess.STDOUT,
                )  # fmt: skip
            task = asyncio.create_task(self._exited(proc, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _exited(self, proc: asyncio.subprocess.Process, name: str) -> None:
        code = await proc.wait()
        self.exits.append(code)
        if code == 0:  # the container succeeded: so does the pod
            with contextlib.suppress(Exception):
                await self.kube.patch(
                    PODS, name, {"status": {"phase": "Succeeded"}}, self.ns, sub="status"
                )

    def freeze(self) -> None:
        """Stops every running trainer where it is, as a slow GPU would (SIGCONT resumes it)."""
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGSTOP)

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for task in list(self._tasks):
            task.cancel()


async def trainer_identity(kube: KubeClient, ns: str, folder: Path) -> Path:
    """A ServiceAccount that may patch the pods of its namespace, and a token file of it."""
    await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": "trainer"}}, ns)  # fmt: skip
    await kube.create(ROLES, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "trainer"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
    }, ns)  # fmt: skip
    await kube.create(ROLEBINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "trainer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer"},
        "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": ns}],
    }, ns)  # fmt: skip
    token = folder / "token"
    token.write_text(await kube.service_account_token(ns, "trainer"))
    return token


async def job_progress(kube: KubeClient, ns: str, name: str) -> pr.Progress | None:
    return pr.from_annotations((await job(kube, ns, name))["metadata"].get("annotations"))


@pytest.mark.timeout(240)
async def test_a_preempted_job_resumes_from_its_checkpoint_and_the_queue_knows_how_far_it_got(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, nats_url: str,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    from alnair.predictor.app import start as start_predictor
    from alnair.predictor.settings import PredictorSettings

    ns = namespace
    (node,) = await control_plane.create_gpu_nodes(
        "1x V100M32:4", kube=kube, prefix=ns, labels={"alnair.io/test-pool": ns}
    )
    await cohort_queues(kube, ns, "c", {"team-a": (2, 2), "team-b": (2, 2)})
    token = await trainer_identity(kube, ns, tmp_path)
    assert control_plane.pki is not None
    # Once checkpoint 60 reaches the Job the trainer is frozen until its pod is deleted, so
    # team B's claim, the suspension and the SIGTERM never race its last 40 steps (full CI runs
    # saw the trainer finish first, at 0.12 s a step and again at 0.3 s).
    kubelet = Kubelet(
        kube, ns, "a2",
        ["--checkpoint-dir", str(tmp_path / "ckpt"), "--total-steps", str(TOTAL),
         "--step-seconds", "0.3", "--checkpoint-every", "20", "--report-every", "5",
         "--api-server", control_plane.server, "--token-file", str(token),
         "--ca-file", str(control_plane.pki.ca_cert)],
        tmp_path,
    )  # fmt: skip
    started: list[Any] = []  # stopped in reverse, whatever got started
    runner = asyncio.create_task(kubelet.run())
    store = aioredis.from_url(redis_url)
    try:
        started.append(await start_predictor(
            PredictorSettings(nats_url=nats_url, redis_url=redis_url, http_port=0,
                              http_host="127.0.0.1", log_json=False),
            CollectorRegistry(),
        ))  # fmt: skip
        await table_published(nats_url)
        started.append(await start_agent(profiler_settings(
            control_plane.kubeconfig, nats_url, redis_url, node, sample_interval_s=0.5)))  # fmt: skip
        started.append(await start_aggregator(profiler_settings(
            control_plane.kubeconfig, nats_url, redis_url, node, role="aggregator",
            live_annotation_interval_s=1.0)))  # fmt: skip
        async with scheduler(kube):
            running = await start_dispatcher(
                dispatcher_settings(
                    control_plane, ns, nats_enabled=True, nats_url=nats_url, trials=False
                )
            )
            try:
                await kube.create(JOBS, gpu_job("a1", ns, "team-a", 2), ns)
                await wait_for(lambda: admitted_type(kube, ns, "a1"), 20)
                a2 = gpu_job("a2", ns, "team-a", 2, model=MODEL)
                del a2["spec"]["template"]["metadata"]["annotations"][r.ANN_DURATION]
                a2["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
                created = await kube.create(JOBS, a2, ns)
                assert await wait_for(lambda: admitted_type(kube, ns, "a2"), 20) == "V100M32"

                # The trainer's progress reaches the Job: pod -> agent -> aggregator.
                async def past_60() -> pr.Progress | None:
                    p = await job_progress(kube, ns, "a2")
                    return p if p and (p.checkpoint or 0) >= 60 else None

                reached = await wait_for(past_60, 60, 0.1)
                kubelet.freeze()
                assert not kubelet.exits, (
                    f"the trainer ended before its preemption: {kubelet.exits}"
                )
                assert reached.total == TOTAL and reached.source == "annotation"

                # Team B claims its quota back: a2 (borrowing) is suspended, its trainer told.
                await kube.create(JOBS, gpu_job("b1", ns, "team-b", 2, duration_s=4), ns)
                await wait_for(lambda: events(kube, ns, "a2", "Preempted"), 20)
                explained = await wait_for(
                    lambda: explain(running, ns, "a2", lambda d: d["status"] == "waiting"
                                    and d["progress"] is not None
                                    and d["remaining_s"] is not None),
                    20,
                )  # fmt: skip
                kept = explained["progress"]["kept_pct"]
                assert kept >= 60.0, explained["progress"]
                whole = explained["prediction"]["runtime_s"]["V100M32"]
                left = explained["remaining_s"]["V100M32"]
                assert left == pytest.approx(whole * (1 - kept / 100), rel=0.01), explained
                assert await wait_for(lambda: _exited(kubelet), 30) == [143]

                # b1 ends; a2 is admitted again, from its checkpoint, and finishes.
                assert await wait_for(lambda: admitted_type(kube, ns, "a2"), 30) == "V100M32"
                admitted = await events(kube, ns, "a2", "Admitted")
                assert any("resumes at step" in e["message"] for e in admitted), admitted
                await wait_for(lambda: _finished(kube, ns, "a2"), 60, 0.2)
            finally:
                await running.stop()
        second = (tmp_path / "run-2.log").read_text()
        resumed = re.search(r"resumed from checkpoint at step (\d+)/100", second)
        assert resumed and int(resumed[1]) >= 60, second
        first_step = re.search(r"^step (\d+)/100", second, re.MULTILINE)
        assert first_step and int(first_step[1]) > int(resumed[1]), second  # continued
        assert "step 100/100" in second and kubelet.exits == [143, 0]

        # The record keeps how far it got and that the queue stopped it once.
        key = record_key(ns, "a2", created["metadata"]["uid"])

        async def recorded() -> ExecutionRecord | None:
            fields = await store.hgetall(key)
            if not fields:
                return None
            decoded = {k.decode(): v.decode() for k, v in fields.items()}
            return ExecutionRecord.from_fields(key, decoded)

        record = await wait_for(recorded, 30)
        assert record.preemptions == 1 and record.total_steps == TOTAL
        assert record.checkpoint_step is not None and record.checkpoint_step >= 60
        assert record.progress_step is not None and record.progress_step >= 60
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await kubelet.stop()
        await store.aclose()
        for service in reversed(started):
            await service.stop()


async def _exited(kubelet: Kubelet) -> list[int] | None:
    return list(kubelet.exits) if kubelet.exits else None


async def _finished(kube: KubeClient, ns: str, name: str) -> bool:
    conds = ((await job(kube, ns, name)).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)
