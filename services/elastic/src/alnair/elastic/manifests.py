"""The objects the controller owns for one ElasticJob, built from its spec.

- `<job>-workers`: a headless Service (stable worker DNS names, `<pod>.<job>-workers.<ns>.svc`)
  and a StatefulSet with Parallel pod management, so a grow starts every new worker at once and
  a shrink stops the highest ordinals first, each with its own termination grace period (the
  trainer's SIGTERM window to commit a checkpoint). Its template is built once at creation; the
  controller only ever patches `.spec.replicas` afterwards (a template change would roll every
  worker).
- `<job>`: the PodGroup, `minMember = minReplicas`: the scheduler binds no worker until the
  minimum fits, and counts members above it (ordinal >= minMember) as surplus, the first
  preemption victims.
- torchrun: `<job>-rdzv`, a one-replica Deployment running the c10d TCPStore with the job's own
  image and a Service in front of it, so the rendezvous survives the loss of any worker,
  worker 0 included. Workers get `PET_NNODES=min:max`, `PET_RDZV_ENDPOINT=<job>-rdzv:29400`.
- horovod: `<job>-discovery`, a ConfigMap holding `hosts` (host:slots of every ready worker,
  rewritten after every change) and `discover_hosts.sh`, mounted into every worker at
  /etc/alnair/elastic for `horovodrun --host-discovery-script`.
"""

from __future__ import annotations

import copy
from typing import Any

from alnair.common import resources as r
from alnair.common.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    PODGROUPS,
    SERVICES,
    Conflict,
    KubeClient,
    Obj,
    Resource,
)
from alnair.elastic.spec import JOB_LABEL, RDZV_PORT, ROLE_LABEL, ElasticSpec, Rendezvous

DISCOVERY_DIR = "/etc/alnair/elastic"
DISCOVERY_SCRIPT = """#!/bin/sh
# Prints host:slots of every ready worker of this ElasticJob (horovodrun --host-discovery-script).
# The controller rewrites the hosts file after every change; the kubelet refreshes the mounted
# copy within its sync period, so ask the controller first when it is reachable.
if [ -n "$ALNAIR_ELASTIC_HOSTS_URL" ] && command -v curl >/dev/null 2>&1; then
  curl -fsS --max-time 2 "$ALNAIR_ELASTIC_HOSTS_URL" && exit 0
fi
cat "$(dirname "$0")/hosts"
"""


def workers_name(spec: ElasticSpec) -> str:
    return f"{spec.name}-workers"


def rdzv_name(spec: ElasticSpec) -> str:
    return f"{spec.name}-rdzv"


def discovery_name(spec: ElasticSpec) -> str:
    return f"{spec.name}-discovery"


def owner_ref(spec: ElasticSpec) -> Obj:
    return {
        "apiVersion": "alnair.io/v1alpha1",
        "kind": "ElasticJob",
        "name": spec.name,
        "uid": spec.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(spec: ElasticSpec, name: str, role: str | None = None) -> Obj:
    labels = {JOB_LABEL: spec.name}
    if role:
        labels[ROLE_LABEL] = role
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels,
        "ownerReferences": [owner_ref(spec)],
    }


def host_of(spec: ElasticSpec, pod_name: str) -> str:
    return f"{pod_name}.{workers_name(spec)}.{spec.namespace}.svc"


def headless_service(spec: ElasticSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, workers_name(spec)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: spec.name, ROLE_LABEL: "worker"},
            "ports": [{"name": "rdzv", "port": RDZV_PORT}],
        },
    }


def pod_group(spec: ElasticSpec) -> Obj:
    return {
        "apiVersion": f"{r.POD_GROUP_API_GROUP}/{r.POD_GROUP_VERSION}",
        "kind": "PodGroup",
        "metadata": _meta(spec, spec.name),
        "spec": {"minMember": spec.min_replicas},
    }


def _env(spec: ElasticSpec, hosts_url: str | None) -> list[Obj]:
    common = [
        {"name": "ALNAIR_ELASTIC_JOB", "value": spec.name},
        {"name": "ALNAIR_ELASTIC_MIN_REPLICAS", "value": str(spec.min_replicas)},
        {"name": "ALNAIR_ELASTIC_MAX_REPLICAS", "value": str(spec.max_replicas)},
    ]
    if spec.rendezvous is Rendezvous.TORCHRUN:
        return [
            *common,
            {"name": "PET_NNODES", "value": f"{spec.min_replicas}:{spec.max_replicas}"},
            {"name": "PET_NPROC_PER_NODE", "value": str(spec.gpus_per_worker)},
            {"name": "PET_RDZV_BACKEND", "value": "c10d"},
            {
                "name": "PET_RDZV_ENDPOINT",
                "value": f"{rdzv_name(spec)}.{spec.namespace}.svc:{RDZV_PORT}",
            },
            {"name": "PET_RDZV_ID", "value": spec.uid or spec.name},
            # The store runs in its own pod: no worker hosts it, so none takes it down.
            {"name": "PET_RDZV_CONF", "value": "is_host=false"},
            {"name": "PET_MAX_RESTARTS", "value": str(spec.max_restarts)},
        ]
    env = [*common, {"name": "ALNAIR_ELASTIC_SLOTS", "value": str(spec.gpus_per_worker)}]
    if hosts_url:
        env.append({"name": "ALNAIR_ELASTIC_HOSTS_URL", "value": hosts_url})
    return env


