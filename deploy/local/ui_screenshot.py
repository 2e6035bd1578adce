"""Screenshot a page of the lab's Temporal Web UI with headless Chromium (Debian's ``chromium`` package).

``python -m deploy.local.ui_screenshot --job JOB [--when VERIFYING] [--out docs/img/x.png]`` waits until the job's
JobRecovery workflow reaches the given state, then captures its page (the UI is a JavaScript app: Chromium is
given a virtual-time budget to fetch and render the workflow's history before the capture). The command line is an
argument list: nothing goes through a shell.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from deploy.local.config import LabConfig
from deploy.local.demo_cmd import lab_settings
from deploy.local.lab import Lab
from workers.client import connect
from workers.jobs_cli import query_status
from workflows.constants import job_workflow_id

__all__ = ["capture", "workflow_url"]


def workflow_url(ui_base: str, namespace: str, workflow_id: str) -> str:
    """The UI page of a workflow (its latest run)."""
    return f"{ui_base.rstrip('/')}/namespaces/{namespace}/workflows/{urllib.parse.quote(workflow_id, safe='')}"


def capture(
    url: str, out: Path, *, width: int = 1600, height: int = 1300, wait_for_text: str = "", timeout_s: float = 30.0
) -> Path:
    """Render ``url`` in headless Chromium and write a PNG to ``out``.

    The UI is a single-page app that keeps polling, so neither ``--screenshot`` (too early: a blank page) nor a
    virtual-time budget (never idle) works: Chromium is driven through its DevTools protocol over a pipe
    (``--remote-debugging-pipe``: NUL-separated JSON on fds 3 and 4), and the page is captured once its text
    contains ``wait_for_text`` (or after ``timeout_s``).

    Raises:
        RuntimeError: Chromium is not installed, or it gave no screenshot.
    """
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    argv = [
        browser,
        "--headless",
        "--no-sandbox",  # the lab runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        "--remote-debugging-pipe",
        "about:blank",
    ]
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def wire_fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes its answers
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)

    proc = subprocess.Popen(
        argv, preexec_fn=wire_fds, pass_fds=(3, 4),  # kept open in the child: wire_fds put the pipes there
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    cdp = _Cdp(to_chrome_w, from_chrome_r)
    try:
        target = cdp.call("Target.createTarget", {"url": url})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.monotonic() + timeout_s
        probe = f"document.body && document.body.innerText.includes({json.dumps(wait_for_text)})"
        while time.monotonic() < deadline:
            found = cdp.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session)
            if found.get("result", {}).get("value") is True:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # let the last requests render
        shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session)
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            cdp.call("Browser.close", {})
        proc.kill()
        proc.wait(timeout=10)
        os.close(to_chrome_w)
        os.close(from_chrome_r)
    data = base64.b64decode(shot.get("data", ""))
    if not data:
        raise RuntimeError("chromium gave no screenshot")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


class _Cdp:
    """The DevTools protocol over Chromium's debugging pipe: one request at a time, events skipped."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self._w, self._r = write_fd, read_fd
        self._buf = b""
        self._next = 0

    def call(self, method: str, params: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its debugging pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(raw)
        return parsed


async def _wait_state(job_id: int, state: str, timeout_s: float) -> None:
    lab = Lab(LabConfig())
    settings = lab_settings(lab)
    client = await connect(settings.temporal)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            st = await query_status(client, settings, job_id)
            if st.state.value == state:
                return
        except Exception:  # noqa: BLE001 - not started yet: keep polling until the deadline
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"job {job_id} never reached {state} within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--when", default="", help="capture once the JobRecovery is in this state (e.g. VERIFYING)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("docs/img/temporal-ui-recovery.png"))
    parser.add_argument("--text", default="JobRecovery", help="capture once the page shows this text")
    args = parser.parse_args(argv)
    cfg = LabConfig()
    if args.when:
        asyncio.run(_wait_state(args.job, args.when, args.timeout))
    url = workflow_url(cfg.temporal_ui_url, cfg.temporal_namespace, job_workflow_id(cfg.cluster_name, args.job))
    path = capture(url, args.out, wait_for_text=args.text)
    print(f"{url} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
