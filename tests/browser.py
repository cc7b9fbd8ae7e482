"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): open a page, collect
what the browser reports as errors, evaluate JavaScript in it, move the pointer, take a screenshot.

The pipe needs no WebSocket library and no port: Chromium reads commands on its fd 3 and writes replies and events
on its fd 4, each one JSON message ended by a NUL byte.  Debian's `chromium-headless-shell` (or `chromium`) is
what CI installs; `find_chromium()` says which is here.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium-headless-shell", "chromium")


def find_chromium() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page in it.  Errors the page raises are kept in `errors`, as text."""

    def __init__(self, binary: str, profile: Path, *, width: int = 1100, height: int = 900) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends must not be 3 or 4 themselves, or the redirections below would close them.
        to_browser_r, from_browser_w = (_above_four(fd) for fd in (to_browser_r, from_browser_w))
        args = [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
                f"--window-size={width},{height}", "about:blank"]
        # Chromium wants the pipe on fds 3 and 4 exactly; bash's redirections put them there before the exec (dash's
        # cannot name fds above 9).
        place = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        self.process = subprocess.Popen(
            ["bash", "-c", place, "chromium", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, *, session: bool = False, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._note(reply)

    def open(self, url: str, *, timeout: float = 30) -> None:
        """Navigate and wait for the load event: every script in the page has run."""
        self._events.clear()
        result = self.call("Page.navigate", session=True, url=url)
        if result.get("errorText"):
            raise BrowserError(f"{url}: {result['errorText']}")
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._note(self._read(deadline))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def move_pointer(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)

    def screenshot(self) -> bytes:
        """The whole page, not only the window: a PNG."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", session=True, format="png", clip=clip, captureBeyondViewport=True)
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        try:
            os.write(self._to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError("no reply from Chromium in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe (exit {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _note(self, event: dict[str, Any]) -> None:
        """Keep the page's events; the ones that mean something went wrong become `errors`."""
        self._events.append(event)
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")



def _above_four(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved
