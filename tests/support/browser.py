"""A real headless Chromium driven through the DevTools protocol, for tests that click: the page runs as it
does for a person, and the test reads and acts on its DOM with JavaScript (Runtime.evaluate)."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tests.support import plain_http


class Page:
    """One browser with one tab open at `url`; `close` ends the browser."""

    def __init__(self, browser: str, url: str, profile: Path, timeout: float = 30.0) -> None:
        self._proc = subprocess.Popen(
            [
                browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                f"--user-data-dir={profile}", url,
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._ids = itertools.count(1)
        self._open = contextlib.ExitStack()
        try:
            self._ws = self._open.enter_context(self._connect(profile / "DevToolsActivePort", timeout))
        except BaseException:
            self._proc.kill()
            self._proc.wait()
            raise

    def _connect(self, port_file: Path, timeout: float) -> ClientConnection:
        deadline = time.monotonic() + timeout
        while True:
            assert self._proc.poll() is None, f"the browser exited ({self._proc.returncode})"
            lines = port_file.read_text().splitlines() if port_file.exists() else []
            if lines:
                pages = plain_http.get(f"http://127.0.0.1:{lines[0]}/json/list", timeout=5).json()
                page = next((p for p in pages if p.get("type") == "page"), None)
                if page is not None:
                    return connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
            assert time.monotonic() < deadline, "the browser opened no page in time"
            time.sleep(0.1)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        call_id = next(self._ids)
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        self._ws.send(json.dumps({"id": call_id, "method": "Runtime.evaluate", "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == call_id:
                break
        result = message.get("result") or {}
        if "exceptionDetails" in result or "error" in message:
            raise AssertionError(f"{expression!r} failed in the page: {message}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """The expression's value once it is truthy (evaluated every 0.1 s)."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"{expression!r} stayed false"
            time.sleep(0.1)
        return value

    def close(self) -> None:
        try:
            self._open.close()
        finally:
            self._proc.kill()
            self._proc.wait()
