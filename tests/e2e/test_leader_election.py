"""Leader election as client-go does it (`alnair.common.leader`), for every decider, against the
real API server (issue 26):

- a follower whose wall clock runs 30 s ahead does not take a lease its holder keeps renewing
  (expiry is judged by the follower's own clock since it last saw the Lease change);
- a leader whose renewals stall stops leading at the renew deadline, before a follower can take
  the lease, and its scheduler sends no Binding after that (the API server's audit log);
- two dispatchers: only the leader admits; when it dies without handing the Lease back, the
  standby takes over within the lease duration plus one second (measured), and no workload is
  admitted twice;
- two elastic controllers: only the leader is ready (so the Service sends it scale requests);
  the standby takes over when it dies;
- two scheduler processes, the leader SIGSTOPped: the standby takes over and binds; the old
  leader, resumed, binds nothing and exits; no GPU is ever held by two pods; the audit log
  shows every Binding of the old leader within the renew deadline of its last renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from alnair.common import resources as r
from alnair.common.kube import (
    EVENTS,
    JOBS,
    LEASES,
    PODS,
    ApiError,
    KubeClient,
    NotFound,
    Obj,
    Resource,
    user_agent,
)
from alnair.common.leader import LeaderElector, NotLeading
from alnair.common.tasks import within
from alnair.dev.builders import make_pod
from alnair.dev.elastic import start_controller
from alnair.dev.localstack import ControlPlane
from alnair.dev.localstack.audit import AuditEvent
from alnair.dev.waiting import wait_for
from alnair.scheduler.cluster.requests import Placement, PodRequest
from alnair.scheduler.dispatcher.app import Running as RunningDispatcher
from alnair.scheduler.dispatcher.app import start as start_dispatcher
from alnair.scheduler.dispatcher.parsing import ANN_ADMITTED_TYPE
from alnair.scheduler.framework.interface import CycleState
from alnair.scheduler.live.binding import KubeBinder
from dispatcher_support import POOL, cohort_queues, dispatcher_settings, gpu_job

pytestmark = pytest.mark.e2e

FAST = {"lease_duration_s": 2.0, "renew_deadline_s": 1.5, "retry_period_s": 0.2}


def by(event: AuditEvent, identity: str) -> bool:
    """The audited request came from the replica named `identity` (its User-Agent's end)."""
    return event.user_agent.endswith(f" {identity}")


def elector(kube: KubeClient, ns: str, lease: str, identity: str, **kw: Any) -> LeaderElector:
    return LeaderElector(kube, name=lease, namespace=ns, identity=identity, **{**FAST, **kw})


@contextlib.asynccontextmanager
async def campaigning(e: LeaderElector) -> Any:
    task = asyncio.create_task(e.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_follower_whose_clock_runs_30s_ahead_does_not_take_the_lease(
    kube: KubeClient, namespace: str
) -> None:
    a = elector(kube, namespace, "skew", "a")
    ahead = elector(kube, namespace, "skew", "ahead",
                    wall=lambda: datetime.now(UTC) + timedelta(seconds=30))  # fmt: skip
    async with campaigning(a):
        await within(a.is_leader.wait(), 5)
        async with campaigning(ahead) as follower:
            # By its wall clock the holder's renewTime is always 30 s old (what the scheduler's
            # elector used to compare), yet the Lease keeps changing: the follower waits through
            # renewals spanning three lease durations.
            renewals: set[str] = set()
            first = time.monotonic()

            async def waited_out() -> bool:
                assert not ahead.is_leader.is_set()
                lease = await kube.get(LEASES, "skew", namespace)
                assert lease["spec"]["holderIdentity"] == "a"
                renewals.add(lease["spec"]["renewTime"])
                spanned = time.monotonic() - first > 3 * FAST["lease_duration_s"]
                return spanned and len(renewals) > 3 and ahead.holder() == "a"

            await wait_for(waited_out, 20, 0.2)
            assert not ahead.is_leader.is_set() and a.leading()
            # The holder dies without handing the Lease back: now the follower takes it, within
            # the lease duration of the last change it saw (plus its retry period).
            stopped = time.monotonic()
            await _kill(a)
            await within(ahead.is_leader.wait(), FAST["lease_duration_s"] + 2)
            assert time.monotonic() - stopped <= FAST["lease_duration_s"] + 1.0
            assert not follower.done()


SLOW_POLL = {"lease_duration_s": 2.0, "renew_deadline_s": 1.8, "retry_period_s": 1.5}
"""A retry period of three quarters of the lease: a follower that polled would see the
leader's last renewal up to 1.5 s late, and take over that much after the lease expired."""


async def _standby_takeover(kube: KubeClient, namespace: str, lease: str) -> tuple[float, bool]:
    """A leads and B follows (`SLOW_POLL`); A dies right after a renewal. Returns how long B
    took to lead after A's death, and whether B's watch ran."""
    a = elector(kube, namespace, lease, "a", **SLOW_POLL)
    b = elector(kube, namespace, lease, "b", **SLOW_POLL)
    async with campaigning(a):
        await within(a.is_leader.wait(), 5)
        async with campaigning(b):
            await wait_for(lambda: b.holder() == "a", 10, 0.05)
            await asyncio.sleep(2 * SLOW_POLL["retry_period_s"])  # renewals seen meanwhile
            watched = b.watching
            acked = a._acked_at
            await wait_for(lambda: a._acked_at != acked, 5, 0.01)  # a renewal just went out
            stopped = time.monotonic()
            await _kill(a)
            await within(b.is_leader.wait(), 10)
            return time.monotonic() - stopped, watched


async def test_a_standby_watching_the_lease_takes_over_when_it_expires_not_a_poll_later(
    kube: KubeClient, namespace: str
) -> None:
    took, watched = await _standby_takeover(kube, namespace, "watched")
    assert watched
    # Never before the lease expired (the last renewal was written after A's death began),
    # and within 0.5 s of it: a follower polling every 1.5 s would take up to 1.5 s more.
    assert SLOW_POLL["lease_duration_s"] - 0.3 <= took <= SLOW_POLL["lease_duration_s"] + 0.5


class _NoWatch(KubeClient):
    """The admin client, refused every watch (an API server or role that does not allow it)."""

    async def watch(self, *_a: Any, **_k: Any) -> Any:  # type: ignore[override]
        raise ApiError(403, "Forbidden", "watch refused by the test", "/leases")
        yield  # an async generator, as the real one


async def test_a_standby_refused_the_watch_polls_and_still_takes_over(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = _NoWatch.from_config(str(control_plane.kubeconfig))
    async with client:
        took, watched = await _standby_takeover(client, namespace, "polled")
    assert not watched
    limit = SLOW_POLL["lease_duration_s"] + SLOW_POLL["retry_period_s"] + 1.0
    assert SLOW_POLL["lease_duration_s"] - 0.3 <= took <= limit


async def _kill(e: LeaderElector) -> None:
    """Stop an elector as a SIGKILL would: no more renewals, no hand-back."""
    e.kube = _Dead()  # type: ignore[assignment]
    e.lost.set()
    e.is_leader.clear()


class _Dead:
    """A client whose process is gone: every request hangs."""

    async def get(self, *_a: Any, **_k: Any) -> Obj:
        await asyncio.Event().wait()
        raise AssertionError

    replace = create = get


class _StallingLeases(KubeClient):
    """The admin client, with Lease updates held up once `stall` is set (a partitioned or
    overloaded API server path)."""

    stall = False

    async def replace(self, res: Resource, body: Obj, sub: str = "") -> Obj:
        if res == LEASES and self.stall:
            await asyncio.sleep(3600)
        return await super().replace(res, body, sub)


async def test_a_leader_whose_renewals_stall_stops_binding_before_a_follower_can_take_over(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    (node,) = await control_plane.create_gpu_nodes("1x T4:1", kube=kube, prefix=namespace)
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "late", "namespace": namespace},
        "spec": {"schedulerName": r.SCHEDULER_NAME,
                 "containers": [{"name": "c", "image": "example.invalid/c:1"}]},
    }  # fmt: skip
    made = await kube.create(PODS, pod, namespace)
    stalling = _StallingLeases.from_config(
        str(control_plane.kubeconfig), agent=user_agent("test-elector", "a")
    )
    assert isinstance(stalling, _StallingLeases)
    async with stalling:
        a = elector(stalling, namespace, "stall", "a")
        b = elector(kube, namespace, "stall", "b")
        binder = KubeBinder(stalling, "a", fence=a.leading)
        async with campaigning(a) as a_task:
            await within(a.is_leader.wait(), 5)
            follower = asyncio.create_task(b.run())
            stalling.stall = True
            assert a._acked_at is not None
            last_ack = a._acked_at
            # The leader stops at its renew deadline, counted from its last renewal's sending.
            await within(a.lost.wait(), FAST["renew_deadline_s"] + 1)
            assert not a.leading()
            assert time.monotonic() - last_ack >= FAST["renew_deadline_s"] - 0.05
            await a_task
            # The follower takes over only after that, never while `a` could still bind.
            await within(b.is_leader.wait(), FAST["lease_duration_s"] + 2)
            # A bind `a` decided before it knew sends nothing.
            request = PodRequest(name="late", cpu_milli=0, memory_mib=0, namespace=namespace,
                                 uid=made["metadata"]["uid"])  # fmt: skip
            with pytest.raises(NotLeading):
                await binder.bind(
                    request, CycleState(np.random.default_rng(0)), Placement(node=0, node_name=node)
                )
            assert not (await kube.get(PODS, "late", namespace))["spec"].get("nodeName")
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
    # The API server's own record: `a` wrote the Lease until the stall and never after, `b`
    # took it only after that, and no Binding of the pod ever reached the server.
    events = [e for e in control_plane.audit_events() if e.namespace == namespace]
    a_writes = [e.at for e in events if e.resource == "leases" and by(e, "a") and e.succeeded]
    b_writes = [e.at for e in events if e.resource == "leases" and e.user_agent == kube.headers[
        "User-Agent"] and e.succeeded]  # fmt: skip
    assert a_writes and b_writes and max(a_writes) < min(b_writes)
    assert not [e for e in events if e.resource == "pods/binding"]


async def _admitted(kube: KubeClient, ns: str) -> dict[str, str]:
    jobs = (await kube.list(JOBS, ns))["items"]
    return {
        j["metadata"]["name"]: j["metadata"]["annotations"][ANN_ADMITTED_TYPE]
        for j in jobs
        if ANN_ADMITTED_TYPE in (j["metadata"].get("annotations") or {})
    }


async def test_two_dispatchers_one_admits_and_the_standby_takes_over_admitting_nothing_twice(
    control_plane: ControlPlane, kube: KubeClient, namespace: str
) -> None:
    ns = namespace
    await control_plane.create_gpu_nodes("1x V100M32:8", kube=kube, prefix=ns, labels={POOL: ns})
    await cohort_queues(kube, ns, "le", {"ml": (8, 0)})
    lease = f"dispatcher-{uuid.uuid4().hex[:6]}"

    def settings(identity: str) -> Any:
        return dispatcher_settings(control_plane, ns, leader_elect=True, lease_name=lease,
                                   lease_namespace=ns, identity=identity, **FAST)  # fmt: skip

    one = await start_dispatcher(settings("one"))
    two: RunningDispatcher | None = None
    try:
        assert one.elector is not None
        await within(one.elector.is_leader.wait(), 5)
        two = await start_dispatcher(settings("two"))
        assert two.elector is not None
        for i in range(3):
            await kube.create(JOBS, gpu_job(f"a{i}", ns, "ml", 1), ns)
        await wait_for(lambda: _count(kube, ns, 3), 20)
        assert not two.elector.is_leader.is_set() and two.dispatcher.reconciles == 0
        # The follower explains nothing (it decides nothing): it names the leader instead.
        async with httpx.AsyncClient() as http:
            follower = await http.get(f"{two.url}/v1/jobs/{ns}/a0")
            leader = await http.get(f"{one.url}/v1/jobs/{ns}/a0")
        assert follower.status_code == 503 and "ask the leader, one" in follower.text
        assert leader.status_code == 200 and leader.json()["status"] == "admitted"
        # The leader dies mid-stream (no hand-back), with more jobs arriving.
        for i in range(3):
            await kube.create(JOBS, gpu_job(f"b{i}", ns, "ml", 1), ns)
        died = time.monotonic()
        await _crash(one)
        await within(two.elector.is_leader.wait(), FAST["lease_duration_s"] + 3)
        takeover_s = time.monotonic() - died
        assert takeover_s <= FAST["lease_duration_s"] + 1.0, takeover_s
        await wait_for(lambda: _count(kube, ns, 6), 20)
        # Nothing admitted twice: at most one Admitted Event per Job, each for an admitted Job.
        # (At most, not exactly: a leader killed between its admission and its Event leaves
        # that Job without one, as SIGKILL would; Events are best effort.)
        events = (await kube.list(EVENTS, ns))["items"]
        admitted = Counter(e["involvedObject"]["name"] for e in events if e["reason"] == "Admitted")
        assert max(admitted.values()) == 1, admitted
        assert set(admitted) <= set(await _admitted(kube, ns)), admitted
        assert len(admitted) >= 5, admitted  # only the write in flight at the kill may lack one
    finally:
        for running in (one, two):
            if running is not None:
                with contextlib.suppress(Exception):
                    await running.stop()


async def _count(kube: KubeClient, ns: str, n: int) -> bool:
    return len(await _admitted(kube, ns)) == n


async def _crash(running: RunningDispatcher) -> None:
    """Stop a dispatcher as SIGKILL would: its loop and renewals end, the Lease stays its."""
    assert running.elector is not None and running.campaign is not None
    running.campaign.cancel()
    running.loop.cancel()
    await asyncio.gather(running.campaign, running.loop, return_exceptions=True)
    running.elector = None  # (so stop() hands nothing back)


async def test_two_elastic_controllers_only_the_leader_is_ready_and_the_standby_takes_over(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    lease = f"elastic-{uuid.uuid4().hex[:6]}"
    kw = {"leader_elect": True, "lease_name": lease, "lease_namespace": namespace, **FAST}
    one = await start_controller(control_plane, namespace, identity="one", **kw)
    two = None
    try:
        assert one.elector is not None
        await within(one.elector.is_leader.wait(), 5)
        two = await start_controller(control_plane, namespace, identity="two", **kw)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{one.url}/readyz")).status_code == 200
            assert (await http.get(f"{two.url}/readyz")).status_code == 503
            died = time.monotonic()
            for task in one.tasks[1:]:  # its leadership, without a hand-back
                task.cancel()
            one.elector = None
            assert two.elector is not None
            await within(two.elector.is_leader.wait(), FAST["lease_duration_s"] + 3)
            assert time.monotonic() - died <= FAST["lease_duration_s"] + 1.0
            assert (await http.get(f"{two.url}/readyz")).status_code == 200
    finally:
        for running in (one, two):
            if running is not None:
                with contextlib.suppress(Exception):
                    await running.stop()


async def _scheduler_process(
    cp: ControlPlane, ns: str, identity: str, log: Path
) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "ALNAIR_KUBECONFIG": str(cp.kubeconfig),
        "ALNAIR_SCHEDULER_HTTP_PORT": "0",
        "ALNAIR_SCHEDULER_NATS_ENABLED": "false",
        "ALNAIR_SCHEDULER_SCHEDULER_NAME": f"alnair-{ns}",
        "ALNAIR_SCHEDULER_IDENTITY": identity,
        "ALNAIR_SCHEDULER_LEASE_NAMESPACE": ns,
        "ALNAIR_SCHEDULER_LEASE_DURATION_S": str(FAST["lease_duration_s"]),
        "ALNAIR_SCHEDULER_RENEW_DEADLINE_S": str(FAST["renew_deadline_s"]),
        "ALNAIR_SCHEDULER_RETRY_PERIOD_S": str(FAST["retry_period_s"]),
        "ALNAIR_LOG_JSON": "false",
    }
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "alnair.scheduler", env=env, stdout=out, stderr=out,
        )  # fmt: skip


async def test_two_schedulers_with_the_leader_sigstopped_and_resumed_never_hold_a_gpu_twice(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    await control_plane.create_gpu_nodes("1x T4:4", kube=kube, prefix=ns, labels={POOL: ns})

    def pod(name: str) -> dict[str, Any]:
        return make_pod(name, ns).pool(ns).gpus(1).runs_for(600).scheduler(f"alnair-{ns}").obj()

    async def holder() -> str | None:
        try:
            lease = await kube.get(LEASES, "alnair-scheduler", ns)
        except NotFound:
            return None
        return (lease.get("spec") or {}).get("holderIdentity") or None

    async def bound_by(names: list[str]) -> dict[str, str] | None:
        pods = {p["metadata"]["name"]: p for p in (await kube.list(PODS, ns))["items"]}
        if not all(n in pods and pods[n]["spec"].get("nodeName") for n in names):
            return None
        return {n: pods[n]["metadata"]["annotations"][r.ANN_SCHEDULED_BY] for n in names}

    a = await _scheduler_process(control_plane, ns, "sched-a", tmp_path / "a.log")
    b: asyncio.subprocess.Process | None = None
    try:
        assert await wait_for(holder, 30) == "sched-a"
        b = await _scheduler_process(control_plane, ns, "sched-b", tmp_path / "b.log")
        for i in range(2):
            await kube.create(PODS, pod(f"p{i}"), ns)
        assert set((await wait_for(lambda: bound_by(["p0", "p1"]), 30)).values()) == {"sched-a"}
        # The leader freezes (a stalled VM, a debugger): the standby takes over and places
        # what arrives meanwhile, and the room one pod leaves.
        a.send_signal(signal.SIGSTOP)
        stopped_at = datetime.now(UTC)
        for i in (2, 3):
            await kube.create(PODS, pod(f"p{i}"), ns)

        async def b_holds() -> bool:
            return await holder() == "sched-b"

        await wait_for(b_holds, 20)
        assert set((await wait_for(lambda: bound_by(["p2", "p3"]), 30)).values()) == {"sched-b"}
        await kube.delete(PODS, "p0", ns, grace_period_s=0)
        await kube.create(PODS, pod("p4"), ns)
        assert (await wait_for(lambda: bound_by(["p4"]), 30)) == {"p4": "sched-b"}
        # It wakes up: it sees its deadline long passed, binds nothing, and exits.
        a.send_signal(signal.SIGCONT)
        assert await within(a.wait(), 30) != 0
        pods = [p for p in (await kube.list(PODS, ns))["items"]
                if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        held: dict[tuple[str, str], list[str]] = {}
        for p in pods:
            for gpu in (
                (p["metadata"].get("annotations") or {}).get(r.ANN_GPU_INDICES, "").split(",")
            ):
                if gpu:
                    held.setdefault((p["spec"]["nodeName"], gpu), []).append(p["metadata"]["name"])
        assert held and all(len(names) == 1 for names in held.values()), held
        late = await bound_by(["p2", "p3", "p4"])
        assert late is not None and set(late.values()) == {"sched-b"}
        assert await holder() == "sched-b"
        # The API server's audit log: every Binding `a` sent completed before it was stopped
        # and within the renew deadline of its last Lease renewal; `b`'s are recorded too.
        events = [e for e in control_plane.audit_events() if e.namespace == ns]
        binds = [e for e in events if e.resource == "pods/binding"]
        renewed = max(e.at for e in events if e.resource == "leases" and by(e, "sched-a")
                      and e.succeeded)  # fmt: skip
        deadline = renewed + timedelta(seconds=FAST["renew_deadline_s"])
        a_binds = [e for e in binds if by(e, "sched-a")]
        assert {e.name for e in a_binds if e.succeeded} == {"p0", "p1"}, a_binds
        assert all(e.at < stopped_at and e.at < deadline for e in a_binds), (a_binds, deadline)
        assert {e.name for e in binds if by(e, "sched-b") and e.succeeded} >= {"p2", "p3", "p4"}
    finally:
        for proc in (a, b):
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                await proc.wait()
