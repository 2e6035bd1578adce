"""The lab's real Slurm 22.05 cluster: munged, slurmctld, one slurmd per node, slurmrestd (unix + JWT/TCP)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from deploy.demo.ports import PORT_SLOT_ENV
from deploy.local.config import LabConfig
from deploy.local.node_check_lab import health_check_script
from deploy.local.processes import (
    LabError,
    descendants,
    kill_and_wait,
    pids_holding_any,
    read_owned_pid,
    require_free_ports,
    run,
    spawn,
    wait_until,
)
from deploy.local.slurm_config import render_gres_conf, render_slurm_conf
from deploy.local.system import ensure_node_hosts, find_binary, sbin_path

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195  # the character-device major number of NVIDIA GPUs


class SlurmCluster:
    """Brings the lab's Slurm daemons up and down. Every method is idempotent."""

    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self.lay = cfg.layout

    # ----- environment -------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands against this lab (and for the jobs submitted with it: their port slot)."""
        return dict(
            os.environ,
            SLURM_CONF=str(self.lay.slurm_conf),
            PATH=sbin_path(),
            **{PORT_SLOT_ENV: str(self.cfg.demo_port_slot)},
        )

    def _bin(self, name: str) -> str:
        path = find_binary(name)
        if path is None:
            raise LabError(f"{name} is not installed: run `bash deploy/local/install-system.sh` as root")
        return path

    # ----- files -------------------------------------------------------------------------------------------
    def prepare(self) -> bool:
        """Create directories, keys, devices and configs. Returns True when slurm.conf/gres.conf changed."""
        lay = self.lay
        for d in (lay.etc, lay.dev, lay.run, lay.log, lay.spool / "ctld", lay.temporal_db.parent, lay.runs):
            d.mkdir(parents=True, exist_ok=True)
        for node in self.cfg.node_names:
            # Pre-created, else slurmd's first start logs a missing domain-socket directory and a hwloc error.
            (lay.spool / "d" / node).mkdir(parents=True, exist_ok=True)
        lay.munge_dir.mkdir(parents=True, exist_ok=True)
        lay.munge_dir.chmod(0o755)  # munged insists its socket directory is a+x
        if not lay.munge_key.exists():
            run([self._bin("mungekey"), "--create", f"--keyfile={lay.munge_key}"])
        if not lay.jwt_key.exists():
            lay.jwt_key.write_bytes(os.urandom(32))
        lay.jwt_key.chmod(0o600)
        self._make_gpu_devices()
        try:
            ensure_node_hosts(self.cfg.node_names)
        except OSError as e:  # not root: the lab still runs; only launchers that rendezvous by node name fail
            log.warning("cannot make the node names resolvable in /etc/hosts: %s", e)
        script = lay.etc / "healthcheck.sh"
        scontrol = find_binary("scontrol") or "scontrol"
        _write_if_changed(script, health_check_script(self.cfg.state_dir, scontrol, lay.slurm_conf))
        script.chmod(0o755)
        changed = _write_if_changed(lay.slurm_conf, render_slurm_conf(self.cfg))
        changed |= _write_if_changed(lay.gres_conf, render_gres_conf(self.cfg))
        return changed

    def _make_gpu_devices(self) -> None:
        # Slurm accepts only character (or block) devices as GRES files; nothing ever opens them.
        for i in range(self.cfg.gpus_per_node):
            dev = self.lay.dev / f"nvidia{i}"
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISCHR(dev.stat().st_mode):
                    continue
                dev.unlink()
            try:
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
            except PermissionError as e:
                raise LabError(
                    f"cannot create GPU device {dev} (mknod needs CAP_MKNOD): run as root on a host or a "
                    "privileged container"
                ) from e

    # ----- start -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every daemon that is not already running, then wait until every node has registered."""
        changed = self.prepare()
        lay = self.lay
        if changed and self.pid("slurmctld") is not None:
            # slurmctld must be restarted for AuthInfo (cred_expire) and node changes to apply.
            self.stop(keep_jobs=True)
        self._check_ports()
        self._start_munge()
        if self.pid("slurmctld") is None:
            run([self._bin("slurmctld"), "-f", str(lay.slurm_conf)], env=self.env())
        # slurmctld daemonizes before parsing its config: only `scontrol ping` proves it is up.
        wait_until(self._ctld_up, self.cfg.ready_timeout_s, f"slurmctld (see {lay.log / 'slurmctld.log'})")
        for node in self.cfg.node_names:
            if self.pid(f"slurmd-{node}") is None:
                run([self._bin("slurmd"), "-f", str(lay.slurm_conf), "-N", node], env=self.env())
        self._start_restd()
        wait_until(self.all_nodes_ready, self.cfg.ready_timeout_s, "every slurmd to register", interval_s=0.2)

    def _check_ports(self) -> None:
        wanted = {"slurmctld": self.cfg.slurmctld_port} if self.pid("slurmctld") is None else {}
        for node in self.cfg.node_names:
            if self.pid(f"slurmd-{node}") is None:
                wanted[f"slurmd-{node}"] = self.cfg.slurmd_port(node)
        if self.pid("slurmrestd-jwt") is None:
            wanted["slurmrestd"] = self.cfg.slurmrestd_port
        require_free_ports(wanted)

    def _start_munge(self) -> None:
        lay = self.lay
        if self.pid("munged") is None:
            run(
                [
                    self._bin("munged"),
                    f"--socket={lay.munge_socket}",
                    f"--key-file={lay.munge_key}",
                    f"--pid-file={lay.pid_file('munged')}",
                    f"--log-file={lay.log_file('munged')}",
                    f"--seed-file={lay.munge_dir / 'munged.seed'}",
                    "--force",  # tolerate a stale socket left by a crash
                ]
            )
        wait_until(self._munge_ok, 10, "munged")

    def _munge_ok(self) -> bool:
        try:
            run([self._bin("munge"), "-S", str(self.lay.munge_socket), "-n"], timeout=5)
        except LabError:
            return False
        return True

    def _ctld_up(self) -> bool:
        try:
            return "is UP" in run([self._bin("scontrol"), "ping"], env=self.env(), timeout=5)
        except LabError:
            return False

    def _start_restd(self) -> None:
        lay = self.lay
        restd = self._bin("slurmrestd")
        # Both run as root, which slurmrestd refuses unless told: the lab is a single-user, loopback-only stack.
        base_env = dict(self.env(), SLURMRESTD_SECURITY="disable_user_check")
        if self.pid("slurmrestd-unix") is None:
            with contextlib.suppress(FileNotFoundError):
                lay.rest_socket.unlink()
            spawn(
                [
                    restd,
                    "-f",
                    str(lay.slurm_conf),
                    "-a",
                    "rest_auth/local",
                    "-s",
                    "openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38",
                    f"unix:{lay.rest_socket}",
                ],
                log_file=lay.log_file("slurmrestd-unix"),
                pid_file=lay.pid_file("slurmrestd-unix"),
                env=base_env,
            )
        if self.pid("slurmrestd-jwt") is None:
            spawn(
                [
                    restd,
                    "-f",
                    str(lay.slurm_conf),
                    "-a",
                    "rest_auth/jwt",
                    "-s",
                    "openapi/v0.0.38",
                    f"127.0.0.1:{self.cfg.slurmrestd_port}",
                ],
                log_file=lay.log_file("slurmrestd-jwt"),
                pid_file=lay.pid_file("slurmrestd-jwt"),
                env=dict(base_env, SLURM_JWT="daemon"),
            )

    # ----- observe -----------------------------------------------------------------------------------------
    def pid(self, service: str) -> int | None:
        return read_owned_pid(self.lay.pid_file(service), self.lay.state_dir)

    def node_states(self) -> dict[str, str]:
        """``sinfo``'s compact state per node (``idle``, ``mixed``, ``down*``, ``drain``...)."""
        out = run([self._bin("sinfo"), "-h", "-N", "-o", "%N %T"], env=self.env(), timeout=10)
        states: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def all_nodes_ready(self) -> bool:
        try:
            states = self.node_states()
        except LabError:
            return False
        return set(states) == set(self.cfg.node_names) and all(
            not s.endswith("*") and s.split("+")[0] not in ("unknown", "down", "not_responding")
            for s in states.values()
        )

    def token(self, user: str = "root", lifespan_s: int = 3600) -> str:
        """A Slurm JWT for slurmrestd over TCP."""
        out = run([self._bin("scontrol"), "token", f"username={user}", f"lifespan={lifespan_s}"], env=self.env())
        return out.strip().removeprefix("SLURM_JWT=")

    # ----- stop --------------------------------------------------------------------------------------------
    def stop(self, *, keep_jobs: bool = False) -> None:
        """Stop what `start` started, by pid file, in reverse order."""
        if not keep_jobs and self.pid("slurmctld") is not None:
            # Every job of the lab's only user, whatever its state (scancel takes one --state at most).
            with contextlib.suppress(LabError):
                run([self._bin("scancel"), "--full", "--user=root"], env=self.env(), timeout=10)
        for service in ("slurmrestd-jwt", "slurmrestd-unix"):
            self._stop(service)
        # Every node with a pid file, not only the configured ones: an earlier `up` may have started more.
        nodes = sorted({*self.cfg.node_names, *(s.removeprefix("slurmd-") for s in self.lay.started("slurmd-"))})
        stepds = self.node_stepds(nodes)
        for node in nodes:
            self._stop(f"slurmd-{node}")
        # Orphaned slurmstepds (and their tasks) would collide with a later run of the same job id.
        leftover = [p for p in self.node_stepds(nodes) + stepds]
        if leftover:
            kill_and_wait(leftover + descendants(leftover), term_timeout_s=3)
        self._stop("slurmctld")
        self._stop("munged")

    def node_stepds(self, nodes: Sequence[str]) -> list[int]:
        """slurmstepd processes of these nodes of this lab: they hold the slurmd log open."""
        held = pids_holding_any([self.lay.slurmd_log(n) for n in nodes])
        found: list[int] = []
        for n in nodes:
            found += [p for p in held[self.lay.slurmd_log(n)] if p != self.pid(f"slurmd-{n}")]
        return found

    def _stop(self, service: str) -> None:
        pid = self.pid(service)
        if pid is not None:
            kill_and_wait([pid])
        with contextlib.suppress(FileNotFoundError):
            self.lay.pid_file(service).unlink()


def _write_if_changed(path: Path, content: str) -> bool:
    if path.exists() and path.read_text() == content:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(content)
    tmp.chmod(0o644)  # slurmrestd and the `slurm` user must be able to read it
    os.replace(tmp, path)
    return True
