"""A real munged for tests (Debian's ``munge`` package, installed by ``make install``): its own key and socket in
a temporary directory, so credentials are real and ``unmunge`` really verifies them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from activities.auth.munge import MungeVerifier
from workflows.domain.operators import OperatorAction, OperatorCredential, OperatorRequest
from workflows.policy.operators import action_payload

__all__ = ["MungeLab", "munge_lab"]

_SBIN = ("/usr/sbin", "/sbin")


def _program(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))
    if found is None:
        pytest.fail(f"{name} is not installed: run `make install` (Debian package munge)")
    return found


@dataclass
class MungeLab:
    socket: Path

    def encode(self, payload: str, *, user: str | None = None, ttl: int | None = None) -> str:
        """A credential over ``payload``, made as ``user`` (through runuser) or as this process's user."""
        argv = [_program("munge"), f"--socket={self.socket}"]
        if ttl is not None:
            argv.append(f"--ttl={ttl}")
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        out = subprocess.run(argv, input=payload, capture_output=True, text=True, check=True, timeout=10)
        return out.stdout.strip()

    def request(self, action: OperatorAction, *, user: str | None = None, claimed: str = "root") -> OperatorRequest:
        """The action signed as ``user``, as the CLI would send it."""
        from datetime import UTC, datetime

        cred = OperatorCredential(
            munge=self.encode(action_payload(action), user=user), claimed_user=claimed, encoded_at=datetime.now(UTC)
        )
        return OperatorRequest(action=action, credential=cred)

    def verifier(self, operators: tuple[str, ...] | list[str]) -> MungeVerifier:
        """The real verification activity against this munged; ``operators`` may be a list mutated by the test."""
        return MungeVerifier(
            unmunge_bin=_program("unmunge"), socket=self.socket, timeout_s=10, operators=lambda: tuple(operators)
        )


@pytest.fixture(scope="session")
def munge_lab() -> Iterator[MungeLab]:
    d = Path(tempfile.mkdtemp(prefix="rebound-munge-"))
    d.chmod(0o755)  # munged wants its socket directory a+x; other users (runuser) reach the socket through it
    key = d / "munge.key"
    subprocess.run([_program("mungekey"), "--create", f"--keyfile={key}"], check=True, timeout=30)
    sock, pid_file = d / "munge.socket", d / "munged.pid"
    subprocess.run(
        [
            _program("munged"),
            f"--socket={sock}",
            f"--key-file={key}",
            f"--pid-file={pid_file}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ],
        check=True,
        timeout=30,
    )
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield MungeLab(socket=sock)
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    shutil.rmtree(d, ignore_errors=True)
