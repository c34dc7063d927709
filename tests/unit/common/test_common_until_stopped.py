"""The services' main wait: a signal means a clean stop, a dead part means exit non-zero."""

from __future__ import annotations

import asyncio
import os
import signal

from alnair.common.tasks import until_stopped, within


async def test_a_dead_part_ends_the_wait_as_a_failure() -> None:
    died = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, died.set)
    assert await within(until_stopped(died), 5) is True


async def test_sigterm_ends_the_wait_cleanly_and_the_handler_is_removed() -> None:
    died = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, os.kill, os.getpid(), signal.SIGTERM)
    assert await within(until_stopped(died), 5) is False
    assert not loop.remove_signal_handler(signal.SIGTERM)  # already removed
