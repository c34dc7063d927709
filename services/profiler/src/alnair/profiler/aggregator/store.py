"""The aggregator's state in Redis: the key layout, the two Lua scripts that fold samples and
summaries atomically, and every read and write of them.

Keys (prefix `alnair:`), all working keys expiring `idle_ttl_s` after the last sample (so
pods of an owner that never finishes fade away) and `finished_ttl_s` after the owner's record
is written:
- `pod:<uid>:stats`: the pod's summaries, `<series>:count|sum|max` plus `first_ts`,
  `last_ts` and `pod_ts` (the last tick whose CPU and memory were counted);
- `pod:<uid>:meta`: namespace, name, node and the owner it resolved to;
- `owner:<uid>:pods|nodes|gpus` (sets) and `owner:<uid>:meta` (kind, name, namespace);
- `owner-by-name:<namespace>/<name>`: the owner's uid;
- `done:<uid>`: the owner's record is written and announced (outlives the working keys, so a
  replay in between still sees it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis.asyncio as aioredis

from alnair.common.events import PodMetric, PodSummary
from alnair.profiler.aggregator.owners import OwnerRef
from alnair.profiler.statistics import SERIES, Profile, Stat

P = "alnair:"

# KEYS[1] pod stats hash, KEYS[2] owner GPU set, KEYS[3] the owner's done marker, KEYS[4..]
# the other working keys of the pod and its owner.
# ARGV[1] ts, ARGV[2] gpu id ("" without GPU), ARGV[3..5] GPU series, ARGV[6..7] pod series,
# ARGV[8] idle TTL in seconds: every working key expires that long after the last sample,
# unless the owner is done (then its shorter expiry, set when the record was written, holds).
_FOLD = """
local function upd(name, v)
  redis.call('HINCRBY', KEYS[1], name .. ':count', 1)
  redis.call('HINCRBYFLOAT', KEYS[1], name .. ':sum', v)
  local m = redis.call('HGET', KEYS[1], name .. ':max')
  if (not m) or tonumber(v) > tonumber(m) then
    redis.call('HSET', KEYS[1], name .. ':max', v)
  end
end
local ts = tonumber(ARGV[1])
redis.call('HSETNX', KEYS[1], 'first_ts', ARGV[1])
local last = redis.call('HGET', KEYS[1], 'last_ts')
if (not last) or ts > tonumber(last) then
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[1])
end
if ARGV[2] ~= '' then
  redis.call('SADD', KEYS[2], ARGV[2])
  upd('gpu_util_pct', ARGV[3])
  upd('gpu_mem_used_mib', ARGV[4])
  upd('sm_util_pct', ARGV[5])
end
-- A pod on several GPUs reports CPU and memory once per GPU: count them once per tick.
local pod_ts = redis.call('HGET', KEYS[1], 'pod_ts')
if (not pod_ts) or ts > tonumber(pod_ts) then
  redis.call('HSET', KEYS[1], 'pod_ts', ARGV[1])
  upd('cpu_util_cores', ARGV[6])
  upd('mem_used_mib', ARGV[7])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  for i, key in ipairs(KEYS) do
    if i ~= 3 then redis.call('EXPIRE', key, ARGV[8]) end
  end
end
return 1
"""


# A pod summary. KEYS as _FOLD. ARGV[1] first_ts, ARGV[2] last_ts, ARGV[3] idle TTL, ARGV[4]
# number of series n, then n times (name, count, sum, max), then the GPU ids. A series takes the
# summary's count and sum when they cover more samples than were folded one by one (never
# both: they describe the same run), the larger max; so a repeat changes nothing.
_MERGE = """
local f = redis.call('HGET', KEYS[1], 'first_ts')
if (not f) or tonumber(ARGV[1]) < tonumber(f) then
  redis.call('HSET', KEYS[1], 'first_ts', ARGV[1])
end
for _, field in ipairs({'last_ts', 'pod_ts'}) do
  local v = redis.call('HGET', KEYS[1], field)
  if (not v) or tonumber(ARGV[2]) > tonumber(v) then
    redis.call('HSET', KEYS[1], field, ARGV[2])
  end
