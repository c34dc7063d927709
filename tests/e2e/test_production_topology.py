"""The production overlay's infrastructure on loopback (issue 26, "infrastructure that
outlives a node"): three nats-servers in one JetStream cluster with every stream kept by all
three, and Redis with a replica and three Sentinels.

- the bus: events published while one NATS server is SIGKILLed all reach a durable consumer,
  each handled once, and the client stays ready without a restart;
- Redis: writes made through the Sentinels while the primary is SIGKILLed all succeed (the
  client follows the failover) and every one is on the new primary; a client without the
  Sentinels' password is refused;
- the whole stack (`bench/chaos.py --topology production`): jobs through the scheduler and the
  dispatcher while a NATS node and then the Redis primary are killed: nothing lost, admitted
  twice or recorded twice, and no service restarted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from alnair.common.bus import Bus
from alnair.common.credentials import new_password
from alnair.common.events import Envelope, JobEvent, JobPhase
from alnair.common.redisauth import ADMIN_USER, REPLICATION_USER, SENTINEL_USER
from alnair.common.redisconn import redis_client
from alnair.common.settings import CommonSettings
from alnair.dev.localstack import NatsCluster, RedisFailover
from alnair.dev.waiting import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _job(i: int) -> JobEvent:
    return JobEvent(
        phase=JobPhase.SUBMITTED, namespace="topo", kind="Job", name=f"job-{i:04d}",
        uid=f"uid-{i:04d}", cluster="topo",
    )  # fmt: skip


async def test_events_published_across_a_nats_node_loss_each_arrive_once(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path).start()
    buses: list[Bus] = []
    try:
        publisher = await Bus.connect(cluster.url, name="topo-publisher", replicas=3)
        buses.append(publisher)
        consumer = await Bus.connect(cluster.url, name="topo-consumer", replicas=3)
        buses.append(consumer)
        seen: Counter[str] = Counter()

        async def on_job(event: JobEvent, _env: Envelope[JobEvent]) -> None:
            seen[event.name] += 1

        await consumer.subscribe(JobEvent, on_job, durable="topo")
        info = await publisher.js.stream_info(JobEvent.STREAM or "JOBS")
        assert info.config.num_replicas == 3
        n = 300
        for i in range(n):
            if i == n // 3:
                cluster.kill(1)  # a lost node: its peers and its clients get no goodbye
            await publisher.publish(_job(i), source="test")
        await wait_for(lambda: len(seen) == n, 60, what="every event consumed")
        assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1]
        await wait_for(lambda: publisher.ready and consumer.ready, 30, what="both ready")
        # The node comes back on its port and store and catches up; nothing is replayed.
        cluster.start_server(1)
        await publisher.publish(_job(n), source="test")
        await wait_for(lambda: len(seen) == n + 1, 30)
        assert max(seen.values()) == 1
    finally:
        for bus in buses:
            await bus.close()
        cluster.stop()


async def test_writes_through_the_sentinels_ride_a_primary_failover(tmp_path: Path) -> None:
    users = {u: new_password() for u in ("aggregator", ADMIN_USER, REPLICATION_USER, SENTINEL_USER)}
    sentinel_pw = new_password()
    topo = RedisFailover(tmp_path, users=users, sentinel_password=sentinel_pw).start()

    def settings(sentinel_password: str | None) -> CommonSettings:
        return CommonSettings(
            redis_url="redis://sentinel/0", redis_sentinels=topo.sentinels,
            redis_user="aggregator", redis_password=users["aggregator"],
            redis_sentinel_password=sentinel_password,
        )  # fmt: skip

    client = redis_client(settings(sentinel_pw))
    try:
        first = topo.primary()
        n = 200
        for i in range(n):
            if i == n // 4:
                topo.kill_primary()
            await client.set(f"alnair:record:topo/{i}", str(i))
            await asyncio.sleep(0.02)  # writes keep coming through the failover
        assert topo.primary() is not first
        check = redis_client(settings(sentinel_pw))
        values = await check.mget([f"alnair:record:topo/{i}" for i in range(n)])
        assert values == [str(i).encode() for i in range(n)]
        await check.aclose()
        # The Sentinels answer nobody without their password; nor does the primary a service
        # outside its keys (the ACL file every server of the set loads).
        host, port = topo.sentinels.split(",")[0].split(":")
        stranger = aioredis.Redis(host=host, port=int(port))
        with pytest.raises(redis.exceptions.AuthenticationError):
            await stranger.sentinel_get_master_addr_by_name("alnair", return_responses=True)
        await stranger.aclose()
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.set("alnair:predictor:current", "1")
    finally:
        await client.aclose()
        topo.stop()


@pytest.mark.timeout(600)
def test_the_stack_loses_nothing_when_a_nats_node_and_the_redis_primary_die(
    tmp_path: Path,
) -> None:
    argv = [
        sys.executable, str(REPO / "bench" / "chaos.py"), "--topology", "production",
        "--jobs", "12", "--kills-per-service", "0", "--arrival-interval-s", "1.5",
        "--run-s", "6", "10", "--nats-down-s", "3", "--settle-s", "180", "--no-apiserver-restart",
        "--leader-stop-s", "0",  # (a stopped leader exits on purpose: counted as a restart)
        "--nodes", "2x V100M32:4", "--dir", str(tmp_path / "stack"),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["topology"] == "production"
    assert report["nats_node_kills"] == 1 and report["redis_failovers"] == 1, report
    assert report["nats_restarts"] == 0 and report["kills"] == 0
    assert report["service_restarts"] == 0, report  # every service rode both losses
    # half the jobs through the dispatcher's queue, and the ElasticJob (job 5) too
    assert report["queued"] == 7 and report["elastic"] == 1 and report["pod_samples"] > 0
    assert report["elastic_problems"] == [], report
    assert report["fault_windows"] == 2 and report["fault_windows_unsampled"] == 0, report
    for key in ("lost", "double_bound", "gpu_overcommitted", "records_duplicated",
                "records_missing", "admissions_duplicated", "completions_duplicated",
                "completions_missing"):  # fmt: skip
        assert report[key] == 0, report
    assert done.returncode == 0, report
