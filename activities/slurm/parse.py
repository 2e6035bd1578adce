"""Pure parsing of Slurm's JSON (``squeue --json``/``sinfo --json`` and slurmrestd ``v0.0.38``) into domain models.

The CLI and slurmrestd emit the same ``openapi/v0.0.38`` data (byte-identical on 22.05.8), so one parser serves
both. What Slurm 22.05 says versus what the models say (verified on a real cluster, see tests/data/slurm):

* ``exit_code`` is the raw wait status: ``768`` is exit 3, ``9`` is SIGKILL. It is decoded, and only kept once
  the job is terminal: a running or requeued job carries leftovers.
* ``end_time`` of a running job is a projected limit (a year ahead with no time limit, year 2163 for a requeued
  COMPLETING job); ``start_time`` of a pending job is an estimate. Both become None until they are real.
* ``standard_output`` keeps the unexpanded pattern (``train-%j.out``), and is empty when sbatch used its default
  ``slurm-%j.out``; ``standard_error`` is empty when stderr goes to the stdout file. Both are resolved here.
* Array tasks carry ``array_job_id`` (the master, ``%A``) and ``array_task_id`` (``%a``); their ``job_id`` is the
  task's own (``%j``); a job that is not an array task has ``array_job_id`` 0 and ``array_task_id`` null. Each
  component of a heterogeneous job is listed with its own ``job_id``, ``het_job_id`` (the leader's id),
  ``het_job_id_set`` and ``het_job_offset``; other jobs have ``het_job_id`` 0.
* ``state_reason`` is ``"None"`` when there is no reason; a pending job's details are in ``state_description``.
* Hostlists (``nodes``, ``excluded_nodes``) are kept as typed (``n[1-2],n4,n3``) and are expanded here.
* With slurmctld down, squeue/sinfo still exit 0 and print ``errors: [{"error_number": -1, "error":
  "Unspecified error"}]`` with an empty list: an empty list is only trusted when ``errors`` is empty.

Unknown states map to ``UNKNOWN``. Structurally broken payloads raise ``SCHEDULER_BAD_RESPONSE``. Newer Slurm
shapes are accepted where that costs one branch: list-valued states (``["IDLE", "DRAIN"]``), ``{"set", "number"}``
numbers and ``{"return_code", "signal"}`` exit codes (v0.0.39+), and ``"MIXED+DRAIN"`` strings (pyslurm).
"""

from __future__ import annotations

import json
import os.path
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from activities.slurm.errors import bad_response, raise_for_api_errors
from activities.slurm.gres import gpu_count, job_gpus_per_node
from activities.slurm.json_fields import JsonFields, plain_number
from workflows.domain.slurm import JobState, NodeBaseState, SlurmJob, SlurmNode
from workflows.domain.submission import SubmissionOptions, SubmittedJob

__all__ = [
    "decode_exit_status",
    "epoch_to_datetime",
    "expand_output_path",
    "job_state",
    "load_payload",
    "node_state",
    "parse_job",
    "parse_jobs",
    "parse_node",
    "parse_nodes",
    "parse_submission",
]

# Slurm's NO_VAL (0xfffffffe) and INFINITE (0xffffffff) are "no time", not dates in 2106.
_NO_TIME = 0xFFFFFFFE
_OUTPUT_PATTERN = re.compile(r"%(\d*)([%AajuxN])")
_MAX_PAD = 10
# uid_t's NO_VAL/INFINITE ("no user"); Slurm never gives a real user these.
_NO_UID = 0xFFFFFFFE


def load_payload(raw: bytes | str, *, source: str) -> dict[str, object]:
    """Decode a JSON document and check that it is an object.

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when ``raw`` is not a JSON object.
    """
    try:
        data: object = json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise _bad(source, f"output is not JSON ({e}): {_preview(raw)}") from e
    if not isinstance(data, dict):
        raise _bad(source, f"expected a JSON object, got {type(data).__name__}")
    return data


