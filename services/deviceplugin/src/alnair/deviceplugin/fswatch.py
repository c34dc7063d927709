"""Entries created or deleted in one directory, from Linux inotify, on the asyncio loop.

The device plugin watches the kubelet's device-plugin directory with it: a starting kubelet
removes every socket there (ours included) and creates `kubelet.sock` anew, and both are
events, so a kubelet restart is noticed when it happens, also when the kubelet never opened a
ListAndWatch stream whose end would have told us. libc is called through ctypes (no extra
package); where inotify is missing (not Linux, or the watch limit reached) `DirectoryWatch`
raises `WatchUnavailable` and the caller keeps its other signals.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_DELETE_SELF = 0x00000400
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)

CREATED = "created"
DELETED = "deleted"
OVERFLOW = "overflow"
"""The kernel dropped events: the caller should recheck what it watches for."""

Callback = Callable[[str, str], None]
"""(what: CREATED | DELETED | OVERFLOW, entry name or "")"""


class WatchUnavailable(OSError):
    """inotify cannot be used here."""


def parse_events(buffer: bytes) -> list[tuple[int, str]]:
    """(mask, name) for every `struct inotify_event` in what one read returned."""
    events: list[tuple[int, str]] = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        _wd, mask, _cookie, length = _HEADER.unpack_from(buffer, offset)
        offset += _HEADER.size
        raw = buffer[offset : offset + length]
        offset += length
        events.append((mask, raw.split(b"\0", 1)[0].decode("utf-8", "replace")))
    return events


def classify(mask: int) -> str | None:
    if mask & IN_Q_OVERFLOW:
        return OVERFLOW
    if mask & (IN_CREATE | IN_MOVED_TO):
        return CREATED
    if mask & (IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF):
        return DELETED
    return None


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        raise WatchUnavailable(errno.ENOSYS, "no C library found")
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "inotify_init1"):
        raise WatchUnavailable(errno.ENOSYS, "this C library has no inotify")
    return libc


class DirectoryWatch:
    """Calls `callback` on the event loop for each entry created in or deleted from `path`."""

    def __init__(self, path: Path, callback: Callback) -> None:
        self.path = path
        self.callback = callback
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        libc = _libc()
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise WatchUnavailable(code, f"inotify_init1: {os.strerror(code)}")
        mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
        if libc.inotify_add_watch(fd, os.fsencode(self.path), mask) < 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise WatchUnavailable(code, f"inotify_add_watch {self.path}: {os.strerror(code)}")
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._drain)

    def _drain(self) -> None:
        if self._fd is None:
            return
        try:
            buffer = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        for mask, name in parse_events(buffer):
            if mask & IN_IGNORED:
                continue
            what = classify(mask)
            if what is not None:
                self.callback(what, name)

    def close(self) -> None:
        if self._fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None
