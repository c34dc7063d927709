"""Worker clusters of the multi-cluster hub: registered as Secrets, watched, judged reachable.

A worker cluster is a Secret in the hub's namespace labelled `alnair.io/worker-cluster: "true"`
whose data key `kubeconfig` holds a kubeconfig for it, with annotations for its name
(`alnair.io/cluster-name`, default: the Secret's name), region (`alnair.io/region`) and the link
bandwidth from where the jobs' data lives (`alnair.io/link-bandwidth-mbps`). A bad Secret is
reported (the hub's status API and metrics name the field), never fatal. The kubeconfig must
be self-contained: a server, inline certificates, a token (`kubectl config view --flatten
--minify` writes one). Commands, files of the dispatcher's, skipped TLS verification and
proxies are refused.

For each worker the hub runs informers against its API server: GPU nodes, and per kind it
places (`kinds.DELEGABLE`) the copies it made there (label `alnair.io/origin-uid`). They are
its live view (GPU models, free GPUs, backlog, which images and datasets it already holds)
and nothing polls. A kind from another project that the worker does not serve (its list
answers 404) is not placed there; installing it there later takes updating the worker's
Secret (or a restart of the hub). A worker whose list or
watch keeps failing (unreachable, 401/403) for longer than the grace period is *lost*: the
informers' own retries (exponential back-off, at most `retry_max_s`) are the events that tell
the hub, so a loss is seen within one back-off of the grace period ending.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alnair.common.errors import ConfigError, InvalidValueError
from alnair.common.informer import Informer, WatchEvent
from alnair.common.kube import NODES, ApiError, KubeClient, Obj, Resource
from alnair.common.kubeconfig import KubeConfig
from alnair.common.tasks import spawn
from alnair.scheduler.dispatcher.kinds import JOB
from alnair.scheduler.dispatcher.parsing import node_gpus
from alnair.scheduler.dispatcher.workload_kind import WorkloadKind

log = logging.getLogger(__name__)

SECRETS = Resource("", "v1", "secrets")
LABEL_WORKER = "alnair.io/worker-cluster"
ANN_CLUSTER_NAME = "alnair.io/cluster-name"
ANN_REGION = "alnair.io/region"
ANN_BANDWIDTH = "alnair.io/link-bandwidth-mbps"
SECRET_KEY = "kubeconfig"  # noqa: S105 (a data key, not a secret)
LABEL_ORIGIN = "alnair.io/origin-uid"
"""On a copy (a mirror): the uid of the hub's workload it mirrors."""
ANN_ORIGIN = "alnair.io/origin"
"""On a mirror: `<hub cluster>/<namespace>/<name>` of the hub's workload."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker cluster as its Secret declares it."""

    name: str
    secret: str
    region: str
    bandwidth_mbps: float
    kubeconfig: str
    resource_version: str


