"""The services of the local stack (`make up`): for each, the module it runs, the variable its
HTTP port is read from, the environment it needs beside the stack's (a node for the device
plugin and the agent, a webhook for the dispatcher), and whether it starts by default.
`devstack` starts, checks and stops them.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from alnair.common.aggregated import DISPATCHER_GROUP, QUERY_VERSION, SCHEDULER_GROUP
from alnair.common.certs_cli import still_good
from alnair.common.errors import ConfigError
from alnair.common.kube import KubeClient
from alnair.common.tls import CA_FILE, CERT_FILE, KEY_FILE, issue, write_folder
from alnair.dev.localstack.controlplane import load_manifests, register_api_service, repo_root
from alnair.dev.localstack.procs import free_port
from alnair.dev.localstack.realnode import RealNode


@dataclass(frozen=True)
class StackInfo:
    """What a service's environment is built from."""

    dir: Path
    nodes: tuple[str, ...]
    real_node: Mapping[str, str] | None = None
    """The real node's name and folders (`make up WITH=realnode`), see `real_node_info`."""


REALNODE = "realnode"
"""`--with realnode`: a kubelet and containerd beside the KWOK nodes, with the device plugin."""


def real_node_info(node: RealNode) -> dict[str, str]:
    return {
        "name": node.name,
        "folder": str(node.folder),
        "device_plugins": str(node.device_plugin_dir),
        "kubelet": str(node.kubelet_dir),
        "cdi": str(node.cdi_dir),
    }


@dataclass(frozen=True)
class ServiceSpec:
    """One service process of the local stack."""

    name: str
    """Its name in logs, the state file and `make status` (a key of DEFAULT_HTTP_PORTS)."""
    argv: tuple[str, ...]
    """What follows `python -m`; the first item is the module that must exist."""
    port_env: str
    """The variable its settings read the HTTP port from."""
    summary: str
    optional: bool = False
    """Started only when named with `--with`."""
    env: Callable[[StackInfo], dict[str, str]] | None = None
    """Extra environment, from where the stack lives and its nodes."""
    after_ready: Callable[[str, Mapping[str, str]], None] | None = None
    """Run once it answers ready, with the stack's kubeconfig and the service's environment."""
    user: str = ""
    """The NATS and Redis user it connects as (empty: its name); a second replica of a
    service is that service's user, as a second pod of a Deployment is."""

    @property
    def account(self) -> str:
        return self.user or self.name

    @property
    def module(self) -> str:
        return self.argv[0]

    def available(self) -> bool:
        """Whether `python -m <module>` can run here (the module and, for a package, its
        `__main__`)."""
        try:
            spec = importlib.util.find_spec(self.module)
            if spec is None:
                return False
            if spec.submodule_search_locations is not None:
                return importlib.util.find_spec(f"{self.module}.__main__") is not None
        except ImportError:
            return False
        return True


def _deviceplugin_env(stack: StackInfo) -> dict[str, str]:
    if stack.real_node is not None:
        return _real_node_plugin_env(stack.real_node)
    # One plugin, for the first KWOK node, with the kubelet directory and the node's state
    # under the stack's folder: it serves its gRPC endpoints and device API, and keeps asking
    # for a kubelet that KWOK does not run (see docs/notes/issue-12.md), so its readiness does
    # not wait for a registration.
    root = (stack.dir / "deviceplugin").resolve()
    return {
        "ALNAIR_DEVICEPLUGIN_NODE_NAME": stack.nodes[0] if stack.nodes else "",
        "ALNAIR_DEVICEPLUGIN_KUBELET_DIR": str(root / "kubelet"),
        "ALNAIR_DEVICEPLUGIN_STATE_DIR": str(root / "state"),
        "ALNAIR_DEVICEPLUGIN_REGISTER_RETRY_MAX_S": "60",
        "ALNAIR_DEVICEPLUGIN_READY_WHEN_REGISTERED": "false",
    }


