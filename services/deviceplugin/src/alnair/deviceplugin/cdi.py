"""CDI (Container Device Interface) spec files: how a prepared claim reaches its containers.

The kubelet hands the runtime the CDI device names NodePrepareResources returned; the runtime
(containerd, CRI-O) finds them in spec files under /var/run/cdi and applies their container
edits: environment, mounts. One spec file per claim (`gpu.alnair.io-claim_<uid>.json`), one
CDI device per allocated device, so unpreparing a claim is removing one file. Files are
written to a temporary name and renamed, so a runtime never reads half a spec.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from alnair.common import dra
from alnair.deviceplugin.allocation import Grant

CDI_VERSION: Final = "0.6.0"
CDI_CLASS: Final = "gpu"
CDI_KIND: Final = f"{dra.DRIVER}/{CDI_CLASS}"


def device_id(name: str) -> str:
    """The fully qualified CDI device name the runtime resolves (`vendor/class=name`)."""
    return f"{CDI_KIND}={name}"


def cdi_name(claim_uid: str, request: str, device: str) -> str:
    # CDI names allow letters, digits, '_', '.', '-'; sub-requests are "request/sub"
    return f"{claim_uid}-{request.replace('/', '_')}-{device}"


def container_edits(grant: Grant) -> dict[str, Any]:
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(grant.envs.items())]}
    if grant.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in grant.mounts
        ]
    return edits


def claim_spec(claim_uid: str, devices: Sequence[tuple[str, Grant]]) -> dict[str, Any]:
    """The spec of one claim: `devices` are (CDI name, grant) pairs."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {"gpu.alnair.io/claim-uid": claim_uid},
        "devices": [{"name": name, "containerEdits": container_edits(g)} for name, g in devices],
    }


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{dra.DRIVER}-claim_{claim_uid}.json"


def write_spec(cdi_dir: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(cdi_dir, claim_uid)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(spec, indent=2, sort_keys=True))
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return path


def remove_spec(cdi_dir: Path, claim_uid: str) -> bool:
    """Remove a claim's spec; False when there was none (already unprepared)."""
    with contextlib.suppress(FileNotFoundError):
        spec_path(cdi_dir, claim_uid).unlink()
        return True
    return False