def parse_worker_secret(obj: Obj) -> WorkerConfig:
    """A worker Secret, or an `InvalidValueError` naming the bad field."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    name = annotations.get(ANN_CLUSTER_NAME) or meta["name"]
    if "/" in name or not name.strip():
        raise InvalidValueError(f"annotations.{ANN_CLUSTER_NAME}", name, "a name without '/'")
    raw_bw = annotations.get(ANN_BANDWIDTH)
    if raw_bw is None:
        raise InvalidValueError(f"annotations.{ANN_BANDWIDTH}", None, "required (Mbit/s)")
    try:
        bandwidth = float(raw_bw)
    except ValueError:
        raise InvalidValueError(f"annotations.{ANN_BANDWIDTH}", raw_bw, "not a number") from None
    if not (bandwidth > 0 and math.isfinite(bandwidth)):
        raise InvalidValueError(f"annotations.{ANN_BANDWIDTH}", raw_bw, "must be > 0")
    data = (obj.get("data") or {}).get(SECRET_KEY)
    if not data:
        raise InvalidValueError(f"data.{SECRET_KEY}", None, "the worker's kubeconfig is missing")
    try:
        text = base64.b64decode(data, validate=True).decode()
        doc = yaml.safe_load(text)
    except (ValueError, UnicodeDecodeError, yaml.YAMLError):
        raise InvalidValueError(f"data.{SECRET_KEY}", "<bytes>", "not a kubeconfig") from None
    if not isinstance(doc, dict) or not doc.get("clusters"):
        raise InvalidValueError(f"data.{SECRET_KEY}", "<yaml>", "a kubeconfig has clusters")
    _refuse_unsafe(doc)
    return WorkerConfig(
        name=name,
        secret=meta["name"],
        region=annotations.get(ANN_REGION, ""),
        bandwidth_mbps=bandwidth,
        kubeconfig=text,
        resource_version=str(meta.get("resourceVersion", "")),
    )


_UNSAFE_USER = {
    "exec": "runs a command inside the dispatcher",
    "auth-provider": "runs a provider plugin inside the dispatcher",
    "tokenFile": "reads a file of the dispatcher's (its own token, say) and sends it away",
    "client-certificate": "reads a file of the dispatcher's: inline it (client-certificate-data)",
    "client-key": "reads a file of the dispatcher's: inline it (client-key-data)",
    "username": "basic authentication is not accepted",
}
_UNSAFE_CLUSTER = {
    "certificate-authority": "reads a file of the dispatcher's: inline it "
    "(certificate-authority-data)",
    "proxy-url": "sends the worker's credentials through a proxy",
}


def _refuse_unsafe(doc: Obj) -> None:
    """A worker kubeconfig comes from whoever may write Secrets in the hub's namespace: it may
    only name a server, inline certificates and a token. Anything that would run a command,
    read the dispatcher's own files (its ServiceAccount token among them), skip TLS
    verification or route the credentials elsewhere is refused, naming the field."""
    for i, entry in enumerate(doc.get("users") or []):
        user = (entry or {}).get("user") or {}
        for key, why in _UNSAFE_USER.items():
            if key in user:
                where = f"data.{SECRET_KEY} users[{i}].user.{key}"
                raise InvalidValueError(where, "<set>", f"not accepted: it {why}")
    for i, entry in enumerate(doc.get("clusters") or []):
        cluster = (entry or {}).get("cluster") or {}
        if cluster.get("insecure-skip-tls-verify"):
            where = f"data.{SECRET_KEY} clusters[{i}].cluster.insecure-skip-tls-verify"
            raise InvalidValueError(
                where, True, "not accepted: the worker's credentials would go unverified"
            )
        for key, why in _UNSAFE_CLUSTER.items():
            if key in cluster:
                where = f"data.{SECRET_KEY} clusters[{i}].cluster.{key}"
                raise InvalidValueError(where, "<set>", f"not accepted: it {why}")


def client_for(config: WorkerConfig, timeout_s: float) -> KubeClient:
    """A client from the Secret's kubeconfig (written to a private file only while it is read;
    embedded certificates end up in private temporary files, as for any kubeconfig)."""
    folder = tempfile.mkdtemp(prefix="alnair-worker-")
    path = Path(folder) / "kubeconfig"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config.kubeconfig)
        try:
            loaded = KubeConfig.load(str(path))
        except ConfigError as exc:
            raise InvalidValueError(f"data.{SECRET_KEY}", "<yaml>", str(exc)) from None
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
            os.rmdir(folder)
    return KubeClient(loaded, timeout_s=timeout_s)


class Worker:
    """One worker cluster: its client, its informers, whether it answers."""

    def __init__(
        self,
        config: WorkerConfig,
        on_change: Callable[[], None],
        *,
        grace_s: float,
        retry_max_s: float,
        timeout_s: float = 10.0,
        kinds: Iterable[WorkloadKind] = (),
    ) -> None:
        self.config = config
        self.grace_s = grace_s
        self.kube = client_for(config, timeout_s)
        self.nodes = Informer(
            self.kube,
            NODES,
            name=f"{config.name}.nodes",
            on_health=on_change,
            max_backoff_s=retry_max_s,
            stale_after_s=grace_s,
        )
        self.mirrors: dict[str, Informer] = {
            kind.kind: Informer(
                self.kube,
                kind.resource,
                label_selector=LABEL_ORIGIN,
                name=f"{config.name}.{kind.resource.plural}",
                on_health=on_change,
                optional=kind.optional,
                max_backoff_s=retry_max_s,
                stale_after_s=grace_s,
            )
            for kind in (JOB, *kinds)
        }
        self.created = time.monotonic()
        self._tasks: list[Any] = []
        for informer in self.mirrors.values():
            informer.add_handler(lambda *_: on_change())

        def on_node(event: WatchEvent, obj: Obj, old: Obj | None) -> None:
            # Heartbeats and unrelated changes leave the GPU pool as it was: no reconcile.
            if old is None or event is not WatchEvent.MODIFIED or node_gpus(obj) != node_gpus(old):
                on_change()

        self.nodes.add_handler(on_node)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def jobs(self) -> Informer:
        """The Jobs mirrored here."""
        return self.mirrors[JOB.kind]

    def _informers(self) -> tuple[Informer, ...]:
        return (self.nodes, *self.mirrors.values())

    def serves(self, kind: str) -> bool:
        """Whether the worker serves `kind` (known once its watch listed it)."""
        informer = self.mirrors.get(kind)
        return informer is not None and informer.synced.is_set() and not informer.unserved

    def mirrored(self) -> Iterator[tuple[str, Obj]]:
        """Every mirror here, with its kind."""
        for kind, informer in self.mirrors.items():
            for obj in informer.values():
                yield kind, obj

    def start(self) -> None:
        for informer in self._informers():
            self._tasks.append(spawn(informer.run(), name=f"hub.worker.{informer.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        await self.kube.close()

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers())

    def failing_for_s(self, now: float | None = None) -> float:
        """How long the worker has not answered (0 when both watches work)."""
        now = time.monotonic() if now is None else now
        starts = [i.failing_since for i in self._informers() if i.failing_since is not None]
        if not starts:
            return 0.0
        return now - min(starts)

    @property
    def lost(self) -> bool:
        """Not answering for longer than the grace period (or never, since registered)."""
        return self.failing_for_s() > self.grace_s

    @property
    def reachable(self) -> bool:
        """Synced and answering: new jobs may go here, and what it says is current."""
        return self.synced and self.failing_for_s() == 0.0

    @property
    def problem(self) -> str | None:
        """`unauthorized: ...` or `unreachable: ...` while failing; None otherwise."""
        for informer in self._informers():
            exc = informer.last_exception
            if informer.failing_since is None or exc is None:
                continue
            if isinstance(exc, ApiError) and exc.status in (401, 403):
                return f"unauthorized: {exc}"
            return f"unreachable: {exc}"
        return None


class WorkerSet:
    """The worker clusters, one per labelled Secret in the hub's namespace: made when a Secret
    appears, made again when it changes, stopped when it goes. A Secret that does not parse (a
    CA file that does not exist, a certificate that does not parse, a name another Secret
    gives) is kept in `invalid` with its reason: reported, never fatal."""

    def __init__(
        self,
        on_change: Callable[[], None],
        *,
        grace_s: float,
        kinds: Callable[[], Iterable[WorkloadKind]],
    ) -> None:
        self.on_change = on_change
        self.grace_s = grace_s
        self.kinds = kinds
        self.workers: dict[str, Worker] = {}
        self.invalid: dict[str, str] = {}
        self._stopping: list[asyncio.Task[None]] = []

    def on_secret(self, event: WatchEvent, obj: Obj, old: Obj | None) -> None:
        secret = obj["metadata"]["name"]
        for name, worker in list(self.workers.items()):
            if worker.config.secret == secret:
                if event is not WatchEvent.DELETED and worker.config.resource_version == str(
                    obj["metadata"].get("resourceVersion", "")
                ):
                    return
                del self.workers[name]
                self._stopping = [task for task in self._stopping if not task.done()]
                self._stopping.append(spawn(worker.stop(), name=f"hub.worker.{name}.stop"))
        self.invalid.pop(secret, None)
        if event is not WatchEvent.DELETED:
            try:
                config = parse_worker_secret(obj)
                if config.name in self.workers:
                    raise InvalidValueError(
                        "alnair.io/cluster-name", config.name, "another Secret names it"
                    )
                worker = Worker(
                    config,
                    self.on_change,
                    grace_s=self.grace_s,
                    retry_max_s=min(5.0, max(0.5, self.grace_s)),
                    kinds=self.kinds(),
                )
            except (InvalidValueError, ConfigError, OSError, ValueError) as exc:
                log.warning("worker Secret refused", extra={"secret": secret, "error": str(exc)})
                self.invalid[secret] = str(exc)
            else:
                self.workers[config.name] = worker
                worker.start()
        self.on_change()

    async def stop(self) -> None:
        for worker in list(self.workers.values()):
            await worker.stop()
        self.workers.clear()
        for task in self._stopping:
            with contextlib.suppress(BaseException):
                await task
        self._stopping.clear()
