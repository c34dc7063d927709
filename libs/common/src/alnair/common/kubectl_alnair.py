"""`kubectl alnair`: what the queues hold, where a job stands, and why it waits.

    kubectl alnair queues                     # every ClusterQueue: quota, use, borrowed, lent
    kubectl alnair jobs [-n NS | -A]          # queued workloads: position, reason, predictions
    kubectl alnair why KIND/NAME [-n NS]      # why one workload waits (job/train, jobset/x, ...)
    kubectl alnair why pod/NAME [-n NS]       # why a pod waits: each filter's verdict on nodes
    kubectl alnair gpus                       # per node and GPU: holders, use, health, fragments
    kubectl alnair top [-n NS | -A]           # per pod: its GPUs, share, utilization, memory

Installed with the package as `kubectl-alnair` (kubectl finds plugins on PATH), and as
`alnair queues|jobs|why|gpus|top`. Queues and workloads come from the dispatcher, GPUs, pod
metrics and pods from the scheduler. Each verb takes `-o table|json|yaml`, `--kubeconfig`,
`--context`.

It reads the services' aggregated APIs through the API server (`alnair.common.aggregated`),
with the kubeconfig's own credentials: the API server authenticates the user and checks RBAC,
and the service authorizes the same identity again. Nothing is proxied around the user, and a
service that is not deployed is named in a one-line error, with what the API server said.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from alnair.common.aggregated import (
    DISPATCHER_GROUP,
    QUERY_VERSION,
    SCHEDULER_GROUP,
    GroupVersion,
)
from alnair.common.errors import ConfigError
from alnair.common.kube import ApiError, KubeClient, Unavailable
from alnair.common.kubeconfig import KubeConfig

NONE = "<none>"


@dataclass(frozen=True)
class QueryApi:
    """One service's aggregated API (its group and version, the paths and APIService name
    `GroupVersion` gives), and the service the plugin names in errors."""

    service: str
    api: GroupVersion


DISPATCHER = QueryApi("dispatcher", GroupVersion(DISPATCHER_GROUP, QUERY_VERSION))
SCHEDULER = QueryApi("scheduler", GroupVersion(SCHEDULER_GROUP, QUERY_VERSION))

KIND_PLURALS = {
    "job": "jobs", "jobs": "jobs",
    "jobset": "jobsets", "jobsets": "jobsets",
    "rayjob": "rayjobs", "rayjobs": "rayjobs",
    "raycluster": "rayclusters", "rayclusters": "rayclusters",
    "trainjob": "trainjobs", "trainjobs": "trainjobs",
    "pytorchjob": "pytorchjobs", "pytorchjobs": "pytorchjobs",
    "mpijob": "mpijobs", "mpijobs": "mpijobs",
    "elasticjob": "elasticjobs", "elasticjobs": "elasticjobs",
    "deployment": "deployments", "deploy": "deployments", "deployments": "deployments",
    "statefulset": "statefulsets", "sts": "statefulsets", "statefulsets": "statefulsets",
    "leaderworkerset": "leaderworkersets", "lws": "leaderworkersets",
    "leaderworkersets": "leaderworkersets",
    "podgroup": "podgroups", "podgroups": "podgroups",
    "pod": "pods", "pods": "pods", "po": "pods",
    "workload": "workloads", "workloads": "workloads",
}  # fmt: skip
"""What a user may type before the slash of `why KIND/NAME` (kubectl's short names too)."""


class PluginError(Exception):
    """One line for the user; the exit status is 1."""


async def fetch(kube: KubeClient, query: QueryApi, path: str) -> dict[str, Any]:
    """GET `path` under `query`'s API, errors turned into one line naming the service."""
    api = query.api
    try:
        return await kube.request("GET", api.prefix + path)
    except ApiError as exc:
        raise PluginError(await _why_failed(kube, query, exc)) from exc
    except Unavailable as exc:
        if exc.fields.get("status") == 503:
            # The aggregator's answer when the service behind the APIService is not there.
            said = exc.message.split(": ", 1)[-1]
            raise PluginError(
                f"the {query.service}'s API ({api.api_service}) is registered but not "
                f"answering: {said}"
            ) from exc
        raise PluginError(f"the API server cannot be reached: {exc.message}") from exc


async def _why_failed(kube: KubeClient, query: QueryApi, exc: ApiError) -> str:
    api = query.api
    message = exc.api_message or exc.reason
    if exc.status == 404:
        try:
            await kube.request("GET", api.prefix)
        except ApiError as again:
            if again.status == 404:
                return (
                    f"the {query.service} is not deployed here: the API server does not serve "
                    f"{api.group}/{api.version} (APIService {api.api_service})"
                )
        except Unavailable:
            pass
        return message
    if exc.status in (401, 403):
        return f"forbidden: {message}"
    return f"{exc.status} {exc.reason}: {message}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """kubectl's plain table: upper-case headers, columns three spaces apart."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None or value in ("", {}):
        return NONE
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def ago_or_in(at_s: float | None, now: float) -> str:
    """A predicted time as kubectl shows ages: `in 5m`, `2m ago`, `<none>`."""
    if at_s is None:
        return NONE
    delta = at_s - now
    text = _duration(abs(delta))
    return f"in {text}" if delta >= 0 else f"{text} ago"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s % 3600 >= 60 else f"{s // 3600}h"
    return f"{s // 86400}d"


def queues_table(doc: dict[str, Any]) -> str:
    rows = [
        (
            q["name"], q.get("cohort"), "True" if q["active"] else "False",
            q["pending"], q["admitted"], q.get("nominal"), q.get("used"), q["borrowed"],
            q["lent"],
        )
        for q in doc.get("items") or ()
    ]  # fmt: skip
    headers = ("NAME", "COHORT", "ACTIVE", "PENDING", "ADMITTED", "NOMINAL", "USED", "BORROWED",
               "LENT")  # fmt: skip
    return table(headers, rows)


def jobs_table(doc: dict[str, Any], *, all_namespaces: bool, now: float) -> str:
    rows = []
    for item in doc.get("items") or ():
        namespace, _, name = str(item["job"]).partition("/")
        reason = (item.get("reason") or {}).get("kind")
        row = [
            name, item["kind"], item.get("queue"), item["status"], item.get("position"),
            item.get("gpu_model"), ago_or_in(item.get("predicted_start_s"), now),
            ago_or_in(item.get("predicted_finish_s"), now), reason,
        ]  # fmt: skip
        rows.append([namespace, *row] if all_namespaces else row)
    headers = ["NAME", "KIND", "QUEUE", "STATUS", "POSITION", "GPU-MODEL", "START", "FINISH",
               "REASON"]  # fmt: skip
    return table(["NAMESPACE", *headers] if all_namespaces else headers, rows)


def why_text(doc: dict[str, Any], now: float) -> str:
    """One workload as `kubectl describe` would put it."""
    reason = doc.get("reason") or {}
    queue = doc.get("queue") or NONE
    if doc.get("cluster_queue"):
        queue += f" (ClusterQueue {doc['cluster_queue']})"
    fields: list[tuple[str, Any]] = [
        ("Workload", f"{doc['kind']} {doc['job']}"),
        ("Status", doc["status"]),
        ("Queue", queue),
        ("Policy", doc.get("policy")),
        ("Position", doc.get("position")),
        ("GPU model", doc.get("gpu_model")),
        ("Waits for", reason.get("kind")),
        ("Because", reason.get("message")),
        ("Predicted start", ago_or_in(doc.get("predicted_start_s"), now)),
        ("Predicted finish", ago_or_in(doc.get("predicted_finish_s"), now)),
    ]
    prediction = doc.get("prediction") or {}
    if runtimes := prediction.get("runtime_s"):
        fields.append(("Runtime by model", ", ".join(
            f"{m} {_duration(s)}" for m, s in sorted(runtimes.items())
        )))  # fmt: skip
    if doc.get("prediction_error"):
        fields.append(("Prediction error", doc["prediction_error"]))
    width = max(len(k) for k, _ in fields) + 2
    return "".join(f"{(k + ':').ljust(width)}{_cell(v)}\n" for k, v in fields)


def _gpus(milli: int) -> str:
    """Milli-GPU as GPUs: 1000 -> 1, 500 -> 0.5."""
    return f"{milli / 1000:g}"


def gpus_table(doc: dict[str, Any]) -> str:
    rows = []
    for node in doc.get("items") or ():
        for gpu in node["gpus"]:
            holders = ",".join(f"{h['pod']}={_gpus(h['milli'])}" for h in gpu.get("holders") or ())
            rows.append((
                node["node"], node["model"], gpu["index"],
                "True" if gpu["healthy"] else "False", f"{gpu['utilizationPct']:g}%",
                _gpus(gpu["usedMilli"]), holders, f"{node['fragmentation']:g}",
            ))  # fmt: skip
    headers = ("NODE", "MODEL", "GPU", "HEALTHY", "UTIL", "USED", "HOLDERS", "NODE-FRAGMENTATION")
    return table(headers, rows)


def top_table(doc: dict[str, Any], *, all_namespaces: bool) -> str:
    rows = []
    for item in doc.get("items") or ():
        namespace, _, name = str(item["pod"]).partition("/")
        for gpu in item["gpus"]:
            util, memory = gpu.get("utilizationPct"), gpu.get("memoryMiB")
            row = [
                name, item["node"], gpu["index"], _gpus(gpu["milli"]),
                None if util is None else f"{util:g}%",
                None if memory is None else f"{memory:.0f}Mi",
            ]  # fmt: skip
            rows.append([namespace, *row] if all_namespaces else row)
    headers = ["POD", "NODE", "GPU", "SHARE", "UTIL", "MEMORY"]
    return table(["NAMESPACE", *headers] if all_namespaces else headers, rows)


def why_pod_text(doc: dict[str, Any]) -> str:
    """The scheduler's explanation of a pod; its filters' verdicts grouped by reason."""
    request = doc.get("request") or {}
    gpus = request.get("num_gpu") or 0
    milli = request.get("gpu_milli") or 0
    share = f" x {_gpus(milli)}" if 0 < milli < 1000 else ""
    asked = f"{gpus} GPU{share}, {request.get('cpu_milli', 0)}m CPU, "
    asked += f"{request.get('memory_mib', 0)}Mi"
    fields: list[tuple[str, Any]] = [
        ("Pod", doc["pod"]),
        ("Node", doc.get("node")),
        ("Request", asked if request else None),
        ("Message", doc.get("message") or doc.get("error")),
    ]
    if place := doc.get("would_place"):
        fields.append(("Would place", f"{place['node']} GPUs {place['gpus']}"))
    groups: dict[str, list[str]] = {}
    for node, why in (doc.get("filtered") or {}).items():
        groups.setdefault(str(why), []).append(node)
    for k, (why, nodes) in enumerate(sorted(groups.items(), key=lambda g: -len(g[1]))):
        shown = ", ".join(nodes[:3]) + (f", and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        many = "node" if len(nodes) == 1 else "nodes"
        fields.append(("Filtered" if k == 0 else "", f"{why} ({len(nodes)} {many}): {shown}"))
    for k, (node, score) in enumerate(list((doc.get("scores") or {}).items())[:3]):
        fields.append(("Best nodes" if k == 0 else "", f"{node} {score['total']:.3g}"))
    width = max(len(k) for k, _ in fields) + 2
    return "".join(f"{(k + ':' if k else '').ljust(width)}{_cell(v)}\n" for k, v in fields)


def render(doc: Any, output: str, as_table: Callable[[], str]) -> str:
    if output == "json":
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=True))
    return as_table()


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG)")
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    common.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    p = argparse.ArgumentParser(
        prog="kubectl alnair", description="Alnair's queues and jobs, through the API server."
    )
    verbs = p.add_subparsers(dest="verb", required=True)
    verbs.add_parser("queues", parents=[common], help="every ClusterQueue's quota and use")
    jobs = verbs.add_parser("jobs", parents=[common], help="queued workloads in a namespace")
    jobs.add_argument("-A", "--all-namespaces", action="store_true")
    why = verbs.add_parser("why", parents=[common], help="why one workload or pod waits")
    why.add_argument("target", metavar="KIND/NAME")
    verbs.add_parser("gpus", parents=[common], help="every node's GPUs: holders, use, health")
    top = verbs.add_parser("top", parents=[common], help="pods' GPU share, utilization, memory")
    top.add_argument("-A", "--all-namespaces", action="store_true")
    return p


