"""A real non-root Unix user for the red-team tests, with an environment it can actually use.

The repository's venv may live under a private home (``/root`` is 0700 here: its interpreter is unreachable by
anyone else), so the user gets its own venv on Debian's ``/usr/bin/python3`` (the same minor version) that reads
Rebound and its dependencies from the repository's site-packages through a ``.pth`` file. Nothing is installed.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["REDTEAM_USER", "RedTeamUser", "redteam_user"]

REDTEAM_USER = "rebound-redteam"
_HOME = Path("/var/tmp/rebound-redteam")
_SYSTEM_PYTHON = Path("/usr/bin/python3")
_LOCK = Path("/tmp/rebound-redteam.lock")


@dataclass
class RedTeamUser:
    name: str
    uid: int
    python: Path

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user (``runuser``, no shell), with exactly ``env``."""
        return subprocess.run(
            ["runuser", "-u", self.name, "--", *argv],
            env={**env, "HOME": str(_HOME), "USER": self.name, "LOGNAME": self.name},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=_HOME,
        )

    def rebound(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """The ``rebound`` CLI as this user."""
        return self.run([str(self.python), "-m", "workers.cli", *args], env)


def _ensure_user() -> int:
    try:
        return pwd.getpwnam(REDTEAM_USER).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", str(_HOME), "--shell", "/usr/sbin/nologin",
             REDTEAM_USER],
            check=True,
            timeout=30,
        )  # fmt: skip
        return pwd.getpwnam(REDTEAM_USER).pw_uid


def _ensure_venv(uid: int) -> Path:
    venv = _HOME / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        _HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(_SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    ours = Path(sysconfig.get_paths()["purelib"])
    (site / "rebound-redteam.pth").write_text(f"{repo}\n{ours}\n")
    os.chown(_HOME, uid, -1)
    return python


@pytest.fixture(scope="session")
def redteam_user() -> RedTeamUser:
    if os.geteuid() != 0:
        pytest.fail("the red-team suite creates a Unix user: run the tests as root (make test does)")
    if not _SYSTEM_PYTHON.exists():
        pytest.fail("/usr/bin/python3 is missing (Debian package python3)")
    same = subprocess.run([str(_SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if same != str(sys.version_info[:2]):
        pytest.fail(f"/usr/bin/python3 is {same}, the venv's is {sys.version_info[:2]}: compiled packages differ")
    # make test runs the lab tests and the others in two pytest sessions at once (deploy/local/test-all.sh):
    # both may reach this, and two useradd or venv creations at once fail or leave a half-made venv.
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        uid = _ensure_user()
        user = RedTeamUser(name=REDTEAM_USER, uid=uid, python=_ensure_venv(uid))
    probe = user.run([str(user.python), "-c", "import temporalio, workers.cli; print('ok')"], dict(os.environ))
    if probe.stdout.strip() != "ok":
        pytest.fail(f"the red-team user cannot import Rebound: {probe.stderr[-500:]}")
    return user
