"""Scheduler throughput and latency: Alnair vs kube-scheduler, measured as scheduler_perf does.

On the local control plane (real etcd + kube-apiserver + controller-manager, KWOK kubelets),
`--nodes` KWOK nodes with 8 V100 GPUs each, spread over 10 zones
(`topology.kubernetes.io/zone`). For every workload, repetition and scheduler (the order
alternates between repetitions and workloads), one trial:

1. batch (throughput): `--pods` pods are created while no scheduler runs; then the scheduler
   starts as its own process, exactly as deployed (`python -m alnair.scheduler` with its
   settings; kube-scheduler v1.36.3 with a KubeSchedulerConfiguration). Throughput is the pods
   bound over the time from the first bind to the last, as scheduler_perf's throughput
   collector counts from the first scheduled pod (the time from process start to the first
   bind, listing and caches included, is `startup_s`);
2. steady rate (latency): with the scheduler still running, `--steady-pods` more pods are
   created at `--rate` pods/s (below both schedulers' ceilings), each timed from its create
   request to the moment the watch sees it bound (p50/p99);
3. the scheduler stops, every placement is checked (each pod bound, no GPU over-committed, per
   GPU for Alnair's annotated indices, per node otherwise; the workload's own constraint held)
   and the pods are deleted.

Then, for Alnair (`--no-takeover` skips it), `--repeats` take-over trials: a leader and a warm
standby with leader election as shipped (lease 15 s), the leader SIGKILLed, 20 pods created
at once: `takeover.takeover_s` is the time from the kill to the standby's first bind, to be
within the lease duration plus one second.

Binds are seen on a watch, never by polling. Client limits, as scheduler_perf sets them:
kube-scheduler's client QPS and burst 5000 (`clientConnection`); Alnair has no client-side
rate limiter, its equivalent is `max_binds_in_flight` (256 concurrent Bindings, its default).
The harness's own ceiling is measured by `bench/noop_binder.py` (binds round-robin, decides
nothing) on the basic pods.

Workloads: `basic` (one GPU), `node-affinity` (required zone among 8 of 10), `pod-anti-affinity`
(8 groups, at most one pod of a group per node), `topology-spread` (zones, maxSkew 1,
DoNotSchedule), `preemption` (every node full of a low-priority 8-GPU pod; high-priority
one-GPU pods arrive), `gang` (PodGroups of 8 one-GPU pods; kube-scheduler with the
coscheduling plugin of kubernetes-sigs/scheduler-plugins, built by hack/build-coscheduling.sh),
`fractional` (`alnair.io/gpu-memory: 8192` MiB of a 32 GiB GPU: Alnair packs four per GPU
with GPU indices; kube-scheduler sees the same request as a node-level extended resource, so it
checks a node total and places no GPU: a cheaper and weaker decision).

Prints one JSON object: `{"workloads": {"<name>": {"nodes", "pods", "alnair_pods_per_s",
"kube_scheduler_pods_per_s", "ratio", "alnair_p99_s", "kube_scheduler_p99_s", "runs", ...}}}`
with medians over the repetitions and their min/max; each trial on stderr as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from alnair.common import resources as r
from alnair.common.kube import (
    NAMESPACES,
    PODGROUPS,
    PODS,
    PRIORITYCLASSES,
    Conflict,
    Gone,
    KubeClient,
    Obj,
    Unavailable,
)
from alnair.common.settings import LeaderElectionSettings
from alnair.common.tasks import within
from alnair.dev.localstack import ControlPlane, ManagedProcess, free_port
from alnair.dev.localstack.controlplane import (
    K8S_VERSION,
    binary,
    cache_dir,
    wait_nodes_ready,
)

WORKLOADS = (
    "basic",
    "node-affinity",
    "pod-anti-affinity",
    "topology-spread",
    "preemption",
    "gang",
    "fractional",
)
ZONE = "topology.kubernetes.io/zone"
ZONES = 10
AFFINITY_ZONES = 8  # node-affinity pods accept zones 0-7 of 10
ANTI_GROUPS = 8
GANG_SIZE = 8
GPUS_PER_NODE = 8
FRACTION_MIB = 8192  # a quarter of a V100M32
KUBE_QPS = 5000  # scheduler_perf: cfg.QPS = 5000, cfg.Burst = 5000
SCHEDULER_PLUGINS = os.environ.get("ALNAIR_SCHEDULER_PLUGINS_VERSION", "v0.34.7")
LOW, HIGH = "bench-low", "bench-high"
MEASURED = "bench.alnair.io/measured"


def coscheduling_binary() -> Path | None:
    path = cache_dir() / "bin" / f"scheduler-plugins-{SCHEDULER_PLUGINS}" / "kube-scheduler"
    return path if path.exists() else None


# --- pods ---------------------------------------------------------------------------------


def make_pod(workload: str, ns: str, name: str, i: int, scheduler: str) -> Obj:
    """The i-th measured pod of a workload."""
    labels = {MEASURED: "true"}
    requests: dict[str, str] = {"cpu": "100m", "memory": "256Mi"}
    limits: dict[str, str] = {}
    if workload == "fractional":
        requests[r.GPU_MEMORY] = limits[r.GPU_MEMORY] = str(FRACTION_MIB)
    else:
        requests[r.GPU] = limits[r.GPU] = "1"
    spec: Obj = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "example.com/train:1",
                "resources": {"requests": requests, "limits": limits},
            }
        ],
    }
    if workload == "node-affinity":
        zones = [f"zone-{z}" for z in range(AFFINITY_ZONES)]
        term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": zones}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    elif workload == "pod-anti-affinity":
        group = f"g{i % ANTI_GROUPS}"
        labels["group"] = group
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"group": group}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    elif workload == "topology-spread":
        labels["app"] = "spread"
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            }
        ]
    elif workload == "preemption":
        spec["priorityClassName"] = HIGH
    elif workload == "gang":
        labels[r.POD_GROUP_LABEL] = f"gang-{i // GANG_SIZE:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
    }


def filler_pod(ns: str, node: str, scheduler: str) -> Obj:
    """A low-priority pod already bound to `node`, holding all its GPUs (preemption)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"low-{node}", "namespace": ns, "labels": {"role": "filler"}},
        "spec": {
            "schedulerName": scheduler,
            "nodeName": node,
            "priorityClassName": LOW,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/train:1",
                    "resources": {
                        "requests": {"cpu": "100m", r.GPU: str(GPUS_PER_NODE)},
                        "limits": {r.GPU: str(GPUS_PER_NODE)},
                    },
                }
            ],
        },
    }


