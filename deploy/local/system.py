"""System prerequisites of the lab: Debian packages and root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from deploy.local.processes import LabError

#: Debian 12 packages the lab needs, and a binary that proves each is installed.
SYSTEM_PACKAGES: dict[str, str] = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurm-client": "scontrol",
    "munge": "munged",
    "slurmrestd": "slurmrestd",
    "slurm-wlm-jwt-plugin": "",  # a plugin, no binary: checked by its .so below
    "gcc": "gcc",
    "nginx-light": "nginx",  # the TLS proxy in front of Temporal and slurmrestd (deploy/local/tls_proxy.py)
}
JWT_PLUGIN = "/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so"


def sbin_path() -> str:
    """PATH with the sbin directories, where Debian puts the Slurm and munge daemons."""
    parts = os.environ.get("PATH", "").split(":")
    for extra in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        if extra not in parts:
            parts.append(extra)
    return ":".join(p for p in parts if p)


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=sbin_path())


def missing_packages() -> list[str]:
    """Packages whose binary (or plugin) is not on this machine."""
    missing = [pkg for pkg, binary in SYSTEM_PACKAGES.items() if binary and find_binary(binary) is None]
    if not os.path.exists(JWT_PLUGIN) and not _jwt_plugin_elsewhere():
        missing.append("slurm-wlm-jwt-plugin")
    return missing


def _jwt_plugin_elsewhere() -> bool:
    # Non-x86 Debian keeps plugins under another multiarch directory.
    import glob

    return bool(glob.glob("/usr/lib/*/slurm-wlm/auth_jwt.so"))


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab must run as root: it starts Slurm daemons and creates GPU character devices (mknod). "
            "Run `sudo make demo` (or `sudo .venv/bin/rebound lab up`), or use a root container/VM."
        )


def ensure_packages() -> list[str]:
    """Install whatever is missing with apt-get (root only). Returns the packages installed."""
    missing = missing_packages()
    if not missing:
        return []
    require_root()
    if shutil.which("apt-get") is None:
        raise LabError(f"missing packages {missing} and no apt-get: install them with your package manager")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")
    still = missing_packages()
    if still:
        raise LabError(f"apt-get finished but these are still missing: {still}")
    return missing


#: Marks the lines the lab adds to the hosts file, so a second bring-up finds them and adds nothing.
HOSTS_MARK = "# rebound lab nodes"


def ensure_node_hosts(names: list[str], hosts: Path = Path("/etc/hosts"), address: str = "127.0.0.1") -> list[str]:
    """Make the lab's node names resolvable (launchers such as torchrun rendezvous by hostname: ``n1:29500``).

    Every lab node runs on this host (``NodeAddr=127.0.0.1``); a name the hosts file does not list yet is added
    on one marked line. Idempotent: names already listed (by the lab or anyone) are left alone. Returns the names
    added; an unwritable hosts file (not root) raises ``OSError`` for the caller to report.
    """
    text = hosts.read_text() if hosts.exists() else ""
    listed = {name for line in text.splitlines() for name in line.split("#", 1)[0].split()[1:]}
    missing = [n for n in names if n not in listed]
    if missing:
        sep = "" if not text or text.endswith("\n") else "\n"
        with hosts.open("a") as f:
            f.write(f"{sep}{address} {' '.join(missing)} {HOSTS_MARK}\n")
    return missing
