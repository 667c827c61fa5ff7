"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): no
websocket client, no extra package. The browser tests use it where a page must find the browser's
storage as a returning user left it before its own scripts run (MLflow's UI keeps the workflow
switch and whether its Assistant panel was closed in localStorage), and where they must wait for
what a page shows rather than for a fixed time.

    with Browser(chromium_path, profile_dir, 1280, 900) as page:
        page.add_init_script("localStorage.setItem('k', 'v')")
        page.goto(url)
        page.wait_for("document.body.innerText.includes('Group:')", timeout=60)
        png_bytes = page.screenshot()
        html = page.evaluate("document.documentElement.outerHTML")
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import time


class BrowserError(RuntimeError):
    """The browser answered with an error, closed the pipe, or a wait ran out."""


class Browser:
    def __init__(self, binary: str, profile: str, width: int, height: int) -> None:
        self.binary, self.profile, self.width, self.height = binary, profile, width, height
        self.next_id, self.session, self.buffer = 0, None, b""

    def __enter__(self) -> "Browser":
        to_browser, self.commands = os.pipe()  # the browser reads commands on its fd 3 ...
        self.events, from_browser = os.pipe()  # ... and writes answers and events on its fd 4
        # Above any descriptor the child may already use, so the two dup2s below cannot clobber one another.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (to_browser, from_browser)]

        def child_fds() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             # without these three it stalls on an offline machine, waiting on Google's services
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=child_fds, start_new_session=True)
        for fd in (to_browser, from_browser, *high):
            os.close(fd)
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.session = None
            self.call("Browser.close", timeout=10)
            self.proc.wait(timeout=20)
        except (BrowserError, subprocess.TimeoutExpired, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            os.close(self.commands)
            os.close(self.events)

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        """Send one command (to the page once attached) and return its result."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.events], [], [], left)[0]:
                raise BrowserError("no answer from the browser in time")
            chunk = os.read(self.events, 1 << 20)
            if not chunk:
                raise BrowserError("the browser closed its pipe")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(line)

    def add_init_script(self, source: str) -> None:
        """Run `source` in every document this page loads, before the document's own scripts."""
        self.call("Page.addScriptToEvaluateOnNewDocument", source=source)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60, settle: float = 1.0) -> None:
        """Until `expression` is true in the page, then `settle` seconds more for the paint to finish."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after {timeout} s: {expression}")
            time.sleep(0.25)
        time.sleep(settle)

    def screenshot(self) -> bytes:
        """The window's visible part as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
