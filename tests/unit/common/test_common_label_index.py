"""`LabelIndex`: an informer's objects by (namespace, label value), kept by its events."""

from __future__ import annotations

from typing import Any

from alnair.common.informer import Informer, LabelIndex, WatchEvent
from alnair.common.kube import PODS

LABEL = "alnair.io/workload"


def pod(name: str, ns: str, value: str | None, rv: str = "1") -> dict[str, Any]:
    labels = {LABEL: value} if value else {}
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": rv}}


async def test_objects_are_found_by_namespace_and_value_and_follow_their_changes() -> None:
    informer = Informer(None, PODS, name="pods")  # type: ignore[arg-type]  # (never runs)
    index = LabelIndex(informer, LABEL)
    await informer._apply(WatchEvent.ADDED, pod("a", "ns1", "deployment.web"))
    await informer._apply(WatchEvent.ADDED, pod("b", "ns1", "deployment.web"))
    await informer._apply(WatchEvent.ADDED, pod("c", "ns2", "deployment.web"))
    await informer._apply(WatchEvent.ADDED, pod("d", "ns1", None))
    assert [p["metadata"]["name"] for p in index.get("ns1", "deployment.web")] == ["a", "b"]
    assert [p["metadata"]["name"] for p in index.get("ns2", "deployment.web")] == ["c"]
    assert index.get("ns1", "deployment.api") == []
    # Relabelled: found under its new value only; deleted: gone.
    await informer._apply(WatchEvent.MODIFIED, pod("b", "ns1", "deployment.api", rv="2"))
    assert [p["metadata"]["name"] for p in index.get("ns1", "deployment.web")] == ["a"]
    assert [p["metadata"]["name"] for p in index.get("ns1", "deployment.api")] == ["b"]
    await informer._apply(WatchEvent.DELETED, pod("a", "ns1", "deployment.web"))
    assert index.get("ns1", "deployment.web") == []
    # A copy written into the store directly (a controller's own write) is the one returned.
    newer = pod("b", "ns1", "deployment.api", rv="9")
    informer.store["ns1/b"] = newer
    assert index.get("ns1", "deployment.api") == [newer]
