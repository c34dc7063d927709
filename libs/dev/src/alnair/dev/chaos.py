"""Chaos on the whole local system, shared by `make chaos` (bench/chaos.py) and its reduced
form in the tests (tests/e2e/test_chaos.py).

The stack is `make up`'s (`alnair.dev.devstack`): nats-server, redis-server, the control
plane with KWOK GPU nodes, and every service as its own process. Jobs (`schedulerName:
alnair`, 1 or 2 GPUs, every `fraction_every`-th one half a GPU's compute and 8 GiB of its
memory, every `gang_every`-th other one a gang of two pods in a PodGroup, a KWOK run time)
arrive at a steady rate, every `queued_every`-th one
through the dispatcher's queue (created suspended in a LocalQueue whose ClusterQueue holds
every GPU, so only the dispatcher decides when it runs), every `elastic_every`-th other one
an ElasticJob in that queue (the elastic controller grows and shrinks it; the elastic demo's
trainer stand-in completes it once its work is done at the sizes it held, writing the
completion again when the API server does not answer), while the chaos loop kills a
random service with SIGKILL at random moments, each service `kills_per_service` times, and
brings it back as Kubernetes would (`devstack.up` restarts what died and waits for its
readiness: that wait is the recovery time); nats-server is stopped once for `nats_down_s`
and restarted on its port and store; the API server is killed once and started again with
its own command line. Two scheduler replicas run (the standby follows the Lease); the one
holding the Lease is SIGSTOPped once for `leader_stop_s`, past the lease duration, and
resumed: the standby binds meanwhile, the resumed one must bind nothing (double_bound,
gpu_overcommitted). With `topology` "production" (three nats-servers in a JetStream
cluster, Redis with a replica and Sentinels) the whole-bus outage is replaced by the loss of
one node of each: a NATS server is SIGKILLed, kept down `nats_down_s` and started again on
its port and store, and later the Redis primary is SIGKILLed (a replica takes over) and comes
back as a replica. A sampler lists pods every second and at the start and end of every
fault, and counts GPUs given past their whole (the shares of the pods on each GPU summed).

At the end the invariant checker reads every Job, pod, Redis record and the sampler's
findings, and the run reports:
`{"jobs", "lost", "double_bound", "gpu_overcommitted", "records_duplicated",
"records_missing", "kills", "recovery_p99_s", ...}` where
- lost: Jobs not complete within `settle_s` after the last arrival;
- double_bound: Jobs more than one of whose pods ran (a pod bound twice is impossible in the
  API, so a second run is what a lost bind acknowledgement would cause); ElasticJobs, whose
  workers come and go as they resize, are left out;
- gpu_overcommitted: (node, GPU) pairs seen held past their whole by running pods (each
  pod's `alnair.io/gpu-milli` share summed, a whole GPU being 1000);
- fault_windows_unsampled: faults (a kill to its recovery, nats-server's outage) with no
  pod sample taken inside them; the API server's own restart is left out, as nothing can be
  listed while it is down;
- records_duplicated / records_missing: execution records per completed Job other than one;
- records_without_usage: completed Jobs recorded without usage, because no sample of theirs
  reached the aggregator (they ran while the agent was killed): not a failure, reported so a
  reader sees how often the kills fell that way;
- admissions_duplicated: queued Jobs the dispatcher admitted more than once (its `Admitted`
  Events, counted with their series), which a restarted or second leader would cause;
- admissions_unrecorded: complete queued Jobs with no `Admitted` Event (an Event is written
  best-effort, so one lost while the API server restarted is reported, not failed);
- completions_duplicated / completions_missing: `completed` job events on the bus (the JOBS
  stream, read from its start at the end) per complete Job other than one;
- service_restarts: times a service exited by itself and its supervisor started it again (a
  service that could not ride out a NATS node's or Redis primary's loss shows here).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from nats.js.api import ConsumerConfig, DeliverPolicy

from alnair.common import resources as r
from alnair.common.events import DecodeError, JobEvent, JobPhase, decode, subject_token
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import (
    CLUSTERQUEUES,
    ELASTICJOBS,
    EVENTS,
    JOBS,
    LEASES,
    LOCALQUEUES,
    NAMESPACES,
    PODGROUPS,
    PODS,
    KubeClient,
    Resource,
)
from alnair.common.natsauth import ADMIN_USER as NATS_ADMIN
from alnair.common.redisauth import ADMIN_USER as ADMIN
from alnair.common.redisconn import redis_client, sentinel_addresses
from alnair.common.settings import CommonSettings
from alnair.common.tasks import cancel_all, spawn, within
from alnair.dev import devstack
from alnair.dev.demo_elastic import ElasticTrainer, elastic_manifest
from alnair.dev.localstack import NatsServer, RedisFailover
from alnair.dev.localstack.controlplane import parse_node_specs
from alnair.dev.localstack.procs import port_open
from alnair.dev.supervise import RESTART_MARK
from alnair.scheduler.dispatcher.parsing import LABEL_QUEUE

GANG_SIZE = 2
ELASTIC_LABEL = "alnair.io/chaos-job"
SCHEDULER_LEASE = "alnair-scheduler"
SCHEDULER_LEASE_NAMESPACE = "kube-system"
"""Where the stack's schedulers elect their leader (their settings' defaults)."""
NAMESPACE = "chaos"
QUEUE = "chaos"
RECORD_PREFIX = "alnair:record:"


@dataclass
class ChaosConfig:
    jobs: int = 1000
    kills_per_service: int = 20
    arrival_interval_s: float = 0.5
    run_s: tuple[float, float] = (10.0, 30.0)
    nats_down_s: float = 30.0
    restart_apiserver: bool = True
    queued_every: int = 2
    """Every n-th job goes through the dispatcher's queue (0: none)."""
    fraction_every: int = 5
    gang_every: int = 4
    elastic_every: int = 7
    """Every n-th job (of those neither queued nor fractional nor a gang) is an ElasticJob,
    queued too: admitted at its minimum, grown and shrunk by the elastic controller, and
    completed by the elastic demo's trainer stand-in once its work is done at the sizes it
    held (`alnair.dev.demo_elastic`; 0: none)."""
    """Every n-th job (of those neither queued nor fractional) is a gang: two 1-GPU pods of
    one PodGroup, bound all or none (0: none)."""
    """Every n-th job asks a fraction of one GPU (0: none)."""
    settle_s: float = 600.0
    nodes: str = "16x V100M32, 8x T4:4"
    services: tuple[str, ...] = (
        "profiler-agent",
        "aggregator",
        "predictor",
        "scheduler",
        "scheduler-standby",
        "dispatcher",
        "elastic",
    )
    seed: int = 16
    leader_stop_s: float = 25.0
    """The scheduler that holds the Lease is SIGSTOPped this long once (past the lease
    duration, 15 s: the standby takes over), then resumed (0: never; needs the standby)."""
    topology: str = "single"
    """`production`: a NATS node and the Redis primary are killed instead of nats-server."""


