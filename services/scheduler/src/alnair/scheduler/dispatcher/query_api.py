"""The dispatcher's read API as an aggregated Kubernetes API: `dispatcher.query.alnair.io/v1alpha1`.

What `kubectl alnair queues`, `jobs` and `why` show, reached through the API server with the
user's own identity (`alnair.common.aggregated`: the front proxy's headers, or a bearer token
when called directly; a SubjectAccessReview for the same resource either way):

- `GET .../clusterqueues`: each ClusterQueue's nominal quota, borrowing limit, use and borrowed
  GPUs per model, the GPUs it lends to its cohort now, its pending and admitted counts, and
  whether it is active (or why not). Cluster-scoped: a ClusterRoleBinding grants it.
- `GET .../queuedworkloads`, `GET .../namespaces/{ns}/queuedworkloads`: every workload the
  dispatcher holds (waiting or admitted), with its position, predicted start and finish, GPU
  model and the reason it waits: one namespace's, or every namespace's for whoever may list
  them all.
- `GET .../namespaces/{ns}/{plural}/{name}`: why one workload of a queued kind (`jobs`,
  `jobsets`, `rayjobs`, ...) waits: a `WorkloadExplanation` whose `workload` is the
  explanation of `GET /v1/{plural}/{ns}/{name}` (the same fields as each item of the list).

A follower replica decides nothing: it answers 503 naming the leader, as the plain API does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse

from alnair.common.aggregated import (
    DISPATCHER_GROUP,
    QUERY_VERSION,
    GroupVersion,
    Resource,
    status,
)
from alnair.common.kube import NotFound
from alnair.scheduler.dispatcher.controller import Dispatcher
from alnair.scheduler.dispatcher.core import QueueState
from alnair.scheduler.dispatcher.kinds import KINDS
from alnair.scheduler.dispatcher.parsing import Workload

GROUP = DISPATCHER_GROUP
VERSION = QUERY_VERSION
API_VERSION = f"{GROUP}/{VERSION}"

QUERY_API = GroupVersion(
    GROUP,
    VERSION,
    (
        Resource("clusterqueues", namespaced=False, kind="ClusterQueueUsage", verbs=("list",)),
        Resource("queuedworkloads", namespaced=True, kind="QueuedWorkload", verbs=("list",)),
        *(
            Resource(k.resource.plural, namespaced=True, kind="WorkloadExplanation", verbs=("get",))
            for k in KINDS.values()
        ),
    ),
)


def lent(queues: Mapping[str, QueueState], report: Mapping[str, Mapping[str, Any]]) -> Counter[str]:
    """GPUs each queue lends its cohort now: what the cohort's members borrow is taken from
    the lenders' unused nominal quota (within each one's lending limit), per model, lenders in
    name order. Kueue reports only what is borrowed; who it comes from is this attribution."""
    out: Counter[str] = Counter()
    cohorts: dict[str, list[str]] = {}
    for name, state in sorted(queues.items()):
        if state.spec is not None and state.spec.cohort:
            cohorts.setdefault(state.spec.cohort, []).append(name)
    for members in cohorts.values():
        used = {m: _used(report.get(m) or {}) for m in members}
        models = {t for m in members for t in queues[m].spec.quota}  # type: ignore[union-attr]
        for model in sorted(models):
            wanted = 0
            spare: list[tuple[str, int]] = []
            for m in members:
                quota = queues[m].spec.quota.get(model)  # type: ignore[union-attr]
                nominal = quota.nominal if quota else 0
                use = used[m][model]
                wanted += max(0, use - nominal)
                room = max(0, nominal - use)
                if quota is not None and quota.lending_limit is not None:
                    room = min(room, quota.lending_limit)
                spare.append((m, room))
            for m, room in spare:
                give = min(room, wanted)
                if give:
                    out[m] += give
                    wanted -= give
    return out


def _used(status: Mapping[str, Any]) -> Counter[str]:
    return Counter({f["name"]: int(f["total"]) for f in status.get("flavorsUsage") or ()})


def queue_usage(dispatcher: Dispatcher) -> dict[str, Any]:
    """`clusterqueues`: every ClusterQueue with its quota and use."""
    report = dispatcher.queue_report
    lending = lent(dispatcher.queues, report)
    items = []
    for obj in sorted(dispatcher.cluster_queues.values(), key=lambda o: o["metadata"]["name"]):
        name = obj["metadata"]["name"]
        state = dispatcher.queues.get(name)
        spec = state.spec if state else None
        counted = report.get(name) or {}
        items.append(
            {
                "name": name,
                "cohort": spec.cohort if spec else None,
                "active": spec is not None,
                "problem": state.problem if state else None,
                "nominal": {m: q.nominal for m, q in sorted(spec.quota.items())} if spec else {},
                "borrowingLimit": (
                    {
                        m: q.borrowing_limit
                        for m, q in sorted(spec.quota.items())
                        if q.borrowing_limit is not None
                    }
                    if spec
                    else {}
                ),
                "used": dict(sorted(_used(counted).items())),
                "borrowed": int(counted.get("borrowedGPUs") or 0),
                "lent": lending[name],
                "pending": int(counted.get("pendingWorkloads") or 0),
                "admitted": int(counted.get("admittedWorkloads") or 0),
            }
        )
    return {
        "kind": "ClusterQueueUsageList",
        "apiVersion": API_VERSION,
        "metadata": {},
        "policy": dispatcher.policy.name,
        "items": items,
    }


_RANKED: dict[str | None, tuple[tuple[object, object], list[Workload]]] = {}
"""Per namespace (None: all), the last ranking and the reconcile it was made from: positions
change only when a reconcile runs, which replaces `dispatcher.workloads` as it starts and
`dispatcher.queue_report` once it decided (so a ranking made in between is not kept)."""


def _ranked(dispatcher: Dispatcher, namespace: str | None) -> list[Workload]:
    """The workloads of `namespace`, waiting ones by position, then admitted ones by name;
    made once per reconcile, not per request."""
    workloads = dispatcher.workloads
    made_from = (workloads, dispatcher.queue_report)
    cached = _RANKED.get(namespace)
    if cached is not None and all(a is b for a, b in zip(cached[0], made_from, strict=True)):
        return cached[1]
    held: dict[str, Workload] = {}
    for wl in list(workloads.values()):
        if namespace is None or wl.namespace == namespace:
            held.setdefault(wl.key, wl)
    states = dispatcher.states

    def order(wl: Workload) -> tuple[bool, int, str, str]:
        state = states.get(wl.key)
        waiting = state is None or state.admitted_type is None
        position = state.position if state is not None and state.position is not None else 1 << 30
        return (not waiting, position if waiting else 0, f"{wl.namespace}/{wl.name}", wl.kind)

    ranked = sorted(held.values(), key=order)
    if len(_RANKED) > 1024:
        _RANKED.clear()
    _RANKED[namespace] = (made_from, ranked)
    return ranked


def queued(
    dispatcher: Dispatcher, namespace: str | None, limit: int = 0, offset: int = 0
) -> dict[str, Any]:
    """`queuedworkloads`: every workload the dispatcher holds in `namespace` (None: all),
    waiting ones by position, then admitted ones by name; `limit` of them from `offset` (0:
    all). Ordered from the states, so only the page's explanations are built (10,000 queued
    workloads cost a sort, not 10,000 documents)."""
    ranked = _ranked(dispatcher, namespace)
    page = ranked[offset : offset + limit] if limit else ranked[offset:]
    items = []
    for wl in page:
        try:
            items.append(dispatcher.explain(wl.namespace, wl.name, kind=wl.kind))
        except NotFound:
            continue  # gone since the last reconcile
    metadata: dict[str, Any] = {"total": len(ranked)}
    if limit and offset + limit < len(ranked):
        metadata["continue"] = str(offset + limit)
    return {"kind": "QueuedWorkloadList", "apiVersion": API_VERSION, "metadata": metadata,
            "items": items}  # fmt: skip


def add_query_routes(app: FastAPI, dispatcher: Dispatcher) -> None:
    """The routes under `QUERY_API.prefix` (authorization is `install_aggregated`'s)."""
    by_plural = {k.resource.plural: k.kind for k in KINDS.values()}
    prefix = QUERY_API.prefix

    def follower() -> JSONResponse | None:
        why = dispatcher.follower_problem()
        return status(503, "ServiceUnavailable", why) if why is not None else None

    @app.get(prefix + "/clusterqueues", response_model=None)
    async def clusterqueues() -> dict[str, Any] | JSONResponse:
        return follower() or JSONResponse(queue_usage(dispatcher))

    @app.get(prefix + "/queuedworkloads", response_model=None)
    async def all_queued(
        limit: int = Query(0, ge=0), offset: int = Query(0, ge=0, alias="continue")
    ) -> dict[str, Any] | JSONResponse:
        return follower() or JSONResponse(queued(dispatcher, None, limit, offset))

    @app.get(prefix + "/namespaces/{namespace}/queuedworkloads", response_model=None)
    async def queued_in(
        namespace: str, limit: int = Query(0, ge=0), offset: int = Query(0, ge=0, alias="continue")
    ) -> dict[str, Any] | JSONResponse:
        return follower() or JSONResponse(queued(dispatcher, namespace, limit, offset))

    @app.get(prefix + "/namespaces/{namespace}/{plural}/{name}", response_model=None)
    async def why(namespace: str, plural: str, name: str) -> dict[str, Any] | JSONResponse:
        kind = by_plural.get(plural)
        if kind is None:
            known = ", ".join(sorted(by_plural))
            return status(404, "NotFound", f"no queued kind {plural!r} (known: {known})")
        if (refused := follower()) is not None:
            return refused
        try:
            doc = dispatcher.explain(namespace, name, kind=kind)
        except NotFound as exc:
            return status(404, "NotFound", exc.api_message)
        return JSONResponse(
            {
                "kind": "WorkloadExplanation",
                "apiVersion": API_VERSION,
                "metadata": {"name": name, "namespace": namespace},
                "workload": doc,
            }
        )
