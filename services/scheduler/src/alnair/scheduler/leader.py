"""Leader election over a coordination.k8s.io Lease, so two replicas never both bind.

The holder renews every `lease_duration_s / 3`; a renewal is a heartbeat that tells the others it
is alive (there is no event for "still alive"). A replica that cannot renew within
`renew_deadline_s` stops scheduling at once (crash-only: the process exits and restarts as a
follower). Followers wait until the lease they saw expires, then try to take it; an update
carries the resourceVersion they read, so only one of several contenders wins.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from alnair.common.kube import LEASES, ApiError, Conflict, KubeClient, NotFound, Obj, Unavailable

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


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
    ) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration = lease_duration_s
        self.renew_deadline = renew_deadline_s
        self.is_leader = asyncio.Event()
        self.lost = asyncio.Event()

    def _body(self, lease: Obj | None, acquire: bool) -> Obj:
        now = _fmt(_now())
        spec: dict[str, Any] = dict((lease or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.duration),
            renewTime=now,
        )
        if acquire:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def try_acquire_or_renew(self) -> tuple[bool, float]:
        """(leading, seconds until the current lease expires)."""
        try:
            lease: Obj | None = await self.kube.get(LEASES, self.name, self.namespace)
        except NotFound:
            lease = None
        if lease is None:
            try:
                await self.kube.create(LEASES, self._body(None, True), self.namespace)
                return True, self.duration
            except Conflict:
                return False, 1.0
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or _now() - timedelta(days=1)
        expires = renewed + timedelta(
            seconds=float(spec.get("leaseDurationSeconds") or self.duration)
        )
        if holder != self.identity and holder and expires > _now():
            return False, (expires - _now()).total_seconds()
        try:
            await self.kube.replace(LEASES, self._body(lease, holder != self.identity))
        except Conflict:
            return False, 1.0
        return True, self.duration

    async def run(self) -> None:
        """Campaign until leading, then renew until cancelled or the lease is lost."""
        while not self.is_leader.is_set():
            try:
                leading, wait_s = await self.try_acquire_or_renew()
            except (ApiError, Unavailable) as exc:
                log.warning("lease campaign failed", extra={"error": str(exc)})
                leading, wait_s = False, 1.0
            if leading:
                log.info("became leader", extra={"identity": self.identity})
                self.is_leader.set()
                break
            await asyncio.sleep(min(max(wait_s, 0.2), self.duration))
        last_ok = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.duration / 3)
            try:
                leading, _ = await self.try_acquire_or_renew()
            except (ApiError, Unavailable) as exc:
                log.warning("lease renewal failed", extra={"error": str(exc)})
                leading = True  # keep trying until the deadline
                if asyncio.get_running_loop().time() - last_ok > self.renew_deadline:
                    leading = False
            else:
                if leading:
                    last_ok = asyncio.get_running_loop().time()
            if not leading:
                log.error("lost leadership", extra={"identity": self.identity})
                self.is_leader.clear()
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so a follower takes over at once."""
        try:
            lease = await self.kube.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                body = self._body(lease, False)
                body["spec"]["leaseDurationSeconds"] = 1
                body["spec"]["renewTime"] = _fmt(_now() - timedelta(seconds=5))
                await self.kube.replace(LEASES, body)
        except (ApiError, Unavailable):
            pass