@dataclass
class Findings:
    kills: int = 0
    recoveries_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    overcommitted: set[tuple[str, int]] = field(default_factory=set)
    samples: int = 0
    sample_errors: Counter[str] = field(default_factory=Counter)
    """Samples the over-commit checker could not take, by error (the API server's restart)."""
    nats_restarts: int = 0
    nats_node_kills: int = 0
    leader_stops: list[str] = field(default_factory=list)
    """The scheduler replicas SIGSTOPped while they held the Lease."""
    redis_failovers: int = 0
    redis_failover_s: list[float] = field(default_factory=list)
    """From the primary's kill until the Sentinels name another."""
    apiserver_restarts: int = 0
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    """(fault, start, end) on the monotonic clock: kills to recovery, nats-server's outage."""
    sampled_at: list[float] = field(default_factory=list)


def job_body(
    name: str,
    gpus: int,
    run_s: float,
    ttl_after_finished_s: int | None = None,
    queue: str | None = None,
    fraction: bool = False,
    gang: int = 0,
) -> dict[str, Any]:
    """A Job for the alnair scheduler: `gpus` GPUs for `run_s` seconds of KWOK run time
    (deleted with its pods `ttl_after_finished_s` after it ends, if given); with `queue`,
    created suspended in that LocalQueue, for the dispatcher to admit; with `fraction`, half a
    GPU's compute and 8 GiB of its memory instead of whole GPUs; with `gang`, that many pods
    of `gpus` GPUs each in the PodGroup named after the Job (`gang_group`, made first)."""
    gpu = {r.GPU_COMPUTE: "50", r.GPU_MEMORY_GIB: "8"} if fraction else {r.GPU: str(gpus)}
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": {r.ANN_MODEL_NAME: "ResNet-50"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {r.ANN_DURATION: f"{run_s:.1f}s"}},
                "spec": {
                    "schedulerName": r.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi", **gpu},
                                "limits": gpu,
                            },
                        }
                    ],
                },
            },
        },
    }
    if ttl_after_finished_s is not None:
        body["spec"]["ttlSecondsAfterFinished"] = ttl_after_finished_s
    if gang:
        body["spec"] |= {"parallelism": gang, "completions": gang}
        body["spec"]["template"]["metadata"]["labels"] = {r.POD_GROUP_LABEL: name}
    if queue is not None:
        body["metadata"]["labels"] = {LABEL_QUEUE: queue}
        body["spec"]["suspend"] = True
    return body