async def run(args: argparse.Namespace) -> str:
    config = KubeConfig.load(args.kubeconfig, args.context)
    namespace = args.namespace or config.namespace or "default"
    now = dt.datetime.now(dt.UTC).timestamp()
    async with KubeClient(config, timeout_s=30) as kube:
        if args.verb == "queues":
            doc = await fetch(kube, DISPATCHER, "/clusterqueues")
            return render(doc, args.output, lambda: queues_table(doc))
        if args.verb == "jobs":
            every = bool(args.all_namespaces)
            path = "/queuedworkloads" if every else f"/namespaces/{namespace}/queuedworkloads"
            doc = await fetch(kube, DISPATCHER, path)
            return render(doc, args.output, lambda: jobs_table(doc, all_namespaces=every, now=now))
        if args.verb == "gpus":
            doc = await fetch(kube, SCHEDULER, "/gpus")
            return render(doc, args.output, lambda: gpus_table(doc))
        if args.verb == "top":
            every = bool(args.all_namespaces)
            path = "/podmetrics" if every else f"/namespaces/{namespace}/podmetrics"
            doc = await fetch(kube, SCHEDULER, path)
            return render(doc, args.output, lambda: top_table(doc, all_namespaces=every))
        kind, slash, name = str(args.target).partition("/")
        plural = KIND_PLURALS.get(kind.lower())
        if not slash or not name or plural is None:
            known = ", ".join(sorted(set(KIND_PLURALS.values())))
            raise PluginError(f"why takes KIND/NAME, not {args.target!r} (kinds: {known})")
        if plural == "pods":
            doc = await fetch(kube, SCHEDULER, f"/namespaces/{namespace}/pods/{name}")
            return render(doc, args.output, lambda: why_pod_text(doc["pod"]))
        doc = await fetch(kube, DISPATCHER, f"/namespaces/{namespace}/{plural}/{name}")
        return render(doc, args.output, lambda: why_text(doc["workload"], now))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        sys.stdout.write(asyncio.run(run(args)))
    except (PluginError, ConfigError) as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line
        return 1
    return 0


def verb(name: str) -> Callable[[Sequence[str]], int]:
    """`alnair <name> ...` as `kubectl alnair <name> ...` (the `alnair.cli` entry points)."""

    def run_verb(argv: Sequence[str]) -> int:
        return main([name, *argv])

    return run_verb


queues = verb("queues")
jobs = verb("jobs")
why = verb("why")
gpus = verb("gpus")
top = verb("top")


if __name__ == "__main__":
    raise SystemExit(main())
