"""Stand-ins for ``squeue``/``sinfo``/``scontrol``: tiny shell scripts that log their argv and replay answers.

They let the CLI adapter's real subprocess path run without a cluster: argument lists, exit codes, stderr
classification and timeouts are all exercised for real.
"""

from __future__ import annotations

from pathlib import Path

from activities.slurm.cli import SlurmCliScheduler
from tests.unit.slurm import golden

_SCRIPT = r"""#!/bin/sh
# Fake Slurm command: logs its arguments (unit-separated), then replays the canned answer for this call.
tool=$(basename "$0")
dir="$FAKE_SLURM_DIR"
n=$(cat "$dir/$tool.count" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$dir/$tool.count"
# One write per line: squeue and sinfo run concurrently and must not interleave their records.
line=$(printf '%s' "$tool"; for a in "$@"; do printf '\037%s' "$a"; done)
printf '%s\n' "$line" >> "$dir/calls.log"
base="$dir/$tool.$n"
[ -e "$base.rc" ] || base="$dir/$tool"
[ -e "$base.sleep" ] && exec sleep "$(cat "$base.sleep")"
[ -e "$base.stdout" ] && cat "$base.stdout"
[ -e "$base.stderr" ] && cat "$base.stderr" >&2
exit "$(cat "$base.rc" 2>/dev/null || echo 0)"
"""

TOOLS = ("squeue", "sinfo", "scontrol", "sbatch")


class FakeSlurmBin:
    """A ``bin_dir`` of fake Slurm commands plus the directory holding their answers and call log."""

    def __init__(self, root: Path) -> None:
        self.bin_dir = root / "bin"
        self.state = root / "state"
        self.bin_dir.mkdir()
        self.state.mkdir()
        for tool in TOOLS:
            path = self.bin_dir / tool
            path.write_text(_SCRIPT)
            path.chmod(0o755)
        self.respond("squeue", stdout=golden.read("squeue.json"))
        self.respond("sinfo", stdout=golden.read("sinfo.json"))
        self.respond("scontrol")

    def respond(
        self,
        tool: str,
        *,
        stdout: bytes | str = b"",
        stderr: str = "",
        rc: int = 0,
        call: int | None = None,
        sleep_s: float | None = None,
    ) -> None:
        """Set the answer of ``tool``: for every call, or only for its ``call``-th call (1-based)."""
        base = self.state / (tool if call is None else f"{tool}.{call}")
        base.with_name(base.name + ".stdout").write_bytes(stdout.encode() if isinstance(stdout, str) else stdout)
        base.with_name(base.name + ".stderr").write_text(stderr)
        base.with_name(base.name + ".rc").write_text(str(rc))
        if sleep_s is not None:
            base.with_name(base.name + ".sleep").write_text(str(sleep_s))

    def calls(self, tool: str | None = None) -> list[list[str]]:
        """Every recorded argv (``argv[0]`` is the tool's name), oldest first."""
        log = self.state / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        argvs = [line.split("\x1f") for line in lines]
        return [argv for argv in argvs if tool is None or argv[0] == tool]

    def scheduler(self, timeout_s: float = 10.0) -> SlurmCliScheduler:
        """The adapter under test, wired to these fakes."""
        env = {"FAKE_SLURM_DIR": str(self.state), "PATH": "/usr/bin:/bin"}
        return SlurmCliScheduler(env=env, bin_dir=self.bin_dir, timeout_s=timeout_s)