def gang_group(name: str, members: int) -> dict[str, Any]:
    """The PodGroup of gang Job `name`: all `members` pods or none."""
    return {
        "apiVersion": f"{r.POD_GROUP_API_GROUP}/{r.POD_GROUP_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": members, "scheduleTimeoutSeconds": 120},
    }


def queue_bodies(nodes: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ClusterQueue holding every GPU of `nodes` (by model), and its LocalQueue."""
    per_model: Counter[str] = Counter()
    for spec in parse_node_specs(nodes):
        per_model[spec.model] += spec.count * spec.gpus
    flavors = [
        {"name": model, "resources": [{"name": r.GPU, "nominalQuota": gpus}]}
        for model, gpus in sorted(per_model.items())
    ]
    cluster_queue = {
        "apiVersion": "alnair.io/v1alpha1", "kind": "ClusterQueue",
        "metadata": {"name": QUEUE},
        "spec": {"resourceGroups": [{"coveredResources": [r.GPU], "flavors": flavors}]},
    }  # fmt: skip
    local_queue = {
        "apiVersion": "alnair.io/v1alpha1", "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": NAMESPACE},
        "spec": {"clusterQueue": QUEUE},
    }  # fmt: skip
    return cluster_queue, local_queue


def _keep_log(proc: devstack.Proc, n: int) -> None:
    """`up` starts a restarted service's log afresh: keep what the killed one wrote."""
    log = Path(proc.log)
    with contextlib.suppress(OSError):
        log.with_name(f"{log.name}.{n}").write_bytes(log.read_bytes())


def _command_of(pid: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment a running process was started with."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    env_raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    env = dict(item.decode().split("=", 1) for item in env_raw if b"=" in item)
    return [a.decode() for a in argv], env


def _relaunch(argv: list[str], env: dict[str, str], log_path: str) -> int:
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    # Not waited for: the stack's `down` stops it by pid, as every other process of the stack.
    return child.pid


def _kill(pid: int) -> None:
    """SIGKILL the process group of `pid` and wait until the process is gone (its port free)."""
    devstack.kill_group(pid, signal.SIGKILL, 10.0)


class Chaos:
    def __init__(self, directory: Path, cfg: ChaosConfig) -> None:
        self.dir = directory
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.opts = devstack.UpOptions(
            nodes=cfg.nodes, free_ports=True, only=cfg.services, ready_timeout_s=180.0,
            topology=cfg.topology,
        )  # fmt: skip
        self.found = Findings()
        self.names: list[str] = []
        self.queued: set[str] = set()
        self.sample_now = asyncio.Event()
        """Set at a fault's start and end: the sampler looks at once."""
        self.sampled = asyncio.Event()
        """Set after each sample taken."""
        self.fractions = 0
        self.pods_per_job: dict[str, int] = defaultdict(lambda: 1)
        """How many pods of each Job run (a gang's members), when all goes well."""
        self.elastic: set[str] = set()
        self.trainer: ElasticTrainer | None = None
        self.runtimes: dict[str, float] = {}

    # --- the stack -------------------------------------------------------------------------

    def up(self) -> devstack.State:
        return devstack.up(self.dir, self.opts)

    def state(self) -> devstack.State:
        state = devstack.State.load(self.dir)
        assert state is not None, "the stack is not up"
        return state

    async def kill_and_recover(self, name: str) -> None:
        proc = self.state().services[name]
        t0 = time.monotonic()
        self.sample_now.set()
        _kill(proc.pid)
        self.found.kills += 1
        _keep_log(proc, self.found.kills)
        await asyncio.to_thread(self.up)  # what Kubernetes would do: start it again
        self.found.recoveries_s[name].append(time.monotonic() - t0)
        await self._window_sampled(name, t0)

    async def restart_nats(self) -> None:
        state = self.state()
        (proc,) = [p for p in state.infra if p.name == "nats-server"]
        port = int(state.nats_url.rsplit(":", 1)[1])
        t0 = time.monotonic()
        self.sample_now.set()
        proc.stop(timeout_s=5.0)
        await asyncio.sleep(self.cfg.nats_down_s)
        users = state.credentials.get("nats") or None
        nats = await asyncio.to_thread(NatsServer(self.dir / "nats", port=port, users=users).start)
        state.infra = [
            devstack.Proc.of(nats.process) if p.name == "nats-server" else p for p in state.infra
        ]
        state.save()
        self.found.nats_restarts += 1
        await self._window_sampled("nats", t0)

    async def kill_nats_node(self) -> None:
        """SIGKILL one server of the NATS cluster, keep it down, start it again (its own
        command line: its port, store and routes)."""
        state = self.state()
        nodes = [p for p in state.infra if p.name.startswith("nats-")]
        proc = self.rng.choice(nodes)
        t0 = time.monotonic()
        self.sample_now.set()
        _kill(proc.pid)
        await asyncio.sleep(self.cfg.nats_down_s)
        self._started_again(state, proc)
        self.found.nats_node_kills += 1
        await self._window_sampled(proc.name, t0)

    async def kill_redis_primary(self) -> None:
        """SIGKILL the Redis primary the Sentinels name; once they name another, start the old
        one again (they make it a replica of the new primary)."""
        state = self.state()
        assert state.redis_sentinels is not None
        host, sentinel_port = sentinel_addresses(state.redis_sentinels)[0]
        password = state.credentials.get("sentinel")
        sentinel = aioredis.Redis(host=host, port=sentinel_port, password=password)

        async def primary_port() -> int:
            addr = await sentinel.sentinel_get_master_addr_by_name(
                RedisFailover.MASTER, return_responses=True
            )
            assert isinstance(addr, tuple), addr
            return int(addr[1])

        try:
            port = await primary_port()
            (proc,) = [p for p in state.infra if _port_argument(p.argv) == port]
            t0 = time.monotonic()
            self.sample_now.set()
            _kill(proc.pid)
            while True:
                with contextlib.suppress(Exception):
                    if await primary_port() != port:
                        break
                assert time.monotonic() - t0 < 60, "no Redis failover within 60 s"
                await asyncio.sleep(0.1)
            self.found.redis_failover_s.append(time.monotonic() - t0)
        finally:
            await sentinel.aclose()
        await asyncio.sleep(self.cfg.nats_down_s)
        self._started_again(state, proc)
        self.found.redis_failovers += 1
        await self._window_sampled(proc.name, t0)

    async def stop_scheduler_leader(self) -> None:
        """SIGSTOP the scheduler replica that holds the Lease (its supervisor too: the process
        group), past the lease duration, then SIGCONT it. The standby takes over meanwhile;
        the resumed one finds its Lease gone, binds nothing and exits (its supervisor starts
        it again as a follower)."""
        state = self.state()
        name = ""
        async with KubeClient.from_config(state.kubeconfig) as kube:
            for _ in range(60):  # a Lease just handed over may have no holder for a moment
                with contextlib.suppress(Exception):
                    lease = await kube.get(LEASES, SCHEDULER_LEASE, SCHEDULER_LEASE_NAMESPACE)
                    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
                    name = holder.removeprefix(devstack.IDENTITY_PREFIX)
                if name in state.services:
                    break
                await asyncio.sleep(0.5)
        assert name in state.services, f"no scheduler of the stack holds the Lease ({name!r})"
        proc = state.services[name]
        t0 = time.monotonic()
        self.sample_now.set()
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.cfg.leader_stop_s)
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
        self.found.leader_stops.append(name)
        await self._window_sampled(f"{name}-stopped", t0)

    def _started_again(self, state: devstack.State, proc: devstack.Proc) -> None:
        """Start a killed infrastructure process again with the command line it was started
        with (its port, store and peers), and record it in the stack's state."""
        assert proc.argv is not None, f"{proc.name}: no command line recorded"
        pid = _relaunch(proc.argv, dict(os.environ), proc.log)
        back = devstack.Proc(
            proc.name, pid, devstack._start_ticks(pid), proc.log, proc.port, proc.argv
        )
        state.infra = [back if p.name == proc.name else p for p in state.infra]
        state.save()

    async def _window_sampled(self, fault: str, t0: float) -> None:
        """Close a fault's window once a sample inside it is taken (asked for at its end:
        the sampler runs at once), or after 5 s without one, which the report counts."""
        self.sample_now.set()
        deadline = time.monotonic() + 5.0
        while not any(t >= t0 for t in self.found.sampled_at[-4:]):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.sampled.clear()
            with contextlib.suppress(TimeoutError):
                await within(self.sampled.wait(), remaining)
        self.found.windows.append((fault, t0, time.monotonic()))

    async def restart_apiserver(self) -> None:
        state = self.state()
        (proc,) = [p for p in state.infra if p.name == "kube-apiserver"]
        argv, env = _command_of(proc.pid)
        port = int(state.server.rsplit(":", 1)[1])
        _kill(proc.pid)
        await asyncio.sleep(1.0)
        pid = _relaunch(argv, env, proc.log)
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert time.monotonic() < deadline, "kube-apiserver did not come back"
            await asyncio.sleep(0.2)
        restarted = devstack.Proc(proc.name, pid, devstack._start_ticks(pid), proc.log)
        state.infra = [restarted if p.name == proc.name else p for p in state.infra]
        state.save()
        self.found.apiserver_restarts += 1

    # --- load and faults -------------------------------------------------------------------

    async def submit(self, kube: KubeClient) -> None:
        for i in range(self.cfg.jobs):
            name = f"job-{i:04d}"
            gpus = self.rng.choice((1, 1, 2))
            run_s = self.rng.uniform(*self.cfg.run_s)
            queued = self.cfg.queued_every > 0 and i % self.cfg.queued_every == 0
            fraction = self.cfg.fraction_every > 0 and i % self.cfg.fraction_every == 1
            gang = (
                self.cfg.gang_every > 0 and i % self.cfg.gang_every == 3
                and not queued and not fraction
            )  # fmt: skip
            elastic = (
                self.cfg.elastic_every > 0 and i % self.cfg.elastic_every == 5
                and not queued and not fraction and not gang
            )  # fmt: skip
            if elastic:
                await self._submit_elastic(kube, name, gpus, run_s)
                await asyncio.sleep(self.cfg.arrival_interval_s)
                continue
            if gang:
                gpus = 1
                await _create(kube, PODGROUPS, gang_group(name, GANG_SIZE))
                self.pods_per_job[name] = GANG_SIZE
            body = job_body(
                name, gpus, run_s, queue=QUEUE if queued else None, fraction=fraction,
                gang=GANG_SIZE if gang else 0,
            )  # fmt: skip
            await _create(kube, JOBS, body)
            self.names.append(name)
            if queued:
                self.queued.add(name)
            self.fractions += fraction
            await asyncio.sleep(self.cfg.arrival_interval_s)

    async def _submit_elastic(self, kube: KubeClient, name: str, gpus: int, run_s: float) -> None:
        """An ElasticJob in the chaos queue, created held (the dispatcher releases it), whose
        work takes `run_s` at `gpus` workers; the trainer stand-in completes it."""
        body = elastic_manifest(
            name, NAMESPACE, gpus, labels={LABEL_QUEUE: QUEUE},
            annotations={r.ANN_MODEL_NAME: "ResNet-50"}, pod_labels={ELASTIC_LABEL: name},
            pod_annotations={},
        )  # fmt: skip
        body["spec"]["suspend"] = True
        assert self.trainer is not None
        self.trainer.add(name, NAMESPACE, gpus)
        self.runtimes[name] = run_s
        await _create(kube, ELASTICJOBS, body)
        self.names.append(name)
        self.queued.add(name)
        self.elastic.add(name)

    async def follow_workers(self, kube: KubeClient) -> None:
        """Feed the trainer stand-in every change of an elastic job's workers (an informer:
        it lists again after the API server's restart)."""
        informer = Informer(
            kube, PODS, namespace=NAMESPACE, label_selector=ELASTIC_LABEL, name="chaos-workers"
        )

        async def on_pod(event: WatchEvent, pod: Any, _old: Any) -> None:
            job = (pod["metadata"].get("labels") or {}).get(ELASTIC_LABEL)
            if job and self.trainer is not None and job in self.trainer:
                self.trainer.on_worker(job, pod, "", event is WatchEvent.DELETED)

        informer.handlers.append(on_pod)
        await informer.run()

    async def faults(self, until_s: float) -> None:
        plan = [s for s in self.cfg.services for _ in range(self.cfg.kills_per_service)]
        self.rng.shuffle(plan)
        events: list[tuple[float, str]] = [(self.rng.uniform(0, until_s), s) for s in plan]
        if self.cfg.topology == "production":
            events.append((self.rng.uniform(0.2, 0.4) * until_s, "nats-node"))
            events.append((self.rng.uniform(0.5, 0.7) * until_s, "redis-primary"))
        else:
            events.append((self.rng.uniform(0.2, 0.6) * until_s, "nats"))
        if self.cfg.restart_apiserver:
            events.append((self.rng.uniform(0.3, 0.8) * until_s, "apiserver"))
        if self.cfg.leader_stop_s > 0 and "scheduler-standby" in self.cfg.services:
            events.append((self.rng.uniform(0.1, 0.5) * until_s, "scheduler-leader"))
        events.sort()
        start = time.monotonic()
        for at, what in events:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - start)))
            if what == "nats":
                await self.restart_nats()
            elif what == "nats-node":
                await self.kill_nats_node()
            elif what == "redis-primary":
                await self.kill_redis_primary()
            elif what == "scheduler-leader":
                await self.stop_scheduler_leader()
            elif what == "apiserver":
                await self.restart_apiserver()
            else:
                await self.kill_and_recover(what)

    async def sample(self, kube: KubeClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                pods = (await kube.list(PODS, NAMESPACE))["items"]
            except Exception as exc:  # the API server is being restarted: counted, not hidden
                self.found.sample_errors[type(exc).__name__] += 1
            else:
                held: dict[tuple[str, int], int] = defaultdict(int)
                for pod in pods:
                    node = pod["spec"].get("nodeName")
                    phase = (pod.get("status") or {}).get("phase")
                    ann = pod["metadata"].get("annotations") or {}
                    if not node or phase in {"Succeeded", "Failed"}:
                        continue
                    share = int(ann.get(r.ANN_GPU_MILLI) or r.MILLI_PER_GPU) or r.MILLI_PER_GPU
                    indices = ann.get(r.ANN_GPU_INDICES) or ""
                    if not indices.strip():
                        continue  # bound, its GPUs not written yet (or none asked)
                    for gpu in r.parse_indices(indices):
                        held[(node, gpu)] += share
                self.found.overcommitted |= {k for k, n in held.items() if n > r.MILLI_PER_GPU}
                self.found.samples += 1
                self.found.sampled_at.append(time.monotonic())
                self.sampled.set()
            with contextlib.suppress(TimeoutError):
                await within(self.sample_now.wait(), 1.0)
            self.sample_now.clear()

    # --- the run and the checker --------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        state = self.state()
        async with KubeClient.from_config(state.kubeconfig) as kube:
            with contextlib.suppress(Exception):
                await kube.create(
                    NAMESPACES,
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                )
            cluster_queue, local_queue = queue_bodies(self.cfg.nodes)
            await kube.create(CLUSTERQUEUES, cluster_queue)
            await kube.create(LOCALQUEUES, local_queue, NAMESPACE)
            stop = asyncio.Event()
            sampler = asyncio.create_task(self.sample(kube, stop))
            self.trainer = ElasticTrainer(kube, time.monotonic, lambda job, _m: self.runtimes[job])
            helpers = [
                spawn(self.trainer.run(), name="chaos.elastic-trainer"),
                spawn(self.follow_workers(kube), name="chaos.elastic-workers"),
            ]
            arrivals_s = self.cfg.jobs * self.cfg.arrival_interval_s
            t0 = time.monotonic()
            await asyncio.gather(self.submit(kube), self.faults(arrivals_s))
            await self.settle(kube)
            elapsed = time.monotonic() - t0
            stop.set()
            await sampler
            await cancel_all(helpers)
            report = await self.check(kube)
        report["elapsed_s"] = round(elapsed, 1)
        return report

    async def settle(self, kube: KubeClient) -> None:
        """Until every Job is complete and has its record, or `settle_s` has passed. A job
        no sample of which reached the aggregator is recorded only `late_samples_s` (90 s)
        after its end, so the records are waited for, not assumed after a pause."""
        deadline = time.monotonic() + self.cfg.settle_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                jobs = await self._workloads(kube)
                if len(jobs) == len(self.names) and all(job_complete(j) for j in jobs.values()):
                    records = await self.records()
                    if all(records[n] for n in self.names):
                        return
            await asyncio.sleep(2.0)

    async def _workloads(self, kube: KubeClient) -> dict[str, dict[str, Any]]:
        """Every Job and ElasticJob of the run, by name."""
        found = {j["metadata"]["name"]: j for j in (await kube.list(JOBS, NAMESPACE))["items"]}
        if self.elastic:
            elastic = (await kube.list(ELASTICJOBS, NAMESPACE))["items"]
            found |= {j["metadata"]["name"]: {**j, "kind": "ElasticJob"} for j in elastic}
        return found

    async def records(self) -> dict[str, list[bool]]:
        """Execution records in Redis per Job name, each as whether it has usage (a record
        without is of a job no sample of which reached the aggregator)."""
        state = self.state()
        admin = state.credentials.get("redis") or {}
        client = redis_client(
            CommonSettings(
                redis_url=state.redis_url,
                redis_sentinels=state.redis_sentinels,
                redis_user=ADMIN if ADMIN in admin else None,
                redis_password=admin.get(ADMIN),
                redis_sentinel_password=state.credentials.get("sentinel"),
            )
        )
        try:
            records: dict[str, list[bool]] = defaultdict(list)
            async for key in client.scan_iter(f"{RECORD_PREFIX}{NAMESPACE}/*"):
                _ns, job, _uid = key.decode()[len(RECORD_PREFIX) :].split("/", 2)
                records[job].append(bool(await client.hexists(key, "peak_gpu_mem_mib")))
            return records
        finally:
            await client.aclose()

    async def completions(self) -> Counter[str]:
        """`completed` job events per Job name, read from the JOBS stream's start (what every
        consumer of completions was given, duplicates included)."""
        state = self.state()
        password = (state.credentials.get("nats") or {}).get(NATS_ADMIN)
        creds: dict[str, Any] = {"user": NATS_ADMIN, "password": password} if password else {}
        servers = state.nats_url.split(",")
        nc = await nats.connect(servers=servers, name="chaos-checker", **creds)
        found: Counter[str] = Counter()
        try:
            js = nc.jetstream()
            subject = f"{JobEvent.SUBJECT_PREFIX}.*.{subject_token(NAMESPACE)}.*"
            pending = (await js.stream_info(JobEvent.STREAM or "JOBS")).state.messages
            sub = await js.pull_subscribe(
                subject, stream=JobEvent.STREAM,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=60),
            )  # fmt: skip
            seen = 0
            while seen < pending:
                try:
                    batch = await sub.fetch(256, timeout=2.0)
                except nats.errors.TimeoutError:
                    break  # the subject's messages are fewer than the stream's
                for msg in batch:
                    seen += 1
                    with contextlib.suppress(DecodeError):
                        event = decode(msg.data, JobEvent).data
                        if event.phase is JobPhase.COMPLETED and event.kind in (
                            "Job", "ElasticJob",
                        ):  # fmt: skip
                            found[event.name] += 1
                    await msg.ack()
            await sub.unsubscribe()
        finally:
            await nc.close()
        return found

    def service_restarts(self) -> int:
        """Exits of a service that its supervisor answered by starting it again, in every
        service's logs (those kept from killed processes included)."""
        logs = self.dir / "logs"
        return sum(
            line.startswith(RESTART_MARK)
            for log in logs.glob("*.log*")
            for line in log.read_text(errors="replace").splitlines()
            if "restart" in line
        )

    async def check(self, kube: KubeClient) -> dict[str, Any]:
        jobs = await self._workloads(kube)
        pods = (await kube.list(PODS, NAMESPACE))["items"]
        ran: dict[str, int] = defaultdict(int)
        for pod in pods:
            job = (pod["metadata"].get("labels") or {}).get("job-name")
            if job and pod["spec"].get("nodeName"):
                ran[job] += 1
        complete = [n for n in self.names if n in jobs and job_complete(jobs[n])]
        records = await self.records()
        completions = await self.completions()
        admitted: Counter[str] = Counter()
        for event in (await kube.list(EVENTS, NAMESPACE))["items"]:
            involved = event.get("involvedObject") or {}
            if event.get("reason") == "Admitted" and involved.get("kind") in ("Job", "ElasticJob"):
                series = (event.get("series") or {}).get("count")
                admitted[involved.get("name", "")] += int(series or event.get("count") or 1)
        recoveries = sorted(t for ts in self.found.recoveries_s.values() for t in ts)
        return {
            "jobs": len(self.names),
            "lost": len(self.names) - len(complete),
            # (an elastic job's workers come and go as it resizes: not counted here)
            "double_bound": sum(
                1 for n in complete if n not in self.elastic and ran[n] > self.pods_per_job[n]
            ),
            "gpu_overcommitted": len(self.found.overcommitted),
            "records_duplicated": sum(1 for n in complete if len(records[n]) > 1),
            "records_missing": sum(1 for n in complete if not records[n]),
            "records_without_usage": sum(1 for n in complete if records[n] and not any(records[n])),
            "completions_duplicated": sum(1 for n in complete if completions[n] > 1),
            "completions_missing": sum(1 for n in complete if not completions[n]),
            "queued": len(self.queued),
            "admissions_duplicated": sum(1 for n in self.queued if admitted[n] > 1),
            "admissions_unrecorded": sum(
                1 for n in complete if n in self.queued and not admitted[n]
            ),
            "kills": self.found.kills,
            "recovery_p99_s": round(_pct(recoveries, 0.99), 2) if recoveries else None,
            "recovery_p50_s": round(_pct(recoveries, 0.5), 2) if recoveries else None,
            "recovery_max_s_by_service": {
                name: round(max(ts), 2) for name, ts in sorted(self.found.recoveries_s.items())
            },
            "services": list(self.cfg.services),
            "nats_restarts": self.found.nats_restarts,
            "topology": self.cfg.topology,
            "nats_node_kills": self.found.nats_node_kills,
            "leader_stops": self.found.leader_stops,
            "redis_failovers": self.found.redis_failovers,
            "redis_failover_s": [round(t, 2) for t in self.found.redis_failover_s],
            "service_restarts": self.service_restarts(),
            "apiserver_restarts": self.found.apiserver_restarts,
            "pod_samples": self.found.samples,
            "fault_windows": len(self.found.windows),
            "fault_windows_unsampled": sum(
                1
                for _f, t0, t1 in self.found.windows
                if not any(t0 <= t <= t1 for t in self.found.sampled_at)
            ),
            "fractions": self.fractions,
            "gangs": sum(1 for n in self.pods_per_job if self.pods_per_job[n] > 1),
            "elastic": len(self.elastic),
            "elastic_grew": self.trainer.grew(self.elastic) if self.trainer else 0,
            "elastic_completion_retries": self.trainer.retries if self.trainer else 0,
            "elastic_problems": list(self.trainer.problems) if self.trainer else [],
            "pod_sample_errors": dict(self.found.sample_errors),
        }