def parse_jobs(payload: Mapping[str, object], *, source: str = "squeue --json") -> tuple[SlurmJob, ...]:
    """All jobs of a ``squeue --json`` or ``GET /slurm/v0.0.38/jobs`` payload.

    Raises:
        ReboundError: Classified ``errors`` in the payload, or ``SCHEDULER_BAD_RESPONSE`` for a broken one.
    """
    raise_for_api_errors(payload, source=source)
    return tuple(parse_job(item, source=source) for item in _list(payload, "jobs", source))


def parse_nodes(payload: Mapping[str, object], *, source: str = "sinfo --json") -> tuple[SlurmNode, ...]:
    """All nodes of a ``sinfo --json`` or ``GET /slurm/v0.0.38/nodes`` payload.

    Raises:
        ReboundError: Classified ``errors`` in the payload, or ``SCHEDULER_BAD_RESPONSE`` for a broken one.
    """
    raise_for_api_errors(payload, source=source)
    return tuple(parse_node(item, source=source) for item in _list(payload, "nodes", source))


def parse_job(item: object, *, source: str = "squeue --json") -> SlurmJob:
    """One entry of ``jobs``.

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when the entry is not an object, has no integer ``job_id``,
            or a field has a type Slurm never uses for it.
    """
    f = JsonFields(item, source, "job")
    job_id = f.number("job_id")
    if job_id is None:
        raise _bad(source, "a job has no 'job_id'")
    f.what = f"job {job_id}"
    state = job_state(f.raw("job_state"))
    ended = state.is_terminal()
    exit_code, exit_signal = decode_exit_status(f.raw("exit_code")) if ended else (None, None)
    name, user, cwd = f.text("name"), f.text("user_name"), f.text("current_working_directory")
    batch_host = f.text("batch_host")
    array_job_id = f.number("array_job_id") or None
    array_task_id = f.number("array_task_id") if array_job_id else None
    het_job_id = f.number("het_job_id") or None
    stdout = f.text("standard_output")
    if not stdout and f.flag("batch_flag"):
        # sbatch's default is applied by slurmstepd, so Slurm never stores it (verified: the field is empty).
        stdout = "slurm-%A_%a.out" if array_job_id else "slurm-%j.out"
    stderr = f.text("standard_error") or stdout

    def path(pattern: str) -> str:
        return expand_output_path(
            pattern,
            job_id=job_id,
            name=name,
            user=user,
            batch_host=batch_host,
            array_job_id=array_job_id,
            array_task_id=array_task_id,
            working_directory=cwd,
        )

    reason = f.text("state_reason")
    return SlurmJob(
        job_id=job_id,
        name=name,
        user=user,
        user_id=_uid(f.number("user_id")),
        partition=f.text("partition"),
        state=state,
        state_reason="" if reason == "None" else reason,
        state_description=f.text("state_description"),
        nodes=f.hostlist("nodes"),
        # While a job completes, ``nodes`` lists only the nodes still completing (lab: "n2" of "n[1-2]"); read for
        # COMPLETING jobs only, so a large listing's parse costs no more.
        allocated_nodes=f.hostlist("job_resources.nodes") if state is JobState.COMPLETING else (),
        batch_host=batch_host,
        restart_count=f.number("restart_cnt") or 0,
        requeue_allowed=f.flag("requeue"),
        excluded_nodes=f.hostlist("excluded_nodes"),
        required_nodes=f.hostlist("required_nodes"),
        node_count=f.number("node_count") or 0,
        task_count=f.number("tasks") or 0,
        exit_code=exit_code,
        exit_signal=exit_signal,
        comment=f.text("comment"),
        standard_output=path(stdout),
        standard_error=path(stderr),
        working_directory=cwd,
        submit_time=epoch_to_datetime(f.number("submit_time")),
        eligible_time=epoch_to_datetime(f.number("eligible_time")),
        start_time=None if state is JobState.PENDING else epoch_to_datetime(f.number("start_time")),
        end_time=epoch_to_datetime(f.number("end_time")) if ended else None,
        tres_per_node=f.text("tres_per_node"),
        gpus_per_node=None if f.raw("tres_per_node") is None else job_gpus_per_node(f.text),
        cpus_per_node=0 if f.text("cpus_per_tres") else f.number("minimum_cpus_per_node") or 0,  # see gres.py
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        het_job_id=het_job_id,
        het_job_offset=f.number("het_job_offset") if het_job_id else None,
    )


