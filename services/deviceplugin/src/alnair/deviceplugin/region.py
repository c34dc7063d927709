"""Reads the per-container accounting region that the intercept shim writes.

The layout is fixed by `native/intercept/src/shim.h` (`alnair_region`): a 64-byte header, 16
device records of eight little-endian uint64 counters, then 256 process slots of 144 bytes.
The registry reads it when Prometheus scrapes, so usage needs no reporting loop in the shim;
a torn read of counters being updated is harmless (each counter is one aligned word).
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from alnair.common.errors import InvalidValueError

MAGIC: Final = 0x524E4C41
VERSION: Final = 1
MAX_DEVICES: Final = 16
MAX_PROCS: Final = 256
_HEADER = struct.Struct("<IIIIQ40x")
_DEVICE = struct.Struct("<8Q")
_SLOT = struct.Struct("<iiQ16Q")
SIZE: Final = _HEADER.size + MAX_DEVICES * _DEVICE.size + MAX_PROCS * _SLOT.size


@dataclass(frozen=True)
class DeviceUsage:
    limit_bytes: int
    used_bytes: int
    peak_bytes: int
    oom_count: int
    compute_pct: int
    launches: int
    throttled_ns: int


@dataclass(frozen=True)
class RegionSnapshot:
    registered: int
    """Processes that ever attached."""
    live_pids: tuple[int, ...]
    """Processes holding a slot: live ones, and exited ones until a neighbour reclaims them."""
    devices: tuple[DeviceUsage, ...]

    def device(self, index: int) -> DeviceUsage:
        return self.devices[index]


def parse(raw: bytes) -> RegionSnapshot:
    """Decode a region; InvalidValueError if it is not one (wrong size, magic or version)."""
    if len(raw) < SIZE:
        raise InvalidValueError("region", f"{len(raw)} bytes", f"shorter than {SIZE} bytes")
    magic, version, _max_dev, _max_procs, registered = _HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise InvalidValueError("region magic", hex(magic), f"expected {hex(MAGIC)}")
    if version != VERSION:
        raise InvalidValueError("region version", version, f"this reader knows {VERSION}")
    devices = []
    off = _HEADER.size
    for _ in range(MAX_DEVICES):
        limit, used, peak, ooms, pct, launches, throttled, _r = _DEVICE.unpack_from(raw, off)
        devices.append(DeviceUsage(limit, used, peak, ooms, pct, launches, throttled))
        off += _DEVICE.size
    pids = []
    for _ in range(MAX_PROCS):
        pid = _SLOT.unpack_from(raw, off)[0]
        if pid > 0:
            pids.append(pid)
        off += _SLOT.size
    return RegionSnapshot(registered, tuple(pids), tuple(devices))


def read(path: Path) -> RegionSnapshot | None:
    """The region at `path`, or None while no process of the container has created it.

    The file lives in a directory the container writes, so it is read as untrusted input: a
    symlink is not followed (it could point at any file of the node), anything but a regular
    file is refused (a FIFO would block the plugin), and no more than the region's size is
    read (a huge file cannot exhaust the plugin's memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise InvalidValueError("region", str(path), f"not a plain file ({exc.strerror})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidValueError("region", str(path), "not a regular file")
        raw = os.read(fd, SIZE)
    finally:
        os.close(fd)
    return parse(raw)


def build(
    devices: dict[int, DeviceUsage] | None = None, pids: tuple[int, ...] = (), registered: int = 0
) -> bytes:
    """A region image (tests, and tools that want to show the format)."""
    out = bytearray(SIZE)
    _HEADER.pack_into(out, 0, MAGIC, VERSION, MAX_DEVICES, MAX_PROCS, registered)
    for index, usage in (devices or {}).items():
        _DEVICE.pack_into(
            out,
            _HEADER.size + index * _DEVICE.size,
            usage.limit_bytes,
            usage.used_bytes,
            usage.peak_bytes,
            usage.oom_count,
            usage.compute_pct,
            usage.launches,
            usage.throttled_ns,
            0,
        )
    base = _HEADER.size + MAX_DEVICES * _DEVICE.size
    for i, pid in enumerate(pids):
        _SLOT.pack_into(out, base + i * _SLOT.size, pid, 0, 1, *([0] * 16))
    return bytes(out)
