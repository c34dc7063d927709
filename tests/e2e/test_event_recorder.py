"""The one Event writer every service uses, against the real API server: what it writes is what
`kubectl describe` shows, a refused Event never raises into the caller, and a full queue drops
and counts instead of blocking."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from alnair.common.kube import CONFIGMAPS, EVENTS, KubeClient
from alnair.common.recorder import EventRecorder
from alnair.dev.waiting import wait_for

pytestmark = pytest.mark.e2e


async def _configmap(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    return await kube.create(CONFIGMAPS, body, ns)


async def _events(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = (await kube.list(EVENTS, ns, field_selector=f"involvedObject.name={name}"))["items"]
    return list(items)


async def test_a_posted_event_is_what_describe_shows(kube: KubeClient, namespace: str) -> None:
    recorder = EventRecorder(kube, "alnair-test")
    cm = await _configmap(kube, namespace, "about")
    assert await recorder.post(cm, "Admitted", "2 x V100M32", type_="Normal")
    (event,) = await _events(kube, namespace, "about")
    assert event["reason"] == "Admitted" and event["message"] == "2 x V100M32"
    assert event["type"] == "Normal"
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert event["involvedObject"]["uid"] == cm["metadata"]["uid"]
    assert event["source"]["component"] == "alnair-test"


async def test_a_refused_event_is_counted_and_never_raises(kube: KubeClient) -> None:
    failures: list[int] = []
    recorder = EventRecorder(kube, "alnair-test", on_failure=lambda: failures.append(1))
    # The API server refuses it: the namespace does not exist.
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "no-such-namespace"},
    }
    assert await recorder.post(ghost, "Admitted", "nowhere to go", type_="Warning") is False
    assert failures == [1]


async def test_a_full_queue_drops_and_counts_and_the_writer_catches_up(
    kube: KubeClient, namespace: str
) -> None:
    dropped: list[int] = []
    recorder = EventRecorder(kube, "alnair-test", capacity=2, on_drop=lambda: dropped.append(1))
    cm = await _configmap(kube, namespace, "busy")
    for i in range(3):
        recorder.record(cm, "FailedScheduling", f"attempt {i}", type_="Warning")
    assert dropped == [1] and recorder.pending() == 2

    async def both_written() -> list[dict[str, Any]] | None:
        written = await _events(kube, namespace, "busy")
        return written if len(written) == 2 else None

    writer = asyncio.create_task(recorder.run())
    try:
        written = await wait_for(both_written, 20, what="the two queued Events")
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    assert sorted(e["message"] for e in written) == ["attempt 0", "attempt 1"]
    assert all(e["type"] == "Warning" for e in written)
