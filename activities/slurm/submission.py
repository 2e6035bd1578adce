"""Submitting a job again (ADR 014): the ``sbatch`` arguments, the environment, the idempotency token.

Pure helpers shared by every adapter that can resubmit (``guarded.GuardedActions.resubmit_excluding``) and the
test fake. The token Rebound appends to the comment is only a way to *find* the job an interrupted attempt
submitted; whether a job belongs to a lineage is decided by Rebound's own record (the JobRecovery's
``lineage``/``resubmit_tokens``), never by what a comment says.
"""

from __future__ import annotations

import pwd
import re
import struct
from collections.abc import Iterable, Mapping

from activities.slurm.hostlist import compress
from workflows.domain.submission import RESUBMIT_TOKEN_KEY, SubmissionOptions

__all__ = [
    "MINIMAL_PATH",
    "comment_with_token",
    "job_environment",
    "parse_environ",
    "parse_saved_environment",
    "sbatch_arguments",
    "token_in",
]

#: PATH of a resubmitted job whose environment was not captured (``job_environment``).
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
# Variables Slurm sets for the job it starts (and sbatch reads as options): the old job's values would mislead
# the new one, which gets its own from slurmd.
_SLURM_OWNED = re.compile(r"^(SLURM_|SBATCH_|SRUN_|SALLOC_|SLURMD_)")
_TOKEN = re.compile(re.escape(RESUBMIT_TOKEN_KEY) + r"([A-Za-z0-9.]+)")


def comment_with_token(comment: str, token: str) -> str:
    """The job's own comment with Rebound's token after a ``|`` (which ends an opt-in spec; the spec is kept)."""
    mark = f"{RESUBMIT_TOKEN_KEY}{token}"
    base = _TOKEN.sub("", comment).rstrip(" |")  # a comment captured from a resubmission carries an old token
    return f"{base} |{mark}" if base else mark


def token_in(comment: str) -> str | None:
    """The resubmission token a comment carries, if any (a hint to look up Rebound's record, never a claim)."""
    m = _TOKEN.search(comment)
    return m.group(1) if m else None


#: ``SubmissionOptions`` fields passed to sbatch as ``flag=value`` when set (not empty, not zero); the options that
#: depend on other fields (tasks per node, memory) are decided in ``sbatch_arguments``.
_PLAIN_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--job-name", "name"),
    ("--partition", "partition"),
    ("--nodes", "nodes"),
    ("--ntasks", "ntasks"),
    ("--cpus-per-task", "cpus_per_task"),
    ("--gres", "gres"),
    ("--time", "time_limit_min"),
    ("--output", "output"),
    ("--error", "error"),
    ("--account", "account"),
    ("--qos", "qos"),
)


def sbatch_arguments(
    options: SubmissionOptions,
    *,
    user_id: int,
    group_id: int,
    working_directory: str,
    exclude: Iterable[str],
    token: str,
) -> list[str]:
    """``sbatch`` arguments that submit the job again as its owner, off ``exclude``, its comment tokened.

    The script comes on stdin; its own ``#SBATCH`` lines are read again by sbatch, and the options recorded by
    Slurm, given here on the command line, take precedence over them (as they did for the original submission,
    whose command-line options Slurm recorded together with the script's).
    """
    args = [
        "--parsable",
        f"--uid={user_id}",
        f"--gid={group_id}",
        f"--chdir={working_directory}",
        "--export=ALL",
        f"--comment={comment_with_token(options.comment, token)}",
    ]
    args += [f"{flag}={getattr(options, field)}" for flag, field in _PLAIN_OPTIONS if getattr(options, field)]
    # Slurm reports a derived tasks-per-node too: pass it only when it agrees with the task and node counts.
    if options.ntasks_per_node and (not options.ntasks or options.ntasks == options.ntasks_per_node * options.nodes):
        args.append(f"--ntasks-per-node={options.ntasks_per_node}")
    # One memory request: per node wins over per CPU (Slurm rejects both at once).
    if options.mem_per_node_mb:
        args.append(f"--mem={options.mem_per_node_mb}M")
    elif options.mem_per_cpu_mb:
        args.append(f"--mem-per-cpu={options.mem_per_cpu_mb}M")
    excluded = sorted({*options.excluded_nodes, *exclude})
    if excluded:
        args.append(f"--exclude={compress(excluded)}")
    args.append("--requeue" if options.requeue else "--no-requeue")
    return args


def parse_environ(raw: bytes) -> dict[str, str]:
    """A NUL-separated environment (``/proc/<pid>/environ``) as a mapping; malformed entries are dropped."""
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return env


def parse_saved_environment(raw: bytes) -> dict[str, str] | None:
    """slurmctld's saved job environment (``StateSaveLocation/hash.N/job.J/environment``), or None if malformed.

    Layout (Slurm 22.05, verified on the lab): a ``uint32`` count in the controller's byte order, then that many
    NUL-terminated ``NAME=value`` strings. Read on the controller's host, so the native byte order is its.
    """
    if len(raw) < 4:
        return None
    (count,) = struct.unpack("=I", raw[:4])
    entries = raw[4:].split(b"\0")
    if len(entries) < count + 1 or any(entries[count:]):
        return None
    env = parse_environ(b"\0".join(entries[:count]))
    return env if len(env) == count else None


def job_environment(captured: Mapping[str, str] | None, *, user_id: int) -> tuple[dict[str, str], str]:
    """The environment sbatch runs with (``--export=ALL`` hands it to the job), and a note saying what it is.

    Captured: the job's own variables, without those Slurm sets for a job (the new job gets its own). Not
    captured: a minimal login-like environment (``HOME``, ``USER``, ``LOGNAME``, ``SHELL`` from the owner's
    passwd entry, ``MINIMAL_PATH``), said so in the note. (The adapter sets ``SLURM_CONF`` to its own, so
    sbatch reaches the cluster it reads.)
    """
    if captured is not None:
        env = {k: v for k, v in captured.items() if not _SLURM_OWNED.match(k)}
        note = f"the job's captured environment ({len(env)} variables, Slurm's own left out)"
    else:
        env = {"PATH": MINIMAL_PATH}
        try:
            entry = pwd.getpwuid(user_id)
        except KeyError:
            note = f"environment not captured; uid {user_id} unknown on the worker: PATH only"
        else:
            env |= {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name, "SHELL": entry.pw_shell}
            note = "environment not captured: a minimal login environment (HOME, USER, LOGNAME, SHELL, PATH)"
    return env, note
