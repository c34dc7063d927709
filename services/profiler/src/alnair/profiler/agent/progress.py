"""Reading each pod's training progress on the node (`alnair.common.progress` for the sources).

Once per sample period, for every pod that can say something:
- a pod annotated `alnair.io/progress-metrics` is scraped at its pod IP (one short GET, 1 s
  timeout; a failure is logged once per pod and the next source tried);
- a pod of a namespace the platform opted in (`progress_log_namespaces`) has the tail of its
  newest container log file read under the node's log root (`/var/log/pods`, as a log
  shipper reads it); only the matches of the pattern leave the node, never log text;
- the pod's own progress annotations.

The first source that yields a step wins. Nothing here asks the API server: the pod watch
that already feeds the agent brings the annotations and the pod IP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from alnair.common import progress as pr
from alnair.common.progress import Progress

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of a log file is read per sample."""


@dataclass(frozen=True, slots=True)
class ProgressSpec:
    """What a pod offers to read its progress from."""

    namespace: str
    name: str
    uid: str
    ip: str = ""
    metrics: str = ""
    """`<port>[/<path>]` from the annotation, "" when none."""
    log_pattern: str = ""
    annotated: Progress | None = None

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> ProgressSpec:
        """What `pod` offers (its annotations and address)."""
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            ip=str((pod.get("status") or {}).get("podIP") or ""),
            metrics=str(ann.get(pr.ANN_METRICS) or ""),
            log_pattern=str(ann.get(pr.ANN_LOG_PATTERN) or ""),
            annotated=pr.from_annotations(ann),
        )


def metrics_url(spec: ProgressSpec) -> str | None:
    """Where the pod's progress metrics are; None without an address or with a bad value."""
    if not spec.metrics or not spec.ip:
        return None
    port, _, path = spec.metrics.partition("/")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = f"[{spec.ip}]" if ":" in spec.ip else spec.ip
    return f"http://{host}:{int(port)}/{path or 'metrics'}"


def newest_log(root: Path, spec: ProgressSpec) -> Path | None:
    """The pod's most recently written container log file under the kubelet's layout
    (`<root>/<namespace>_<name>_<uid>/<container>/<n>.log`)."""
    folder = root / f"{spec.namespace}_{spec.name}_{spec.uid}"
    try:
        files = [p for p in folder.glob("*/*.log") if p.is_file()]
    except OSError:
        return None
    return max(files, key=lambda p: p.stat().st_mtime, default=None)


def tail_lines(path: Path, size: int = LOG_TAIL_BYTES) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(0, 2)
        end = handle.tell()
        handle.seek(max(0, end - size))
        data = handle.read()
    return data.decode("utf-8", errors="replace").splitlines()


class ProgressReader:
    def __init__(
        self,
        log_root: Path = Path("/var/log/pods"),
        log_namespaces: frozenset[str] = frozenset(),
        timeout_s: float = 1.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.log_root = log_root
        self.log_namespaces = log_namespaces
        self.client = client or httpx.AsyncClient(timeout=timeout_s)
        self._complained: set[tuple[str, str]] = set()

    async def close(self) -> None:
        await self.client.aclose()

    def _once(self, spec: ProgressSpec, what: str, message: str, **extra: Any) -> None:
        if (spec.uid, what) not in self._complained:
            self._complained.add((spec.uid, what))
            log.warning(message, extra={"pod": f"{spec.namespace}/{spec.name}", **extra})

    def forget(self, uid: str) -> None:
        self._complained = {k for k in self._complained if k[0] != uid}

    async def _metric(self, spec: ProgressSpec) -> Progress | None:
        url = metrics_url(spec)
        if url is None:
            if spec.metrics and spec.ip:
                self._once(spec, "metrics", "progress metrics annotation not understood",
                           value=spec.metrics)  # fmt: skip
            return None
        try:
            reply = await self.client.get(url)
            reply.raise_for_status()
        except httpx.HTTPError as exc:
            self._once(spec, "metrics", "progress metrics not readable", url=url, error=str(exc))
            return None
        return pr.from_metrics(reply.text)

    def _log(self, spec: ProgressSpec) -> Progress | None:
        if spec.namespace not in self.log_namespaces:
            return None
        try:
            pattern = pr.log_pattern(spec.log_pattern)
        except ValueError as exc:
            self._once(spec, "pattern", "progress log pattern refused", error=str(exc))
            return None
        path = newest_log(self.log_root, spec)
        if path is None:
            return None
        try:
            lines = tail_lines(path)
        except OSError as exc:
            self._once(spec, "log", "pod log not readable", path=str(path), error=str(exc))
            return None
        return pr.from_log(lines, pattern)

    async def read(self, spec: ProgressSpec) -> Progress | None:
        """The pod's progress from the first source that has it (module docstring)."""
        if spec.metrics:
            found = await self._metric(spec)
            if found is not None:
                return found
        if spec.namespace in self.log_namespaces:
            found = await asyncio.to_thread(self._log, spec)
            if found is not None:
                return found
        return spec.annotated

    async def read_all(self, specs: Mapping[str, ProgressSpec]) -> dict[str, Progress]:
        """Every pod's progress, read side by side; pods with none are left out."""
        uids = list(specs)
        found = await asyncio.gather(*(self.read(specs[u]) for u in uids))
        return {u: p for u, p in zip(uids, found, strict=True) if p is not None}