def _real_node_plugin_env(node: Mapping[str, str]) -> dict[str, str]:
    """The device plugin and the DRA plugin on the real node: its kubelet's folders, the shim
    built in native/intercept."""
    root = repo_root()
    shim = (root or Path.cwd()) / "native" / "intercept" / "build" / "libalnair-intercept.so"
    kubelet = Path(node["kubelet"])
    return {
        "ALNAIR_DEVICEPLUGIN_NODE_NAME": node["name"],
        "ALNAIR_DEVICEPLUGIN_MODE": "both",
        "ALNAIR_DEVICEPLUGIN_KUBELET_DIR": node["device_plugins"],
        "ALNAIR_DEVICEPLUGIN_STATE_DIR": str(Path(node["folder"]) / "alnair"),
        "ALNAIR_DEVICEPLUGIN_SHIM_HOST_PATH": str(shim),
        "ALNAIR_DEVICEPLUGIN_CDI_DIR": node["cdi"],
        "ALNAIR_DEVICEPLUGIN_DRA_PLUGINS_DIR": str(kubelet / "plugins"),
        "ALNAIR_DEVICEPLUGIN_DRA_REGISTRY_DIR": str(kubelet / "plugins_registry"),
        "ALNAIR_DEVICEPLUGIN_POD_RESOURCES_SOCKET": str(kubelet / "pod-resources" / "kubelet.sock"),
        "ALNAIR_DEVICEPLUGIN_REGISTER_RETRY_MAX_S": "5",
    }


def _secure_folder(stack: StackInfo, service: str, hosts: tuple[str, ...]) -> Path:
    """A service's serving certificate for the local stack, made again when it does not name
    every host (or is within a day of expiry)."""
    folder = (stack.dir / service / "tls").resolve()
    files = {
        name: (folder / name).read_bytes()
        for name in (CERT_FILE, KEY_FILE, CA_FILE)
        if (folder / name).exists()
    }
    if still_good(files, hosts, dt.timedelta(days=1)):
        write_folder(folder, issue(hosts).secret_data())
    return folder


def _query_service(service: str) -> str:
    """The ExternalName Service the local stack registers a service's query API behind."""
    return f"alnair-{service}-query"


def _hosts(service: str) -> tuple[str, ...]:
    """What the API server dials: 127.0.0.1 (webhooks, by URL) and, for the aggregator, the
    query Service's name."""
    return ("127.0.0.1", f"{_query_service(service)}.default.svc")


def _register_query_api(kubeconfig: str, service: str, group: str, port: str, ca: Path) -> None:
    """The service's aggregated API, registered by URL (`kubectl alnair`)."""

    ca_pem = ca.read_bytes()

    async def register() -> None:
        async with KubeClient.from_config(kubeconfig) as kube:
            await register_api_service(
                kube, group, QUERY_VERSION, int(port), ca_pem, service=_query_service(service)
            )

    asyncio.run(register())


def _dispatcher_env(stack: StackInfo) -> dict[str, str]:
    folder = _secure_folder(stack, "dispatcher", _hosts("dispatcher"))
    return {
        "ALNAIR_DISPATCHER_WEBHOOK_CERT_DIR": str(folder),
        "ALNAIR_DISPATCHER_WEBHOOK_PORT": str(free_port()),
    }


def _scheduler_env(stack: StackInfo) -> dict[str, str]:
    folder = _secure_folder(stack, "scheduler", _hosts("scheduler"))
    return {
        "ALNAIR_SCHEDULER_QUERY_CERT_DIR": str(folder),
        "ALNAIR_SCHEDULER_QUERY_PORT": str(free_port()),
    }


def _register_scheduler_query(kubeconfig: str, env: Mapping[str, str]) -> None:
    folder = Path(env["ALNAIR_SCHEDULER_QUERY_CERT_DIR"])
    _register_query_api(
        kubeconfig, "scheduler", SCHEDULER_GROUP, env["ALNAIR_SCHEDULER_QUERY_PORT"],
        folder / CA_FILE,
    )  # fmt: skip