end
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local b = 5 + i * 4
  local name = ARGV[b]
  local count = tonumber(ARGV[b + 1])
  if count > 0 then
    local have = tonumber(redis.call('HGET', KEYS[1], name .. ':count') or '0')
    if count > have then
      redis.call('HSET', KEYS[1], name .. ':count', ARGV[b + 1], name .. ':sum', ARGV[b + 2])
    end
    local m = redis.call('HGET', KEYS[1], name .. ':max')
    if (not m) or tonumber(ARGV[b + 3]) > tonumber(m) then
      redis.call('HSET', KEYS[1], name .. ':max', ARGV[b + 3])
    end
  end
end
for i = 5 + n * 4, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  for i, key in ipairs(KEYS) do
    if i ~= 3 then redis.call('EXPIRE', key, ARGV[3]) end
  end
end
return 1
"""


def profile_from_hash(fields: Mapping[str, str]) -> Profile:
    """A profile from a pod's stats hash."""
    stats = {}
    for series in SERIES:
        count = int(float(fields.get(f"{series}:count", "0")))
        if count:
            stats[series] = Stat(
                count,
                float(fields.get(f"{series}:sum", "0")),
                float(fields.get(f"{series}:max", "0")),
            )
    return Profile(stats)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ProfileStore:
    def __init__(self, redis: aioredis.Redis, *, idle_ttl_s: int) -> None:
        self.redis = redis
        self.idle_ttl_s = idle_ttl_s
        self._fold = redis.register_script(_FOLD)
        self._merge = redis.register_script(_MERGE)

    # -- owners ---------------------------------------------------------------------------
    async def stored_owner(self, pod_uid: str) -> OwnerRef | None:
        """The owner a pod was resolved to before (by this or an earlier aggregator)."""
        stored = await self.redis.hgetall(f"{P}pod:{pod_uid}:meta")
        if not stored:
            return None
        meta = {text(k): text(v) for k, v in stored.items()}
        return OwnerRef(
            meta["owner_api_version"],
            meta["owner_kind"],
            meta["namespace"],
            meta["owner_name"],
            meta["owner_uid"],
        )

    async def remember_owner(self, sample: PodMetric | PodSummary, owner: OwnerRef) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            f"{P}pod:{sample.pod_uid}:meta",
            mapping={
                "namespace": sample.namespace,
                "name": sample.pod,
                "node": sample.node,
                "owner_api_version": owner.api_version,
                "owner_kind": owner.kind,
                "owner_name": owner.name,
                "owner_uid": owner.uid,
            },
        )
        pipe.sadd(f"{P}owner:{owner.uid}:pods", sample.pod_uid)
        pipe.sadd(f"{P}owner:{owner.uid}:nodes", sample.node)
        pipe.set(f"{P}owner-by-name:{owner.namespace}/{owner.name}", owner.uid)
        pipe.hset(
            f"{P}owner:{owner.uid}:meta",
            mapping={"kind": owner.kind, "name": owner.name, "namespace": owner.namespace},
        )
        await pipe.execute()

    async def owner_uid_by_name(self, namespace: str, name: str) -> str | None:
        uid = await self.redis.get(f"{P}owner-by-name:{namespace}/{name}")
        return text(uid) if uid is not None else None

    async def owner_pods(self, owner_uid: str) -> list[str]:
        """The uids of the owner's sampled pods, sorted."""
        return sorted(text(p) for p in await self.redis.smembers(f"{P}owner:{owner_uid}:pods"))

    async def has_pods(self, owner_uid: str) -> bool:
        """Whether any pod of the owner was ever sampled."""
        return bool(await self.redis.scard(f"{P}owner:{owner_uid}:pods"))

    async def owner_nodes(self, owner_uid: str) -> list[str]:
        return sorted(text(n) for n in await self.redis.smembers(f"{P}owner:{owner_uid}:nodes"))

    async def owner_gpu_count(self, owner_uid: str) -> int:
        """The distinct GPUs the owner's pods were sampled on."""
        return int(await self.redis.scard(f"{P}owner:{owner_uid}:gpus"))

    async def pod_meta(self, pod_uid: str) -> dict[str, str]:
        raw = await self.redis.hgetall(f"{P}pod:{pod_uid}:meta")
        return {text(k): text(v) for k, v in raw.items()}

    # -- samples --------------------------------------------------------------------------
    def _keys(self, pod_uid: str, owner: OwnerRef) -> list[str]:
        """The scripts' KEYS: stats, GPU set, done marker, then the other working keys."""
        return [
            f"{P}pod:{pod_uid}:stats",
            f"{P}owner:{owner.uid}:gpus",
            f"{P}done:{owner.uid}",
            f"{P}pod:{pod_uid}:meta",
            *(f"{P}owner:{owner.uid}:{part}" for part in ("pods", "nodes", "meta")),
            f"{P}owner-by-name:{owner.namespace}/{owner.name}",
        ]

    async def fold(self, metric: PodMetric, owner: OwnerRef) -> None:
        """One sample into its pod's summaries."""
        gpu_id = f"{metric.node}/{metric.gpu_uuid}" if metric.gpu_uuid else ""
        await self._fold(
            keys=self._keys(metric.pod_uid, owner),
            args=[
                metric.ts.timestamp(),
                gpu_id,
                metric.gpu_util_pct,
                metric.gpu_mem_used_mib,
                metric.sm_util_pct,
                metric.cpu_util_cores,
                metric.mem_used_mib,
                self.idle_ttl_s,
            ],
        )

    async def merge(self, summary: PodSummary, owner: OwnerRef) -> None:
        """A pod's whole-run summary into its summaries (a repeat changes nothing)."""
        args: list[str | float | int] = [
            summary.first_ts.timestamp(),
            summary.last_ts.timestamp(),
            self.idle_ttl_s,
            len(PodSummary.SERIES),
        ]
        for name in PodSummary.SERIES:
            series = summary.series(name)
            args += [name, series.count, series.total, series.max]
        args += [f"{summary.node}/{gpu}" for gpu in summary.gpus]
        await self._merge(keys=self._keys(summary.pod_uid, owner), args=args)

    # -- profiles -------------------------------------------------------------------------
    async def pod_profile(self, pod_uid: str) -> tuple[Profile, dict[str, str]]:
        raw = await self.redis.hgetall(f"{P}pod:{pod_uid}:stats")
        fields = {text(k): text(v) for k, v in raw.items()}
        return profile_from_hash(fields), fields

    async def owner_profile(self, owner_uid: str) -> tuple[Profile, list[dict[str, str]]]:
        """The owner's profile (its pods' merged) and each pod's stored fields."""
        profiles = []
        raw = []
        for uid in await self.owner_pods(owner_uid):
            profile, fields = await self.pod_profile(uid)
            profiles.append(profile)
            raw.append({"pod_uid": uid, **fields})
        return Profile.fold(profiles), raw

    # -- completion -----------------------------------------------------------------------
    async def is_done(self, owner_uid: str) -> bool:
        return bool(await self.redis.exists(f"{P}done:{owner_uid}"))

    async def mark_done(
        self, owner_uid: str, namespace: str, name: str, pod_uids: Iterable[str], ttl_s: int
    ) -> None:
        """The owner is recorded and announced: the done marker (for twice `ttl_s`, outliving
        the working keys, so a replay in between still sees it), and every working key
        expiring in `ttl_s`."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(f"{P}done:{owner_uid}", "1", ex=2 * ttl_s)
            keys = [f"{P}owner:{owner_uid}:{part}" for part in ("pods", "nodes", "gpus", "meta")]
            for pod_uid in sorted(pod_uids):
                keys += [f"{P}pod:{pod_uid}:meta", f"{P}pod:{pod_uid}:stats"]
            for key in keys:
                pipe.expire(key, ttl_s)
            await pipe.execute()
        by_name = f"{P}owner-by-name:{namespace}/{name}"
        if text(await self.redis.get(by_name) or b"") == owner_uid:
            await self.redis.expire(by_name, ttl_s)
