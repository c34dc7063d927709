"""The inotify directory watch: event decoding, and real events from a temporary directory."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

from alnair.deviceplugin import fswatch


def event(mask: int, name: str = "", pad: int = 16) -> bytes:
    raw = name.encode().ljust(pad if name else 0, b"\0")
    return struct.pack("iIII", 1, mask, 0, len(raw)) + raw


def test_parse_events_reads_each_struct_and_its_padded_name() -> None:
    buffer = (
        event(fswatch.IN_CREATE, "kubelet.sock")
        + event(fswatch.IN_DELETE, "alnair-gpu.sock", pad=32)
        + event(fswatch.IN_Q_OVERFLOW)
    )
    assert fswatch.parse_events(buffer) == [
        (fswatch.IN_CREATE, "kubelet.sock"),
        (fswatch.IN_DELETE, "alnair-gpu.sock"),
        (fswatch.IN_Q_OVERFLOW, ""),
    ]
    assert fswatch.parse_events(buffer[:10]) == []  # a torn header is not an event


def test_classify_masks() -> None:
    assert fswatch.classify(fswatch.IN_CREATE) == fswatch.CREATED
    assert fswatch.classify(fswatch.IN_MOVED_TO) == fswatch.CREATED
    assert fswatch.classify(fswatch.IN_DELETE) == fswatch.DELETED
    assert fswatch.classify(fswatch.IN_MOVED_FROM) == fswatch.DELETED
    assert fswatch.classify(fswatch.IN_Q_OVERFLOW) == fswatch.OVERFLOW
    assert fswatch.classify(0x1) is None  # IN_ACCESS: not watched for


async def test_directory_watch_sees_sockets_and_files_come_and_go(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    arrived = asyncio.Event()

    def record(what: str, name: str) -> None:
        seen.append((what, name))
        arrived.set()

    watch = fswatch.DirectoryWatch(tmp_path, record)
    watch.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(tmp_path / "kubelet.sock"))
        (tmp_path / "kubelet.sock").unlink()
        (tmp_path / "a").write_text("x")
        os.rename(tmp_path / "a", tmp_path / "b")
        expected = [
            (fswatch.CREATED, "kubelet.sock"),
            (fswatch.DELETED, "kubelet.sock"),
            (fswatch.CREATED, "a"),
            (fswatch.DELETED, "a"),
            (fswatch.CREATED, "b"),
        ]
        async with asyncio.timeout(5):
            while len(seen) < len(expected):
                arrived.clear()
                await arrived.wait()
        assert seen == expected
    finally:
        watch.close()
    watch.close()  # idempotent