def _register_dispatcher_webhook(kubeconfig: str, env: Mapping[str, str]) -> None:
    """The shipped webhook configurations, pointed at the dispatcher's port by URL, and its
    query API's APIService."""
    root = repo_root() or repo_root(Path(__file__))
    if root is None:
        print("dispatcher webhook not registered: deploy/kustomize is not here", file=sys.stderr)
        return
    shipped = root / "deploy" / "kustomize" / "base" / "dispatcher" / "webhook.yaml"
    configs = [d for d in load_manifests(shipped) if d["kind"].endswith("WebhookConfiguration")]
    folder = Path(env["ALNAIR_DISPATCHER_WEBHOOK_CERT_DIR"])
    bundle = base64.b64encode((folder / CA_FILE).read_bytes()).decode()
    base = f"https://127.0.0.1:{env['ALNAIR_DISPATCHER_WEBHOOK_PORT']}"
    for config in configs:
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{base}{path}", "caBundle": bundle}

    async def apply() -> None:
        async with KubeClient.from_config(kubeconfig) as kube:
            for config in configs:
                await kube.apply(config, field_manager="alnair-devstack")

    asyncio.run(apply())
    _register_query_api(
        kubeconfig, "dispatcher", DISPATCHER_GROUP, env["ALNAIR_DISPATCHER_WEBHOOK_PORT"],
        folder / CA_FILE,
    )  # fmt: skip


def _agent_env(stack: StackInfo) -> dict[str, str]:
    # The spool of pod summaries not yet published survives a kill, as on a node.
    return {"ALNAIR_PROFILER_STATE_DIR": str((stack.dir / "profiler-agent").resolve())}


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        "profiler-agent",
        ("alnair.profiler", "agent", "--backend", "sim"),
        "ALNAIR_PROFILER_HTTP_PORT",
        "simulated GPUs of every KWOK node: pod metrics, inventory, node labels",
        env=_agent_env,
    ),
    ServiceSpec(
        "aggregator",
        ("alnair.profiler", "aggregator"),
        "ALNAIR_PROFILER_HTTP_PORT",
        "per-job utilization annotations and execution records",
    ),
    ServiceSpec(
        "predictor",
        ("alnair.predictor",),
        "ALNAIR_PREDICTOR_HTTP_PORT",
        "runtime, peak memory and co-location slowdown per GPU type",
    ),
    ServiceSpec(
        "scheduler",
        ("alnair.scheduler",),
        "ALNAIR_SCHEDULER_HTTP_PORT",
        "binds pods with schedulerName: alnair; explains every decision",
        env=_scheduler_env,
        after_ready=_register_scheduler_query,
    ),
    ServiceSpec(
        "scheduler-standby",
        ("alnair.scheduler",),
        "ALNAIR_SCHEDULER_HTTP_PORT",
        "a second scheduler replica: follows the Lease and binds when the leader is gone",
        optional=True,
        env=_scheduler_env,
        user="scheduler",
    ),
    # Hooks: these start as soon as their `python -m` module exists.
    ServiceSpec(
        "dispatcher",
        ("alnair.scheduler.dispatcher",),
        "ALNAIR_DISPATCHER_HTTP_PORT",
        "job queue: admission, quotas, fair share; holds queued Jobs at creation (webhook)",
        env=_dispatcher_env,
        after_ready=_register_dispatcher_webhook,
    ),
    ServiceSpec(
        "elastic",
        ("alnair.elastic",),
        "ALNAIR_ELASTIC_HTTP_PORT",
        "ElasticJob controller",
    ),
    ServiceSpec(
        "deviceplugin",
        ("alnair.deviceplugin", "run"),
        "ALNAIR_DEVICEPLUGIN_HTTP_PORT",
        "kubelet device plugin: on the real node with WITH=realnode, else the first KWOK node "
        "(no kubelet: never registered)",
        optional=True,
        env=_deviceplugin_env,
    ),
)
SERVICE_NAMES = tuple(s.name for s in SERVICES)


def service(name: str) -> ServiceSpec:
    for spec in SERVICES:
        if spec.name == name:
            return spec
    raise ConfigError(f"unknown service {name!r} (known: {', '.join(SERVICE_NAMES)})", name=name)


# --- processes recorded in the state file ------------------------------------------------
