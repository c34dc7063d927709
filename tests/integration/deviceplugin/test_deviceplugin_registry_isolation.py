"""The vGPU registry gives each container its own socket and bounded bookkeeping (issue 16).

A hostile container reaches only its own vGPU's socket: it cannot register as another vGPU,
cannot hold more than `max_connections` connections, cannot send an endless line or chatter
after registering, and everything of a vGPU goes when its pod goes. What it writes in its own
directory (the region) is read as untrusted: no symlink followed, no FIFO, no huge read, and
the plugin's records are not there to forge.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from alnair.common.tasks import within
from alnair.deviceplugin import region
from alnair.deviceplugin.allocation import REGION_FILE, Layout
from alnair.deviceplugin.registry import SEEN_KEPT, VgpuRecord, VgpuRegistry

pytestmark = pytest.mark.integration


def rec(vgpu: str, pod_uid: str = "") -> VgpuRecord:
    return VgpuRecord(vgpu, 0, "GPU-0", 1024, 30, "ml", f"pod-{vgpu}", "main", pod_uid)


async def register(
    path: Path, vgpu: str, pid: int = 7
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"REGISTER vgpu={vgpu} pid={pid} region=/r memory=1024MiB compute=30\n".encode())
    await writer.drain()
    return reader, writer


def gone(*paths: Path) -> bool:
    return not any(p.exists() for p in paths)


async def closed(reader: asyncio.StreamReader) -> bool:
    """The registry hung up on us (a reset counts: it closed with our bytes unread)."""
    try:
        return await within(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def test_each_vgpu_has_its_own_socket_and_refuses_impostors(tmp_path: Path) -> None:
    vgpus = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    await vgpus.start()
    try:
        vgpus.record(rec("a"))
        vgpus.record(rec("b"))
        sock_a, sock_b = vgpus.socket_for("a"), vgpus.socket_for("b")
        assert sock_a.parent != sock_b.parent  # each directory is mounted into one container
        assert stat.S_IMODE(sock_a.parent.stat().st_mode) == 0o755
        assert stat.S_IMODE(sock_a.stat().st_mode) == 0o666
        # container A claims B's vGPU on its own socket: refused and disconnected
        reader, writer = await register(sock_a, "b")
        assert await closed(reader)
        writer.close()
        assert vgpus.connections("b") == [] and vgpus.refused == 1
        # its own vGPU is fine, and only it hears its utilisation
        reader, writer = await register(sock_a, "a")
        await within(vgpus.wait_registered("a"), 5)
        assert await vgpus.send_utilization("b", 50.0) == 0
        assert await vgpus.send_utilization("a", 50.0) == 1
        assert await reader.readline() == b"UTIL 0 50.00\n"
        writer.close()
    finally:
        await vgpus.stop()


async def test_bounded_connections_lines_and_chatter(tmp_path: Path) -> None:
    vgpus = VgpuRegistry(Layout(state_dir=str(tmp_path)), max_connections=3)
    await vgpus.start()
    writers: list[asyncio.StreamWriter] = []
    try:
        vgpus.record(rec("a"))
        path = vgpus.socket_for("a")
        writers.extend([(await register(path, "a", pid))[1] for pid in range(3)])
        await within(vgpus.wait_registered("a", 3), 5)
        # the fourth process is refused: a fork bomb cannot grow the bookkeeping
        reader, writer = await register(path, "a", 99)
        assert await closed(reader)
        writer.close()
        assert len(vgpus.connections("a")) == 3
        for w in writers:
            w.close()
        for _ in range(100):
            if not vgpus.connections("a"):
                break
            await asyncio.sleep(0.02)
        assert vgpus.connections("a") == []
        # an endless line is cut at 4 KiB
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"REGISTER vgpu=a pid=1 " + b"x" * 70_000)
        await writer.drain()
        assert await closed(reader)
        writer.close()
        # chatter after REGISTER is not read forever
        reader, writer = await register(path, "a")
        await within(vgpus.wait_registered("a"), 5)
        writer.write(b"more\n")
        await writer.drain()
        assert await closed(reader)
        writer.close()
        assert vgpus.refused == 3
    finally:
        await vgpus.stop()
    assert len(vgpus.seen) <= SEEN_KEPT and vgpus.seen.maxlen == SEEN_KEPT


async def test_pod_gone_takes_socket_connections_and_directories(tmp_path: Path) -> None:
    vgpus = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    await vgpus.start()
    try:
        vgpus.record(rec("a", pod_uid="uid-a"))
        path = vgpus.socket_for("a")
        reader, writer = await register(path, "a")
        await within(vgpus.wait_registered("a"), 5)
        assert vgpus.forget_pod("uid-a") == ["a"]
        assert await closed(reader)  # the pod's processes are disconnected
        writer.close()
        assert gone(path.parent, Path(vgpus.layout.vgpu_host_dir("a")))
        with pytest.raises((ConnectionRefusedError, FileNotFoundError)):
            await asyncio.open_unix_connection(str(path))
    finally:
        await vgpus.stop()


async def test_restart_reopens_the_sockets_of_recorded_vgpus(tmp_path: Path) -> None:
    first = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    await first.start()
    first.record(rec("a"))
    await first.stop()
    second = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    assert second.load_records() == 1
    await second.start()
    try:
        _reader, writer = await register(second.socket_for("a"), "a")
        await within(second.wait_registered("a"), 5)
        writer.close()
    finally:
        await second.stop()


async def test_what_the_container_writes_is_untrusted(tmp_path: Path) -> None:
    vgpus = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    vgpus.record(rec("a", pod_uid="uid-a"))
    host_dir = Path(vgpus.layout.vgpu_host_dir("a"))
    secret = tmp_path / "node-secret"
    secret.write_bytes(region.build())
    # a symlink to a node file is not followed, even one that parses as a region
    (host_dir / REGION_FILE).symlink_to(secret)
    assert vgpus.usage("a") is None
    (host_dir / REGION_FILE).unlink()
    os.mkfifo(host_dir / REGION_FILE)  # would block a plain read forever
    assert vgpus.usage("a") is None
    (host_dir / REGION_FILE).unlink()
    with (host_dir / REGION_FILE).open("wb") as f:  # 1 GiB, sparse: only the region's size is read
        f.write(region.build())
        f.truncate(1 << 30)
    assert vgpus.usage("a") is not None
    # a forged record in the container's directory is not what a restarted plugin believes
    (host_dir / "allocation.json").write_text(json.dumps(asdict(rec("a", pod_uid="victim"))))
    restarted = VgpuRegistry(Layout(state_dir=str(tmp_path)))
    assert restarted.load_records() == 1
    assert [r.pod_uid for r in restarted.records()] == ["uid-a"]