def parse_submission(item: object, *, source: str = "squeue --json") -> SubmittedJob:
    """The submission options of one entry of ``jobs``, as ``sbatch`` would take them again (ADR 014).

    Output patterns are kept as submitted (``%j`` stays: the new job fills in its own id).

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` as for ``parse_job``, and for a job without owner or directory.
    """
    f = JsonFields(item, source, "job")
    job_id = f.number("job_id")
    uid, gid, cwd = _uid(f.number("user_id")), _uid(f.number("group_id")), f.text("current_working_directory")
    if job_id is None or uid is None or gid is None or not cwd:
        raise _bad(source, f"job {job_id}: no owner (user_id/group_id) or working directory to resubmit it with")

    def count(key: str) -> int:
        value = f.number(key)
        return value if value is not None and 0 < value < _NO_TIME else 0

    gres = ",".join(g.removeprefix("gres:") for g in f.text("tres_per_node").split(",") if g)
    options = SubmissionOptions(
        name=f.text("name"),
        partition=f.text("partition"),
        nodes=count("node_count"),
        ntasks=count("tasks"),
        ntasks_per_node=count("tasks_per_node"),
        cpus_per_task=count("cpus_per_task"),
        gres=gres,
        time_limit_min=count("time_limit"),
        mem_per_node_mb=count("memory_per_node"),
        mem_per_cpu_mb=count("memory_per_cpu"),
        output=f.text("standard_output"),
        error=f.text("standard_error"),
        comment=f.text("comment"),
        account=f.text("account"),
        qos=f.text("qos"),
        excluded_nodes=f.hostlist("excluded_nodes"),
        requeue=f.flag("requeue"),
    )
    return SubmittedJob(
        job_id=job_id, user=f.text("user_name"), user_id=uid, group_id=gid, working_directory=cwd, options=options
    )


def parse_node(item: object, *, source: str = "sinfo --json") -> SlurmNode:
    """One entry of ``nodes``.

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when the entry is not an object, has no ``name``, or a field
            has a type Slurm never uses for it.
    """
    f = JsonFields(item, source, "node")
    name = f.text("name")
    if not name:
        raise _bad(source, "a node has no 'name'")
    f.what = f"node {name}"
    state, flags = node_state(f.raw("state"), f.raw("state_flags"))
    return SlurmNode(
        name=name,
        state=state,
        flags=flags,
        reason=f.text("reason"),
        reason_set_by_user=f.text("reason_set_by_user"),
        reason_changed_at=epoch_to_datetime(f.number("reason_changed_at")),
        partitions=f.texts("partitions"),
        gres=f.text("gres"),
        gres_used=f.text("gres_used"),
        cpus=f.number("cpus") or 0,
        alloc_cpus=f.number("alloc_cpus") or 0,
        gpus=None if f.raw("gres") is None else gpu_count(f.text("gres")),
    )


def job_state(value: object) -> JobState:
    """Slurm's job state (``"RUNNING"``, or ``["RUNNING", ...]`` in newer versions); ``UNKNOWN`` if unknown."""
    for word in _words(value):
        try:
            return JobState(word.upper())
        except ValueError:
            continue
    return JobState.UNKNOWN


