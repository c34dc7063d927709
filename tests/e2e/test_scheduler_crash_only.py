"""The scheduler process exits non-zero when one of its long-lived tasks dies (issue 16):
crash-only, so Kubernetes restarts it instead of leaving it alive and doing nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from alnair.common.tasks import within
from alnair.dev.localstack import ControlPlane
from alnair.scheduler.app import serve
from alnair.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.e2e


def running_task(name: str) -> asyncio.Task[object] | None:
    return next((t for t in asyncio.all_tasks() if t.get_name() == name), None)


async def test_a_dead_task_ends_the_process_with_an_error(control_plane: ControlPlane) -> None:
    settings = SchedulerSettings(
        kubeconfig=str(control_plane.kubeconfig),
        leader_elect=False,
        nats_enabled=False,
        http_host="127.0.0.1",
        http_port=0,
        identity="crash-only",
        log_json=False,
    )
    main = asyncio.create_task(serve(settings))
    for _ in range(300):
        writer = running_task("scheduler.events.0")
        if writer is not None or main.done():
            break
        await asyncio.sleep(0.05)
    assert writer is not None, "the scheduler never started its event writers"
    # A real fault inside the task: the event writer takes a malformed item off its queue.
    recorder = writer.get_coro().cr_frame.f_locals["self"]  # type: ignore[union-attr]
    await recorder._queue.put("not an event")
    assert await within(main, 30) == 1
