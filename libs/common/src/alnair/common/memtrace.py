"""Where a service's memory goes, for finding leaks in a soak; off unless asked for.

`install(directory, frames, name)` (a service calls it when its `tracemalloc_dir` setting is
set) writes, at once and then each time the process receives SIGUSR1,
`<directory>/<name>-<pid>-<n>.json`: resident memory, what glibc's allocator holds
(`mallinfo2`: bytes in use, bytes free but kept, mmapped), live Python objects (the 40 most
numerous types tracked by the garbage collector) and threads; and
with `frames` > 0 it also traces Python allocations keeping that many frames each and writes the
snapshot beside it (`<...>.tracemalloc`). Tracing costs CPU and memory (and its interned
tracebacks grow while it runs, so RSS under tracing is not the service's own), which is why
nothing is traced by default and frames 0 only counts.

`python -m alnair.common.memtrace OLD NEW [--top N] [--frames N]` prints, largest growth first,
the allocation sites (grouped by traceback) whose live size grew between two snapshots, with
the total traced size of each. Only the Python heap is traced: memory the allocator keeps after
frees (fragmentation) or that C libraries (OpenSSL) allocate shows as RSS beyond `in_use`, or
as `free_kept` in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import gc
import itertools
import json
import logging
import os
import signal
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from alnair.common.errors import InvalidValueError

log = logging.getLogger(__name__)


def install(directory: Path, frames: int, name: str) -> None:
    """Dump memory figures (and with `frames` > 0 a tracemalloc snapshot) at once and on
    SIGUSR1; call inside the running loop."""
    if frames < 0:
        raise InvalidValueError("frames", frames, "0 (count only) or more frames to trace")
    directory.mkdir(parents=True, exist_ok=True)
    if frames and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    seq = itertools.count()

    def dump() -> None:
        stem = directory / f"{name}-{os.getpid()}-{next(seq):03d}"
        figures = memory_figures()
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(f"{stem}.tracemalloc")
            figures["traced_bytes"] = tracemalloc.get_traced_memory()[0]
        Path(f"{stem}.json").write_text(json.dumps(figures))
        log.warning("memory figures written", extra={"path": f"{stem}.json"})

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)
    log.warning("memory debugging on", extra={"dir": str(directory), "frames": frames})
    dump()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (field, ctypes.c_size_t)
        for field in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def memory_figures() -> dict[str, Any]:
    """RSS, glibc's heap (when this is glibc 2.33+), Python objects and threads, now."""
    objects = gc.get_objects()
    types = collections.Counter(type(o).__qualname__ for o in objects)
    figures: dict[str, Any] = {
        "time": time.time(),
        "rss_bytes": _rss_bytes(),
        "gc_objects": len(objects),
        "gc_types": dict(types.most_common(40)),
        "threads": threading.active_count(),
    }
    del objects
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        figures["malloc"] = {
            "in_use": info.uordblks + info.hblkhd,
            "free_kept": info.fordblks,
            "arena": info.arena,
            "mmapped": info.hblkhd,
        }
    return figures


def _rss_bytes() -> int:
    """Resident memory of this process (0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def growth(old: Path, new: Path, top: int = 25, frames: int = 12) -> list[str]:
    """The `top` allocation sites whose size grew most from `old` to `new`, as text."""
    filters = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    ]
    a = tracemalloc.Snapshot.load(str(old)).filter_traces(filters)
    b = tracemalloc.Snapshot.load(str(new)).filter_traces(filters)
    total_a = sum(s.size for s in a.statistics("filename"))
    total_b = sum(s.size for s in b.statistics("filename"))
    lines = [f"traced: {total_a / 2**20:.1f} MiB -> {total_b / 2**20:.1f} MiB"]
    for stat in b.compare_to(a, "traceback")[:top]:
        lines.append(
            f"{stat.size_diff / 2**10:+.1f} KiB ({stat.count_diff:+d} blocks), "
            f"now {stat.size / 2**10:.1f} KiB in {stat.count} blocks"
        )
        lines.extend(f"    {line}" for line in stat.traceback.format(limit=frames))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="growth between two tracemalloc snapshots")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--frames", type=int, default=12, help="frames shown per site")
    args = p.parse_args(argv)
    print("\n".join(growth(args.old, args.new, args.top, args.frames)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