def node_state(state: object, flags: object = None) -> tuple[NodeBaseState, tuple[str, ...]]:
    """A node's base state and upper-case flags.

    Accepts 22.05's ``state="mixed", state_flags=["DRAIN"]``, newer ``state=["MIXED", "DRAIN"]`` and pyslurm's
    ``"MIXED+DRAIN"``; a trailing ``*`` (sinfo's "not responding") becomes the ``NOT_RESPONDING`` flag.
    """
    base = NodeBaseState.UNKNOWN
    found_base = False
    collected: list[str] = []
    for word in [*_words(state), *_words(flags)]:
        if word.endswith("*"):
            word = word.rstrip("*")
            collected.append("NOT_RESPONDING")
        try:
            candidate = NodeBaseState(word.lower())
        except ValueError:
            collected.append(word.upper())
            continue
        if not found_base:
            base, found_base = candidate, True
    return base, tuple(dict.fromkeys(c for c in collected if c))


def decode_exit_status(raw: object) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` from a wait status (22.05: ``768`` -> ``(3, None)``, ``9`` -> ``(None, 9)``).

    Also accepts v0.0.39+'s ``{"return_code": .., "signal": {"id": ..}}``. Anything else gives ``(None, None)``.
    """
    if isinstance(raw, int) and not isinstance(raw, bool):
        signal = raw & 0x7F
        return (None, signal) if signal else ((raw >> 8) & 0xFF, None)
    if isinstance(raw, Mapping):
        signal_info = raw.get("signal")
        signal_id = plain_number(signal_info.get("id")) if isinstance(signal_info, Mapping) else None
        if signal_id:
            return None, signal_id
        return plain_number(raw.get("return_code")), None
    return None, None


def epoch_to_datetime(value: int | None) -> datetime | None:
    """Seconds since the epoch as an aware UTC datetime; 0, NO_VAL, INFINITE and None give None."""
    if value is None or value <= 0 or value >= _NO_TIME:
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def expand_output_path(
    pattern: str,
    *,
    job_id: int,
    name: str = "",
    user: str = "",
    batch_host: str = "",
    array_job_id: int | None = None,
    array_task_id: int | None = None,
    working_directory: str = "",
) -> str:
    """Fill in the filename patterns Slurm knows for a batch job's output, relative to its working directory.

    ``%%``, ``%j``, ``%x``, ``%u``, ``%N``, ``%A`` and ``%a`` (with optional zero padding, ``%4j``) are
    expanded; step-level patterns (``%s``, ``%t``, ``%n``, ``%J``) are left as they are. A backslash anywhere
    disables expansion, as in Slurm.
    """
    if not pattern:
        return ""
    if "\\" in pattern:
        result = pattern.replace("\\", "")
    else:

        def substitute(match: re.Match[str]) -> str:
            width, code = match.group(1), match.group(2)
            numbers = {"j": job_id, "A": array_job_id or job_id, "a": array_task_id}
            if code == "%":
                return "%"
            if code in numbers:
                number = numbers[code]
                # Slurm pads to 10 at most; the job owner writes the width (%99999999999j must not crash or eat RAM).
                digits = width.lstrip("0")
                pad = _MAX_PAD if len(digits) > 2 else min(int(digits or 0), _MAX_PAD)
                return match.group(0) if number is None else str(number).zfill(pad)
            text = {"x": name, "u": user, "N": batch_host}[code]
            return text or match.group(0)

        result = _OUTPUT_PATTERN.sub(substitute, pattern)
    if working_directory and not os.path.isabs(result):
        result = os.path.join(working_directory, result)
    return result


def _uid(value: int | None) -> int | None:
    return value if value is not None and 0 <= value < _NO_UID else None


def _words(value: object) -> list[str]:
    if isinstance(value, str):
        return [w for w in value.split("+") if w]
    if isinstance(value, list):
        return [w for w in value if isinstance(w, str) and w]
    return []


def _list(payload: Mapping[str, object], key: str, source: str) -> list[object]:
    value = payload.get(key)
    if not isinstance(value, list):
        raise _bad(source, f"'{key}' is missing or not a list (got {type(value).__name__})")
    return value


_bad = bad_response


def _preview(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return repr(text[:120])
