"""A headless Chromium driven over the Chrome DevTools Protocol on a pipe (stdlib only).

Chromium started with --remote-debugging-pipe reads protocol messages from its fd 3 and
writes to its fd 4, each a JSON object ended by a NUL byte: no websocket, no driver, no
pip package. Debian's `chromium` package is enough (`make test` installs it).

    with Browser() as browser:
        page = browser.page(width=1366, height=768)
        page.goto("http://127.0.0.1:8765/")
        page.wait_for("document.body.dataset.ready === 'true'")
        page.key("a")
        page.click("#reject")
        page.screenshot(Path("shot.png"))
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Keys the tests press: (key, code, keyCode); letters are their own key.
SPECIAL = {
    "Escape": ("Escape", "Escape", 27),
    "ArrowRight": ("ArrowRight", "ArrowRight", 39),
    "ArrowLeft": ("ArrowLeft", "ArrowLeft", 37),
    "Enter": ("Enter", "Enter", 13),
}
SHIFTED_DIGITS = "!@#$%^&*("


def find_chromium() -> str | None:
    """PERSONAEMP_CHROMIUM, else the first browser of CANDIDATES on the PATH."""
    chosen = os.environ.get("PERSONAEMP_CHROMIUM")
    if chosen:
        return chosen
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, executable: str | None = None, timeout: float = 30.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("no chromium found (apt-get install chromium, or set PERSONAEMP_CHROMIUM)")
        self.timeout = timeout
        self._id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="personaemp-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # Moved above 10 first: were one of them 3 or 4 already, putting the other one there
        # would overwrite it.
        reading = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
        writing = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
        os.close(to_browser_read)
        os.close(from_browser_write)
        to_browser_read, from_browser_write = reading, writing
        args = [
            self.executable, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
            "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--mute-audio", "--hide-scrollbars",
            f"--user-data-dir={self._profile.name}", "about:blank",
        ]  # fmt: skip

        def onto_3_and_4() -> None:  # in the child: where Chromium looks for the pipes
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        # Python's own descriptors are not inheritable (PEP 446): only 0-4 reach Chromium.
        self.process = subprocess.Popen(
            args, preexec_fn=onto_3_and_4, close_fds=False,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser_read)
        os.close(from_browser_write)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    # --- the protocol -----------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed its pipe (it exited)")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def page(self, width: int = 1366, height: int = 768) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.send("Page.enable")
        page.send("Runtime.enable")
        page.resize(width, height)
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def resize(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('exception', {})}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll until the expression is truthy (a page is ready when it says so)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:  # the page is not there yet (about:blank, or loading)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"waited {timeout:g} s for {expression}")
            time.sleep(0.05)

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def reload(self) -> None:
        self.evaluate("document.body.dataset.ready = ''")
        self.send("Page.reload", {"ignoreCache": True})

    def key(self, name: str, shift: bool = False) -> None:
        """Press and release a key as a person would (keydown with its text, keyup)."""
        if name in SPECIAL:
            key, code, number = SPECIAL[name]
            text = "\r" if name == "Enter" else ""  # Enter types a carriage return (a form submits)
        elif name.isdigit():
            key = SHIFTED_DIGITS[int(name) - 1] if shift else name
            code, number, text = f"Digit{name}", ord(name), key
        else:
            key = name.upper() if shift else name
            code, number, text = f"Key{name.upper()}", ord(name.upper()), key
        modifiers = 8 if shift else 0
        common = {"key": key, "code": code, "windowsVirtualKeyCode": number, "modifiers": modifiers}
        self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": text, **common})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **common})

    def type(self, text: str) -> None:
        self.send("Input.insertText", {"text": text})

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element (scrolled into view first)."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not box:
            raise BrowserError(f"no element {selector}")
        x, y = box
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            )

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
