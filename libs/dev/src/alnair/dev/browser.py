"""A real headless browser for the console's tests: Chromium driven over its DevTools protocol.

`make setup` installs Debian's `chromium`. The protocol is spoken directly (a websocket, JSON
commands and events), so no driver binary and no browser download has to match the installed
Chromium's version. What a test needs: open a page, wait for something in it, read the errors
the page logged (uncaught exceptions, `console.error`, failed loads), take screenshots.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from alnair.common.errors import ConfigError
from alnair.dev.waiting import wait_for

LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium() -> str:
    """The Chromium binary, or a clear error naming how to get it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise ConfigError("no Chromium on PATH: `make setup` installs Debian's chromium package")


class Browser:
    """One headless Chromium with one page; `errors` collects what the page logged as errors."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        self.width, self.height = width, height
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._loaded = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._session = ""
        self._profile = tempfile.TemporaryDirectory(prefix="alnair-browser-")

    async def __aenter__(self) -> Browser:
        self._proc = await asyncio.create_subprocess_exec(
            chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
            f"--user-data-dir={self._profile.name}", "--remote-debugging-port=0",
            f"--window-size={self.width},{self.height}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self._proc.stderr is not None
        url = None
        async with asyncio.timeout(30):
            while url is None:
                line = await self._proc.stderr.readline()
                if not line:
                    raise ConfigError("Chromium exited before it listened for DevTools")
                if match := LISTENING.search(line):
                    url = match.group(1).decode()
        # Drain its log so a chatty browser never blocks on a full pipe.
        asyncio.create_task(self._proc.stderr.read())  # noqa: RUF006 - ends with the process
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=64 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        self._session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width, height=self.height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await self._proc.wait()
            except TimeoutError:
                self._proc.kill()
        self._profile.cleanup()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command (on the page once attached); its result."""
        assert self._ws is not None
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if self._session:
            message["sessionId"] = self._session
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = done
        await self._ws.send_str(json.dumps(message))
        async with asyncio.timeout(30):
            return await done

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            doc = json.loads(msg.data)
            if "id" in doc:
                waiter = self._waiting.pop(doc["id"], None)
                if waiter is not None and not waiter.done():
                    if "error" in doc:
                        waiter.set_exception(RuntimeError(f"DevTools: {doc['error']}"))
                    else:
                        waiter.set_result(doc.get("result") or {})
                continue
            self._event(doc.get("method", ""), doc.get("params") or {})

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            text = (details.get("exception") or {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.errors.append("console.error: " + " ".join(args))
        elif method == "Log.entryAdded":
            entry = params.get("entry") or {}
            if entry.get("level") == "error":
                self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())

    async def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self._loaded.clear()
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise ConfigError(f"cannot open {url}: {result['errorText']}", url=url)
        async with asyncio.timeout(30):
            await self._loaded.wait()

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return (result.get("result") or {}).get("value")

    async def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """The first truthy value of `expression`, asked every 100 ms (a test waiting for a
        page it does not control, not a service polling). An element is returned by value as
        `{}`, which is falsy here: ask `!!document.querySelector(...)`."""
        return await wait_for(lambda: self.evaluate(expression), timeout_s, what=expression)

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)

        await asyncio.to_thread(write)
        return path