async def _create(kube: KubeClient, resource: Resource, body: dict[str, Any]) -> None:
    """Create `body` in the chaos namespace, again and again while the API server restarts
    (done once it exists)."""
    name = body["metadata"]["name"]
    while True:
        try:
            await kube.create(resource, body, NAMESPACE)
            return
        except Exception:  # the API server may be restarting: try again
            with contextlib.suppress(Exception):
                await kube.get(resource, name, NAMESPACE)
                return
            await asyncio.sleep(0.5)


def _port_argument(argv: list[str] | None) -> int | None:
    """The value of `--port` in a recorded command line (None: it has none)."""
    if not argv or "--port" not in argv[:-1]:
        return None
    return int(argv[argv.index("--port") + 1])


def job_complete(job: dict[str, Any]) -> bool:
    """A Job with its Complete condition, or an ElasticJob whose phase says Succeeded."""
    if job.get("kind") == "ElasticJob":
        return (job.get("status") or {}).get("phase") == "Succeeded"
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_chaos(directory: Path, cfg: ChaosConfig) -> dict[str, Any]:
    """Bring the stack up in `directory`, run the chaos, take it down; the report."""
    chaos = Chaos(directory, cfg)
    try:
        chaos.up()
        return asyncio.run(chaos.run())
    finally:
        devstack.down(directory)