def worker_template(spec: ElasticSpec, hosts_url: str | None = None) -> Obj:
    template = copy.deepcopy(spec.template)
    meta = template.setdefault("metadata", {})
    labels = meta.setdefault("labels", {})
    labels.update({JOB_LABEL: spec.name, ROLE_LABEL: "worker", r.POD_GROUP_LABEL: spec.name})
    pod = template.setdefault("spec", {})
    pod.setdefault("schedulerName", r.SCHEDULER_NAME)
    pod["restartPolicy"] = "Always"  # the only policy a StatefulSet accepts
    pod["subdomain"] = workers_name(spec)
    env = _env(spec, hosts_url)
    for c in pod.get("containers") or []:
        names = {e.get("name") for e in c.get("env") or []}
        c["env"] = [*(c.get("env") or []), *(e for e in env if e["name"] not in names)]
    if spec.rendezvous is Rendezvous.HOROVOD:
        pod.setdefault("volumes", []).append(
            {
                "name": "alnair-elastic-discovery",
                "configMap": {"name": discovery_name(spec), "defaultMode": 0o755},
            }
        )
        for c in pod.get("containers") or []:
            c.setdefault("volumeMounts", []).append(
                {"name": "alnair-elastic-discovery", "mountPath": DISCOVERY_DIR, "readOnly": True}
            )
    return template


def stateful_set(spec: ElasticSpec, replicas: int, hosts_url: str | None = None) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(spec, workers_name(spec)),
        "spec": {
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "serviceName": workers_name(spec),
            "selector": {"matchLabels": {JOB_LABEL: spec.name, ROLE_LABEL: "worker"}},
            "template": worker_template(spec, hosts_url),
        },
    }


def rdzv_objects(spec: ElasticSpec) -> list[Obj]:
    """The c10d store (Deployment) and its Service, for torchrun jobs."""
    containers = (spec.template.get("spec") or {}).get("containers") or [{}]
    image = containers[0].get("image", "python:3.12-slim")
    store = (
        "import time, torch.distributed as d; "
        f"s = d.TCPStore('0.0.0.0', {RDZV_PORT}, is_master=True, wait_for_workers=False); "
        "time.sleep(1e9)"
    )
    labels = {JOB_LABEL: spec.name, ROLE_LABEL: "rendezvous"}
    pod_spec: dict[str, Any] = {
        "schedulerName": (spec.template.get("spec") or {}).get("schedulerName", r.SCHEDULER_NAME),
        "containers": [
            {
                "name": "store",
                "image": image,
                "command": ["python", "-c", store],
                "ports": [{"containerPort": RDZV_PORT}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
        ],
    }
    for key in ("nodeSelector", "tolerations", "imagePullSecrets"):
        value = (spec.template.get("spec") or {}).get(key)
        if value:
            pod_spec[key] = copy.deepcopy(value)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, rdzv_name(spec), "rendezvous"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, rdzv_name(spec), "rendezvous"),
        "spec": {"selector": labels, "ports": [{"name": "c10d", "port": RDZV_PORT}]},
    }
    return [deployment, service]


def discovery_config_map(spec: ElasticSpec, hosts: list[str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, discovery_name(spec)),
        "data": {"hosts": "".join(f"{h}\n" for h in hosts), "discover_hosts.sh": DISCOVERY_SCRIPT},
    }


async def ensure_owned(kube: KubeClient, spec: ElasticSpec) -> None:
    """Create what the job owns and misses (its headless Service, PodGroup, and the torchrun
    rendezvous or the Horovod discovery ConfigMap); what exists is left as it is."""
    wanted: list[tuple[Resource, Obj]] = [
        (SERVICES, headless_service(spec)),
        (PODGROUPS, pod_group(spec)),
    ]
    if spec.rendezvous is Rendezvous.TORCHRUN:
        deployment, service = rdzv_objects(spec)
        wanted += [(DEPLOYMENTS, deployment), (SERVICES, service)]
    else:
        wanted.append((CONFIGMAPS, discovery_config_map(spec, [])))
    for res, body in wanted:
        try:
            await kube.create(res, body, spec.namespace)
        except Conflict:
            continue
