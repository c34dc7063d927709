"""Leader election over a coordination.k8s.io Lease, with client-go's guarantees, for every
service that decides (the scheduler's binds, the dispatcher's admissions, the elastic
controller's resizes): at most one replica acts at a time.

- **Expiry by the follower's own clock.** A follower never compares the holder's `renewTime`
  with its own wall clock (two clocks 30 s apart would give two leaders). It remembers when,
  by its own monotonic clock, it last saw the Lease record change; the lease has expired when
  it has not changed for the holder's `leaseDurationSeconds` since.
- **A leader stops acting before its lease can be taken.** Each renewal is bounded by the time
  left until the renew deadline, counted from when the last successful renewal was *sent*
  (`renew_deadline_s` < `lease_duration_s`): past it, `leading()` is false and `lost` is set,
  whatever is still in flight. A follower can take over no earlier than `lease_duration_s`
  after it saw the last renewal, which was written after it was sent. Deciders check
  `leading()` right before each write (a bind, an admission): a write the deadline has passed
  is never sent.
- **Updates carry the resourceVersion read**, so of several contenders one wins.
- **Handing back.** `release()` on a clean shutdown lets a follower take over at once.
- **A follower watches the Lease** (a watch on its name, from the version it last read): it
  sees each renewal when it is written, and tries to take the lease at the moment it expires
  by its own clock, or at once when it is handed back or deleted. Polling every
  `retry_period_s` saw a renewal up to one period late, so a standby took over up to a period
  after the lease was free; with the watch it takes over within the lease duration of the
  leader's last renewal, plus the watch's delivery and one read and write. Should the watch
  fail (an API server that refuses it), the follower polls every `retry_period_s` as before;
  either way the take-over itself is the conditional update, never the watch's word.

Renewals are heartbeats every `retry_period_s`: "still alive" is not an event, so this is the
one periodic write the services make.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from alnair.common.kube import (
    LEASES,
    ApiError,
    Conflict,
    Gone,
    KubeClient,
    NotFound,
    Obj,
    Unavailable,
)
from alnair.common.settings import LeaderElectionSettings
from alnair.common.tasks import spawn, within

log = logging.getLogger(__name__)


def _wall() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _wall,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{retry_period_s} / {renew_deadline_s} / {lease_duration_s} s"
            )
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration = lease_duration_s
        self.renew_deadline = renew_deadline_s
        self.retry_period = retry_period_s
        self.clock = clock
        self.wall = wall  # only written into the Lease, for people reading it
        self.is_leader = asyncio.Event()
        self.lost = asyncio.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._held_for = lease_duration_s
        """The `leaseDurationSeconds` of the record last seen."""
        self._version: str | None = None
        """The resourceVersion of the Lease last seen (where the follower's watch starts)."""
        self._changed = asyncio.Event()
        """Set whenever the record seen changes (or the Lease is gone)."""
        self.watching = False
        """Whether the follower's watch on the Lease is running (else it polls)."""
        self._acked_at: float | None = None
        """When (our clock) the last acquisition or renewal that succeeded was sent."""

    def leading(self) -> bool:
        """Whether this replica may act now: it holds the lease and its last successful renewal
        was sent less than the renew deadline ago."""
        return (
            self.is_leader.is_set()
            and not self.lost.is_set()
            and self._acked_at is not None
            and self.clock() - self._acked_at < self.renew_deadline
        )

    def holder(self) -> str | None:
        """Who held the Lease when this replica last looked (None: not seen yet, or free)."""
        return str(self._observed[0]) if self._observed and self._observed[0] else None

    def _observe(self, lease: Obj | None) -> None:
        """Remember the record of `lease` (None: there is none) and when it last changed."""
        if lease is None:
            record: tuple[Any, ...] | None = None
        else:
            spec = lease.get("spec") or {}
            record = (
                spec.get("holderIdentity"),
                spec.get("renewTime"),
                spec.get("acquireTime"),
                spec.get("leaseTransitions"),
            )
            self._held_for = float(spec.get("leaseDurationSeconds") or self.duration)
            self._version = (lease.get("metadata") or {}).get("resourceVersion", self._version)
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()
            self._changed.set()

    def _body(self, lease: Obj | None, acquire: bool) -> Obj:
        now = _fmt(self.wall())
        spec: dict[str, Any] = dict((lease or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.identity,
            # Rounded up: followers wait at least as long as this replica believes it holds.
            leaseDurationSeconds=max(1, math.ceil(self.duration)),
            renewTime=now,
        )
        if acquire:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}  # fmt: skip

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the lease afterwards."""
        sent = self.clock()
        try:
            lease: Obj | None = await self.kube.get(LEASES, self.name, self.namespace)
        except NotFound:
            lease = None
        if lease is None:
            self._observe(None)
            try:
                made = await self.kube.create(LEASES, self._body(None, True), self.namespace)
            except Conflict:
                return False
            self._acked(made, sent)
            return True
        self._observe(lease)
        holder = (lease.get("spec") or {}).get("holderIdentity")
        if holder and holder != self.identity and self.clock() < self._observed_at + self._held_for:
            return False  # someone else's, and it changed less than its duration ago
        try:
            written = await self.kube.replace(LEASES, self._body(lease, holder != self.identity))
        except Conflict:
            return False
        self._acked(written, sent)
        return True

    def _acked(self, lease: Obj, sent: float) -> None:
        self._acked_at = sent
        self._observe(lease)

    async def run(self) -> None:
        """Campaign until leading, then renew until cancelled or the lease is lost (then
        `lost` is set and this returns: crash-only callers exit and come back as followers)."""
        follow = spawn(self._follow(), name=f"leader.{self.name}.follow", on_death=self._unfollowed)
        try:
            while True:
                try:
                    leading = await within(self.try_acquire_or_renew(), self.renew_deadline)
                except (TimeoutError, ApiError, Unavailable) as exc:
                    log.warning("lease campaign failed", extra={"error": str(exc) or "timed out"})
                    leading = False
                if leading:
                    break
                await self._until_free()
        finally:
            follow.cancel()
            # Waited without awaiting it: its CancelledError is not ours to swallow, and a
            # cancellation of this campaign arriving meanwhile still ends it.
            await asyncio.wait({follow})
            self.watching = False
        log.info("became leader", extra={"identity": self.identity, "lease": self.name})
        self.is_leader.set()
        while True:
            await asyncio.sleep(self.retry_period)
            assert self._acked_at is not None
            left = self._acked_at + self.renew_deadline - self.clock()
            renewed: bool | None = None
            if left > 0:
                try:
                    renewed = await within(self.try_acquire_or_renew(), left)
                except (TimeoutError, ApiError, Unavailable) as exc:
                    log.warning("lease renewal failed", extra={"error": str(exc) or "timed out"})
            if renewed is False or not self.leading():
                log.error(
                    "lost leadership",
                    extra={"identity": self.identity, "lease": self.name,
                           "taken": renewed is False},
                )  # fmt: skip
                self.is_leader.clear()
                self.lost.set()
                return

    def _unfollowed(self, _exc: BaseException) -> None:
        """The watch task died (logged by `spawn`): the campaign polls from now on."""
        self.watching = False
        self._changed.set()

    def _free_in(self) -> float:
        """Seconds until the lease is free by this replica's clock (0: free now)."""
        if self._observed is None or not self._observed[0]:
            return 0.0  # none, or handed back
        return max(0.0, self._observed_at + self._held_for - self.clock())

    async def _until_free(self) -> None:
        """Wait until the lease may be taken: the moment it expires by this replica's clock,
        recomputed whenever the watch shows a change, and at once when it is handed back or
        deleted. Without a running watch, at most `retry_period_s` (polling)."""
        while True:
            wait = self._free_in()
            if not self.watching:
                wait = min(wait, self.retry_period)
            if wait <= 0:
                return
            self._changed.clear()
            try:
                await within(self._changed.wait(), wait)
            except TimeoutError:
                return

    async def _follow(self) -> None:
        """Watch the Lease by name from the version last read, noting every change (the
        campaign's reads give the version; a watch that breaks resumes, one that fails leaves
        the campaign polling until it runs again)."""
        selector = f"metadata.name={self.name}"
        while True:
            version = self._version
            if version is None:  # no read yet (or too old): the campaign's next one gives it
                await asyncio.sleep(self.retry_period)
                continue
            try:
                self.watching = True
                async for kind, lease in self.kube.watch(
                    LEASES, self.namespace, resource_version=version, field_selector=selector
                ):
                    if kind == "BOOKMARK":
                        self._version = (lease.get("metadata") or {}).get("resourceVersion")
                    elif kind == "DELETED":
                        self._observe(None)
                    else:
                        self._observe(lease)
            except Gone:
                self._version = None  # too old: the next read starts it again
            except (ApiError, Unavailable) as exc:
                self.watching = False
                self._changed.set()  # the campaign falls back to polling now
                log.warning(
                    "cannot watch the lease; polling it",
                    extra={"lease": self.name, "error": str(exc)},
                )
                await asyncio.sleep(self.retry_period)
            finally:
                self.watching = False

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so a follower takes over at once."""
        try:
            lease = await self.kube.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                body = self._body(lease, False)
                # No holder (a follower takes it at once), and expired to anyone reading times.
                body["spec"]["holderIdentity"] = None
                body["spec"]["leaseDurationSeconds"] = 1
                body["spec"]["renewTime"] = _fmt(self.wall() - timedelta(seconds=5))
                await self.kube.replace(LEASES, body)
        except (ApiError, Unavailable):
            pass
        self.is_leader.clear()


class NotLeading(RuntimeError):
    """A decision refused because this replica no longer leads (or never did)."""


def elector_for(
    settings: LeaderElectionSettings, kube: KubeClient, lease_name: str
) -> LeaderElector | None:
    """The elector a service's settings ask for (None: `leader_elect` is off)."""
    if not settings.leader_elect:
        return None
    return LeaderElector(
        kube,
        name=lease_name,
        namespace=settings.lease_namespace,
        identity=settings.identity,
        lease_duration_s=settings.lease_duration_s,
        renew_deadline_s=settings.renew_deadline_s,
        retry_period_s=settings.retry_period_s,
    )
