"""The local API server's audit log: what it records and how a test reads it.

The policy records, at `Metadata` level, the two writes that prove leadership holds: each
Binding a scheduler sends (`pods/binding` create) and each write of a Lease outside
`kube-node-lease` (the electors' renewals; KWOK's node heartbeats would drown them). Nothing
else is recorded, so the log stays small through a whole test session. The API server writes
each event at `ResponseComplete` with its own clock, before it answers (the log backend's
default blocking mode), so an event's time is when the write took effect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "namespaces": ["kube-node-lease"]},
        {
            "level": "Metadata",
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["pods/binding"]}],
        },
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        {"level": "None"},
    ],
}


def write_policy(path: Path) -> Path:
    path.write_text(yaml.safe_dump(POLICY, sort_keys=False), encoding="utf-8")
    return path


@dataclass(frozen=True)
class AuditEvent:
    """One recorded request, completed."""

    verb: str
    resource: str
    """`pods/binding`, `leases`."""
    namespace: str
    name: str
    user_agent: str
    code: int
    at: datetime
    """When the API server completed it (`stageTimestamp`)."""

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


def read_events(path: Path) -> list[AuditEvent]:
    """The log's completed requests, in the order written (empty while none was recorded)."""
    if not path.exists():
        return []
    events: list[AuditEvent] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        if raw.get("stage") != "ResponseComplete":
            continue
        ref = raw.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        events.append(
            AuditEvent(
                verb=raw.get("verb", ""),
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                user_agent=raw.get("userAgent", ""),
                code=int((raw.get("responseStatus") or {}).get("code", 0)),
                at=datetime.fromisoformat(raw["stageTimestamp"].replace("Z", "+00:00")),
            )
        )
    return events


__all__ = ["POLICY", "AuditEvent", "read_events", "write_policy"]