def pod_group(ns: str, name: str) -> Obj:
    return {
        "apiVersion": f"{r.POD_GROUP_API_GROUP}/{r.POD_GROUP_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minMember": GANG_SIZE, "scheduleTimeoutSeconds": 60},
    }


def check_capacity(workload: str, nodes: int, total: int) -> None:
    """Refuse a configuration whose pods cannot all fit (the run would only time out)."""
    gpus = nodes * GPUS_PER_NODE
    room = {
        "node-affinity": gpus * AFFINITY_ZONES // ZONES,
        "pod-anti-affinity": nodes * ANTI_GROUPS,
        "topology-spread": gpus,
        "fractional": gpus * (32768 // FRACTION_MIB),
    }.get(workload, gpus)
    if total > room:
        raise SystemExit(
            f"--pods/--steady-pods: {total} {workload} pods do not fit {nodes} nodes "
            f"(room for {room})"
        )
    if workload == "gang" and total % GANG_SIZE:
        raise SystemExit(f"--pods/--steady-pods: gang pods must be a multiple of {GANG_SIZE}")


# --- schedulers ---------------------------------------------------------------------------


@dataclass
class Scheduler:
    label: str  # alnair | kube_scheduler | noop
    name: str  # the pods' spec.schedulerName
    proc: ManagedProcess


_PROFILES = itertools.count()


def schedulers(
    cp: ControlPlane, work: Path, workload: str, policy: str, profile: str | None = None
) -> list[Scheduler]:
    logs = work / "logs"
    alnair_env = alnair_settings(cp, policy, free_port(), ALNAIR_SCHEDULER_LEADER_ELECT="false")
    argv = [sys.executable, "-m", "alnair.scheduler"]
    if profile:
        # cProfile writes when the process exits (SIGTERM stops the scheduler cleanly)
        argv[1:1] = ["-m", "cProfile", "-o", f"{profile}.{workload}.{next(_PROFILES)}"]
    alnair = ManagedProcess("alnair-scheduler", argv, logs, env=alnair_env)
    config = work / f"kube-scheduler-{workload}.yaml"
    text = (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {cp.kubeconfig}\n"
        f"  qps: {KUBE_QPS}\n  burst: {KUBE_QPS}\n"
        "leaderElection:\n  leaderElect: false\n"
    )
    exe = binary("kube-scheduler")
    if workload == "gang" and (cosched := coscheduling_binary()) is not None:
        exe = cosched
        # the coscheduling profile of scheduler-plugins' manifests/coscheduling
        text += (
            "profiles:\n- schedulerName: default-scheduler\n  plugins:\n"
            "    multiPoint:\n      enabled:\n      - name: Coscheduling\n"
            "    queueSort:\n      enabled:\n      - name: Coscheduling\n"
            "      disabled:\n      - name: '*'\n"
            "  pluginConfig:\n  - name: Coscheduling\n    args:\n"
            "      permitWaitingTimeSeconds: 60\n"
        )
    config.write_text(text)
    upstream = ManagedProcess(
        "kube-scheduler",
        [str(exe), "--config", str(config), "--secure-port", "0", "--v", "1"],
        logs,
    )
    return [
        Scheduler("alnair", "alnair", alnair),
        Scheduler("kube_scheduler", "default-scheduler", upstream),
    ]


def alnair_settings(cp: ControlPlane, policy: str, port: int, **more: str) -> dict[str, str]:
    """The environment every Alnair scheduler of the benchmark runs with (NATS off, its HTTP
    API on loopback `port`), plus `more`."""
    return {
        "ALNAIR_KUBECONFIG": str(cp.kubeconfig),
        "ALNAIR_SCHEDULER_NATS_ENABLED": "false",
        "ALNAIR_SCHEDULER_HTTP_PORT": str(port),
        "ALNAIR_SCHEDULER_HTTP_HOST": "127.0.0.1",
        "ALNAIR_SCHEDULER_POLICY": policy,
        "ALNAIR_LOG_LEVEL": "warning",
        **more,
    }


SHIPPED_LEASE_S = float(LeaderElectionSettings.model_fields["lease_duration_s"].default)
"""The lease duration a replica runs with when nothing overrides it (15 s)."""


def alnair_replica(
    cp: ControlPlane, work: Path, identity: str, lease_namespace: str, policy: str
) -> tuple[ManagedProcess, int]:
    """One Alnair replica with leader election as shipped (the settings' defaults: lease
    `SHIPPED_LEASE_S`, renew deadline 10 s, retry 2 s), and its HTTP port."""
    port = free_port()
    env = alnair_settings(
        cp, policy, port,
        ALNAIR_SCHEDULER_LEADER_ELECT="true",
        ALNAIR_SCHEDULER_IDENTITY=identity,
        ALNAIR_SCHEDULER_LEASE_NAMESPACE=lease_namespace,
    )  # fmt: skip
    argv = [sys.executable, "-m", "alnair.scheduler"]
    return ManagedProcess(f"alnair-scheduler-{identity}", argv, work / "logs", env=env), port


def noop_scheduler(cp: ControlPlane, work: Path) -> Scheduler:
    here = Path(__file__).with_name("noop_binder.py")
    argv = [sys.executable, str(here), "--kubeconfig", str(cp.kubeconfig), "--scheduler-name"]
    proc = ManagedProcess("noop-binder", [*argv, "noop"], work / "logs")
    return Scheduler("noop", "noop", proc)


# --- measurement --------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


@dataclass
class Binds:
    """Bind times of measured pods, filled by one watch on the trial's namespace."""

    at: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, kube: KubeClient, ns: str, rv: str) -> None:
        selector = f"{MEASURED}=true"
        while True:
            try:
                async for kind, obj in kube.watch(
                    PODS, ns, resource_version=rv, label_selector=selector, timeout_s=300
                ):
                    rv = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self.seen(obj)
            except (Gone, Unavailable):
                # resume from a fresh list; binds it reveals are timed now (late, never missed)
                listing = await kube.list(PODS, ns, label_selector=selector)
                for obj in listing["items"]:
                    self.seen(obj)
                rv = listing["metadata"]["resourceVersion"]

    def seen(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if obj["spec"].get("nodeName") and name not in self.at:
            self.at[name] = time.monotonic()
            self.changed.set()

    async def wait_for(
        self, names: set[str] | int, sched: Scheduler, watcher: asyncio.Task[None], timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if watcher.done():
                watcher.result()  # the watch's error, if it died
                raise RuntimeError("bind watch ended")
            done = (
                len(self.at) >= names if isinstance(names, int) else names.issubset(self.at.keys())
            )
            if done:
                return
            if not sched.proc.alive():
                raise RuntimeError(f"{sched.label} exited: {sched.proc.tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await within(self.changed.wait(), min(left, 1.0))


async def create_all(kube: KubeClient, objs: list[tuple[Any, Obj]], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(res: Any, obj: Obj) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    await kube.create(res, obj, obj["metadata"]["namespace"])
                    return
                except Conflict:
                    return  # a retried create that had landed
                except Unavailable:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.5 * (attempt + 1))

    await asyncio.gather(*(one(res, o) for res, o in objs))


async def delete_all(kube: KubeClient, ns: str) -> None:
    """Delete every pod and PodGroup of the trial and wait until they are gone.

    A collection delete of thousands of pods outlasts the client timeout and stops when the
    client goes, so it is repeated until nothing is left."""
    deadline = time.monotonic() + 900
    for res in (PODS, PODGROUPS):
        while time.monotonic() < deadline:
            with contextlib.suppress(Unavailable):
                page = await kube.request("GET", res.path(ns), params={"limit": 1})
                if not page.get("items"):
                    break
                params = {"gracePeriodSeconds": 0} if res is PODS else {}
                await kube.request("DELETE", res.path(ns), params=params)


@dataclass
class Cluster:
    nodes: dict[str, str]  # name -> zone
    gpu_memory_mib: int  # per GPU


def validate(workload: str, pods: list[Obj], cluster: Cluster) -> list[str]:
    """Every violation of the placement invariants (empty when all is well)."""
    bad: list[str] = []
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    measured = [p for p in live if p["metadata"].get("labels", {}).get(MEASURED)]
    unbound = [p["metadata"]["name"] for p in measured if not p["spec"].get("nodeName")]
    if unbound:
        bad.append(f"{len(unbound)} pods unbound, e.g. {unbound[:3]}")
    whole: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    per_gpu: Counter[tuple[str, int]] = Counter()
    for p in live:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        req = p["spec"]["containers"][0]["resources"].get("requests", {})
        whole[node] += int(req.get(r.GPU, 0))
        memory[node] += int(req.get(r.GPU_MEMORY, 0))
        ann = p["metadata"].get("annotations") or {}
        if ann.get(r.ANN_GPU_INDICES):
            milli = int(ann.get(r.ANN_GPU_MILLI, r.MILLI_PER_GPU))
            for idx in r.parse_indices(ann[r.ANN_GPU_INDICES]):
                per_gpu[node, idx] += milli
    for node, n in whole.items():
        if n > GPUS_PER_NODE:
            bad.append(f"{node}: {n} whole GPUs on {GPUS_PER_NODE}")
    for node, mib in memory.items():
        if mib > GPUS_PER_NODE * cluster.gpu_memory_mib:
            bad.append(f"{node}: {mib} MiB of GPU memory on {GPUS_PER_NODE} GPUs")
    for (node, idx), milli in per_gpu.items():
        if milli > r.MILLI_PER_GPU or not 0 <= idx < GPUS_PER_NODE:
            bad.append(f"{node} GPU {idx}: {milli} milli-GPU")
    placed = [p for p in measured if p["spec"].get("nodeName")]
    if workload == "node-affinity":
        allowed = {f"zone-{z}" for z in range(AFFINITY_ZONES)}
        wrong = [p for p in placed if cluster.nodes[p["spec"]["nodeName"]] not in allowed]
        if wrong:
            bad.append(f"{len(wrong)} pods outside their required zones")
    elif workload == "pod-anti-affinity":
        pairs = Counter((p["spec"]["nodeName"], p["metadata"]["labels"]["group"]) for p in placed)
        if twice := [k for k, n in pairs.items() if n > 1]:
            bad.append(f"{len(twice)} (node, group) pairs hold two pods, e.g. {twice[:2]}")
    elif workload == "topology-spread":
        zones = Counter(cluster.nodes[p["spec"]["nodeName"]] for p in placed)
        counts = [zones.get(z, 0) for z in set(cluster.nodes.values())]
        if counts and max(counts) - min(counts) > 1:
            bad.append(f"zone skew {max(counts) - min(counts)} > 1: {dict(zones)}")
    elif workload == "gang":
        groups: defaultdict[str, int] = defaultdict(int)
        for p in placed:
            groups[p["metadata"]["labels"][r.POD_GROUP_LABEL]] += 1
        if partial := [g for g, n in groups.items() if n % GANG_SIZE]:
            bad.append(f"{len(partial)} gangs partly bound, e.g. {partial[:2]}")
    return bad


async def trial(
    kube: KubeClient,
    cluster: Cluster,
    args: argparse.Namespace,
    workload: str,
    sched: Scheduler,
    rep: int,
    steady_pods: int,
) -> dict[str, Any]:
    ns = f"b-{workload}-{sched.label.replace('_', '-')}-{rep}"
    await kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    total = args.pods + steady_pods
    setup: list[tuple[Any, Obj]] = []
    if workload == "gang":
        setup += [(PODGROUPS, pod_group(ns, f"gang-{g:05d}")) for g in range(total // GANG_SIZE)]
    if workload == "preemption":
        setup += [(PODS, filler_pod(ns, node, sched.name)) for node in cluster.nodes]
    await create_all(kube, setup, args.concurrency)
    batch = [(PODS, make_pod(workload, ns, f"p-{i:05d}", i, sched.name)) for i in range(args.pods)]
    await create_all(kube, batch, args.concurrency)
    listing = await kube.list(PODS, ns, limit=1)
    binds = Binds()
    watcher = asyncio.create_task(binds.follow(kube, ns, listing["metadata"]["resourceVersion"]))
    evicted_in_batch: int | None = None
    t_start = time.monotonic()
    sched.proc.start()
    try:
        await binds.wait_for(args.pods, sched, watcher, args.timeout_s)
        batch_bound = len(binds.at)
        times = sorted(binds.at.values())
        if workload == "preemption":
            # Victims the batch cost: fillers deleted or being deleted when its last pod bound.
            fillers = (await kube.list(PODS, ns, label_selector="role=filler"))["items"]
            live = [f for f in fillers if not f["metadata"].get("deletionTimestamp")]
            evicted_in_batch = len(cluster.nodes) - len(live)
        sent: dict[str, float] = {}
        if steady_pods and batch_bound == args.pods:
            steady: list[asyncio.Task[None]] = []
            t0 = time.monotonic()
            for j in range(steady_pods):
                i = args.pods + j
                delay = t0 + j / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                name = f"p-{i:05d}"
                sent[name] = time.monotonic()
                obj = make_pod(workload, ns, name, i, sched.name)
                steady.append(asyncio.create_task(create_all(kube, [(PODS, obj)], 1)))
            await asyncio.gather(*steady)
            await binds.wait_for(set(sent), sched, watcher, args.timeout_s)
    finally:
        sched.proc.stop()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    pods = (await kube.list(PODS, ns))["items"]
    violations = validate(workload, pods, cluster)
    latencies = [binds.at[n] - s for n, s in sent.items() if n in binds.at]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    result: dict[str, Any] = {
        "workload": workload,
        "scheduler": sched.label,
        "rep": rep,
        "pods": args.pods,
        "bound": batch_bound,
        "startup_s": round(times[0] - t_start, 3) if times else None,
        "first_to_last_bind_s": round(span, 3),
        "pods_per_s": round((batch_bound - 1) / span, 1) if span > 0 else None,
        "steady_pods": steady_pods,
        "steady_rate_per_s": args.rate,
        "steady_bound": len(latencies),
        "p50_s": round(v, 4) if (v := pct(latencies, 50)) is not None else None,
        "p99_s": round(v, 4) if (v := pct(latencies, 99)) is not None else None,
        "violations": violations,
    }
    if evicted_in_batch is not None:
        result["victims_batch"] = evicted_in_batch
        left = [p for p in pods if (p["metadata"].get("labels") or {}).get("role") == "filler"]
        result["victims"] = len(cluster.nodes) - len(left)
    if batch_bound < args.pods or len(latencies) < steady_pods:
        result["violations"].append(
            f"timed out: {batch_bound}/{args.pods} batch, {len(latencies)}/{steady_pods} steady"
        )
        result["log_tail"] = sched.proc.tail(5)
    print(json.dumps(result), file=sys.stderr, flush=True)
    await delete_all(kube, ns)
    with contextlib.suppress(Exception):
        await kube.delete(NAMESPACES, ns)
    return result


TAKEOVER_PODS = 20
"""Pods created right after the leader's death (the standby's first bind ends the wait)."""


async def takeover_trial(
    kube: KubeClient, cp: ControlPlane, work: Path, args: argparse.Namespace, rep: int
) -> dict[str, Any]:
    """Alnair's failover, on the basic workload: a leader and a warm standby (both synced,
    the standby following the Lease); the leader is SIGKILLed (no hand-back), pods arrive at
    once; `takeover_s` is the time from the kill to the standby's first bind. The bound is
    the lease duration plus one second (the standby must wait out the lease it last saw
    renewed, and the leader may have renewed just before it died)."""
    ns = f"b-takeover-{rep}"
    await kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    leader, _ = alnair_replica(cp, work, f"leader-{rep}", ns, args.policy)
    standby, standby_port = alnair_replica(cp, work, f"standby-{rep}", ns, args.policy)
    sched = Scheduler("alnair", "alnair", leader)
    listing = await kube.list(PODS, ns, limit=1)
    binds = Binds()
    watcher = asyncio.create_task(binds.follow(kube, ns, listing["metadata"]["resourceVersion"]))
    result: dict[str, Any] = {"lease_duration_s": SHIPPED_LEASE_S, "pods": TAKEOVER_PODS}
    try:
        leader.start()
        warm = make_pod("basic", ns, "warm-up", 0, "alnair")
        await create_all(kube, [(PODS, warm)], 1)
        await binds.wait_for({"warm-up"}, sched, watcher, args.timeout_s)
        if "warm-up" not in binds.at:
            raise RuntimeError(f"the leader never bound: {leader.tail()}")
        standby.start()
        async with httpx.AsyncClient(timeout=2.0) as http:
            deadline = time.monotonic() + args.timeout_s
            while True:  # synced, following (a follower is ready with leading=false)
                with contextlib.suppress(httpx.HTTPError):
                    answer = await http.get(f"http://127.0.0.1:{standby_port}/readyz")
                    if answer.status_code == 200:
                        break
                if time.monotonic() > deadline or not standby.alive():
                    raise RuntimeError(f"the standby never got ready: {standby.tail()}")
                await asyncio.sleep(0.2)
        await asyncio.sleep(3.0)  # a few renewals seen by the standby's watch
        assert leader.proc is not None
        os.killpg(leader.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        pods = [
            (PODS, make_pod("basic", ns, f"t-{i:03d}", i, "alnair")) for i in range(TAKEOVER_PODS)
        ]
        await create_all(kube, pods, TAKEOVER_PODS)
        names = {obj["metadata"]["name"] for _, obj in pods}
        await binds.wait_for(names, Scheduler("alnair", "alnair", standby), watcher, 60.0)
        landed = [binds.at[n] for n in names if n in binds.at]
        result |= {
            "takeover_s": round(min(landed) - killed, 3) if landed else None,
            "all_bound_s": round(max(landed) - killed, 3) if len(landed) == len(names) else None,
            "bound": len(landed),
        }
        result["within_lease_plus_1s"] = (
            result["takeover_s"] is not None
            and result["takeover_s"] <= result["lease_duration_s"] + 1.0
        )
    finally:
        leader.stop()
        standby.stop()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    print(json.dumps({"trial": "takeover", "rep": rep, **result}), file=sys.stderr, flush=True)
    await delete_all(kube, ns)
    with contextlib.suppress(Exception):
        await kube.delete(NAMESPACES, ns)
    return result


def spread(values: list[float | None]) -> dict[str, float | None]:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(got), 4), "min": min(got), "max": max(got)}


def summarise(
    workload: str, args: argparse.Namespace, steady_pods: int, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    by = {
        label: [t for t in runs if t["scheduler"] == label]
        for label in ("alnair", "kube_scheduler")
    }
    a = spread([t["pods_per_s"] for t in by["alnair"]])
    k = spread([t["pods_per_s"] for t in by["kube_scheduler"]])
    out: dict[str, Any] = {
        "nodes": args.nodes,
        "pods": args.pods,
        "alnair_pods_per_s": a["median"],
        "kube_scheduler_pods_per_s": k["median"],
        "ratio": round(a["median"] / k["median"], 3) if a["median"] and k["median"] else None,
        "alnair_p99_s": spread([t["p99_s"] for t in by["alnair"]])["median"],
        "kube_scheduler_p99_s": spread([t["p99_s"] for t in by["kube_scheduler"]])["median"],
        "runs": len(by["alnair"]),
        "alnair_pods_per_s_range": [a["min"], a["max"]],
        "kube_scheduler_pods_per_s_range": [k["min"], k["max"]],
        "steady_pods": steady_pods,
        "steady_rate_per_s": args.rate,
    }
    for label in ("alnair", "kube_scheduler"):
        p99 = spread([t["p99_s"] for t in by[label]])
        out[f"{label}_p99_s_range"] = [p99["min"], p99["max"]]
        out[f"{label}_p50_s"] = spread([t["p50_s"] for t in by[label]])["median"]
        out[f"{label}_startup_s"] = spread([t["startup_s"] for t in by[label]])["median"]
        if workload == "preemption":  # fewest possible: one 8-GPU victim per 8 pods
            for key in ("victims_batch", "victims"):
                out[f"{label}_{key}"] = spread([t.get(key) for t in by[label]])["median"]
    # each repetition's pair ran back to back: their ratio cancels slow drifts in machine load
    paired = [
        a_t["pods_per_s"] / k_t["pods_per_s"]
        for a_t in by["alnair"]
        for k_t in by["kube_scheduler"]
        if a_t["rep"] == k_t["rep"] and a_t["pods_per_s"] and k_t["pods_per_s"]
    ]
    out["ratio_per_repetition_range"] = (
        [round(min(paired), 3), round(max(paired), 3)] if paired else None
    )
    out["valid"] = all(not t["violations"] for t in runs)
    if not out["valid"]:
        out["violations"] = sorted({v for t in runs for v in t["violations"]})[:10]
    if workload == "gang":
        cosched = coscheduling_binary()
        out["kube_scheduler_build"] = (
            f"scheduler-plugins {SCHEDULER_PLUGINS} coscheduling on Kubernetes {K8S_VERSION}"
            if cosched
            else "coscheduling not built: plain kube-scheduler, no gang semantics"
        )
    return out


async def main_async(args: argparse.Namespace, cp: ControlPlane, work: Path) -> dict[str, Any]:
    async with cp.client(max_connections=args.concurrency + 32) as kube:
        t = time.monotonic()
        per_zone = [
            args.nodes // ZONES + (1 if z < args.nodes % ZONES else 0) for z in range(ZONES)
        ]
        nodes: dict[str, str] = {}
        for z, count in enumerate(per_zone):
            if count:
                names = await cp.create_gpu_nodes(
                    f"{count}x V100M32:{GPUS_PER_NODE}",
                    kube=kube,
                    prefix=f"z{z}",
                    labels={ZONE: f"zone-{z}"},
                    wait_ready=False,
                )
                nodes.update(dict.fromkeys(names, f"zone-{z}"))
        # KWOK turns thousands of nodes Ready slowly on a busy machine: a timeout that scales
        await wait_nodes_ready(kube, set(nodes), timeout_s=max(180.0, 0.3 * args.nodes))
        cluster = Cluster(nodes, r.GPU_MODEL_MEMORY_MIB["V100M32"])
        nodes_s = time.monotonic() - t
        for name, value in ((LOW, 100), (HIGH, 100000)):
            with contextlib.suppress(Conflict):
                await kube.create(
                    PRIORITYCLASSES,
                    {
                        "apiVersion": "scheduling.k8s.io/v1",
                        "kind": "PriorityClass",
                        "metadata": {"name": name},
                        "value": value,
                    },
                )
        report: dict[str, Any] = {"workloads": {}}
        ceiling: list[dict[str, Any]] = []
        if args.ceiling:
            ceiling.append(
                await trial(kube, cluster, args, "basic", noop_scheduler(cp, work), 0, 0)
            )
        for w_index, workload in enumerate(args.workloads):
            steady_pods = args.steady_pods
            if workload == "gang":
                steady_pods -= steady_pods % GANG_SIZE
            check_capacity(workload, args.nodes, args.pods + steady_pods)
            runs: list[dict[str, Any]] = []
            for rep in range(args.repeats):
                pair = schedulers(cp, work, workload, args.policy, args.alnair_profile)
                if (rep + w_index) % 2:
                    pair.reverse()
                for sched in pair:  # one at a time: they share the cluster
                    runs.append(await trial(kube, cluster, args, workload, sched, rep, steady_pods))  # noqa: PERF401
            report["workloads"][workload] = summarise(workload, args, steady_pods, runs)
            report["workloads"][workload]["trials"] = runs
        if args.takeover:
            takeovers = [
                await takeover_trial(kube, cp, work, args, rep) for rep in range(args.repeats)
            ]
            times = [t.get("takeover_s") for t in takeovers]
            report["takeover"] = {
                "workload": "basic",
                "lease_duration_s": SHIPPED_LEASE_S,
                "takeover_s": spread(times),
                "within_lease_plus_1s": all(t.get("within_lease_plus_1s") for t in takeovers),
                "trials": takeovers,
            }
    gang, basic = report["workloads"].get("gang"), report["workloads"].get("basic")
    if gang and basic and coscheduling_binary() is None and basic["alnair_pods_per_s"]:
        # no gang-aware kube-scheduler to compare with: what gangs cost Alnair itself
        gang["alnair_gang_vs_own_basic"] = round(
            (gang["alnair_pods_per_s"] or 0) / basic["alnair_pods_per_s"], 3
        )
    report.update(
        {
            "benchmark": "scheduler",
            "nodes": args.nodes,
            "gpus_per_node": GPUS_PER_NODE,
            "policy": args.policy,
            "kube_scheduler": f"{K8S_VERSION}, clientConnection qps {KUBE_QPS} burst {KUBE_QPS}",
            "alnair_client": "no client rate limit; max_binds_in_flight 256 (default)",
            "harness_ceiling_pods_per_s": ceiling[0]["pods_per_s"] if ceiling else None,
            "node_setup_s": round(nodes_s, 1),
            "cpus": os.cpu_count(),
        }
    )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000, help="batch pods per trial")
    parser.add_argument(
        "--steady-pods", type=int, default=None, help="steady-rate pods (default: pods/5)"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="steady creation, pods/s")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", default="alnair")
    parser.add_argument("--concurrency", type=int, default=64, help="parallel pod creators")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--no-ceiling", dest="ceiling", action="store_false", help="skip the no-op binder run"
    )
    parser.add_argument(
        "--alnair-profile", default=None, help="run Alnair under cProfile: PATH.<workload>.<n>"
    )
    parser.add_argument("--keep-trials", action="store_true", help="keep every trial in the JSON")
    parser.add_argument(
        "--no-takeover",
        dest="takeover",
        action="store_false",
        help="skip Alnair's standby take-over trials (leader SIGKILLed, standby binds)",
    )
    args = parser.parse_args()
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := [w for w in args.workloads if w not in WORKLOADS]:
        parser.error(f"--workloads: unknown {unknown}; known: {', '.join(WORKLOADS)}")
    for name in ("nodes", "pods", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} (at least 1)")
    if args.rate <= 0:
        parser.error(f"--rate: {args.rate} (must be > 0)")
    if args.steady_pods is None:
        args.steady_pods = args.pods // 5
    work = Path(tempfile.mkdtemp(prefix="alnair-bench-"))
    cp = ControlPlane(work).start()
    try:
        result = asyncio.run(main_async(args, cp, work))
    finally:
        cp.stop()
        shutil.rmtree(work, ignore_errors=True)
    if not args.keep_trials:
        for w in result["workloads"].values():
            w.pop("trials", None)
        if "takeover" in result:
            result["takeover"].pop("trials", None)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
