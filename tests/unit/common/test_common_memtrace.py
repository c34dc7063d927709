"""Memory debugging (`alnair.common.memtrace`): figures and a tracemalloc snapshot at start and
on SIGUSR1, and the comparison that names the allocation site that grew."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from alnair.common.errors import InvalidValueError
from alnair.common.memtrace import growth, install, memory_figures

kept: list[bytes] = []


def grow() -> None:
    kept.extend(bytes(1024) for _ in range(2000))  # ~2 MiB, one site


def files(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.glob(pattern))


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield
    tracemalloc.stop()
    kept.clear()


async def test_dumps_on_sigusr1_and_names_the_site_that_grew(tmp_path: Path, cleanup: None) -> None:
    install(tmp_path, 8, "svc")
    grow()
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(100):  # the handler runs on the loop
        if len(files(tmp_path, "*.tracemalloc")) == 2:
            break
        await asyncio.sleep(0.02)
    asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
    snaps = files(tmp_path, "*.tracemalloc")
    figures = files(tmp_path, "*.json")
    assert [p.name for p in snaps] == [
        f"svc-{os.getpid()}-000.tracemalloc",
        f"svc-{os.getpid()}-001.tracemalloc",
    ]
    assert len(figures) == 2
    later = json.loads(figures[1].read_text())
    assert later["rss_bytes"] > 0 and later["gc_objects"] > 0
    assert later["traced_bytes"] >= 2000 * 1024

    report = growth(snaps[0], snaps[1], top=3)
    assert report[0].startswith("traced:")
    top_site = "\n".join(report[1:])
    assert "test_common_memtrace.py" in top_site and "bytes(1024)" in top_site


def test_figures_without_tracing() -> None:
    figures = memory_figures()
    assert figures["rss_bytes"] > 0
    assert figures["gc_types"] and all(n > 0 for n in figures["gc_types"].values())
    if "malloc" in figures:  # glibc >= 2.33
        assert figures["malloc"]["in_use"] > 0


async def test_negative_frames_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="frames"):
        install(tmp_path, -1, "svc")
