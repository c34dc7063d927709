"""OCI images assembled on this machine, with no registry and no image builder: a layout
tarball (`oci-layout`, `index.json`, blobs) that `ctr images import` reads. The real node's
pause image and the test images are built this way from files already on disk."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from alnair.common.errors import ConfigError

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass(frozen=True)
class ImageFile:
    """One file of the image: its bytes come from `source` (a path on this machine)."""

    source: Path
    mode: int = 0o755


@dataclass(frozen=True)
class ImageSpec:
    name: str
    """The reference it is imported under, e.g. `localhost/alnair/pause:1`."""
    files: Mapping[str, ImageFile]
    """Absolute paths in the image's filesystem."""
    entrypoint: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def _layer(files: Mapping[str, ImageFile]) -> tuple[bytes, str]:
    """The gzipped layer and the digest of its uncompressed tar (the config's diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for path in sorted(files):
            if not path.startswith("/"):
                raise ConfigError(f"image path {path!r} is not absolute", path=path)
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder not in made:
                    made.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            item = files[path]
            try:
                data = item.source.read_bytes()
            except OSError as exc:
                raise ConfigError(
                    f"the image file {item.source} cannot be read: {exc}", path=str(item.source)
                ) from exc
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), item.mode
            tar.addfile(info, io.BytesIO(data))
    plain = raw.getvalue()
    return gzip.compress(plain, mtime=0), "sha256:" + hashlib.sha256(plain).hexdigest()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def write_layout(spec: ImageSpec, dest: Path, arch: str = "amd64") -> Path:
    """The image as an OCI layout tarball at `dest`."""
    layer, diff_id = _layer(spec.files)
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": list(spec.entrypoint),
            "Env": [f"{k}={v}" for k, v in spec.env.items()],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(dest, "w") as tar:
        layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
        info = tarfile.TarInfo("oci-layout")
        info.size = len(layout)
        tar.addfile(info, io.BytesIO(layout))
        config_bytes = json.dumps(config).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": _blob(tar, config_bytes),
                "size": len(config_bytes),
            },
            "layers": [{"mediaType": MEDIA_LAYER, "digest": _blob(tar, layer), "size": len(layer)}],
        }
        manifest_bytes = json.dumps(manifest).encode()
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _blob(tar, manifest_bytes),
                    "size": len(manifest_bytes),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": spec.name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
        index_bytes = json.dumps(index).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(index_bytes)
        tar.addfile(info, io.BytesIO(index_bytes))
    return dest
