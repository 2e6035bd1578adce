"""Which jobs Rebound may touch, and how: the job's own opt-in comment, or an operator's selector. Pure.

A job opts in through Slurm itself, in its comment::

    sbatch --comment 'rebound: ckpt=/ckpt/run1;budget=3;policy=default;logs=/runs/x/logs/job-%j-rank-*.log' ...

Grammar of the comment (``parse_comment``):

* The marker is the word ``rebound``, at the start of the comment or after whitespace, ``;``, ``,`` or ``|``,
  so it can follow other text (``--comment 'team=nlp; rebound: budget=2'``).
* ``rebound:`` is followed by ``key=value`` pairs separated by ``;`` or whitespace, up to the end of the comment
  or up to a ``|``, after which other text may follow again. Values cannot contain spaces.
* ``rebound`` on its own (the whole comment, or one ``;``/``,``/``|``-separated item of it) opts in with the
  defaults; in running prose (``tested the rebound fix``) it does not.
* Keys: ``ckpt`` (absolute checkpoint directory), ``budget`` (restarts Rebound may spend, 0..100), ``policy``
  (a policy name), ``logs`` (absolute glob of the ranks' output, ``%j`` = job id; may repeat or be
  comma-separated), ``hang`` (the job's hang window: ``600``, ``90s``, ``10m``, ``1h``), ``heartbeat``
  (absolute glob of files the ranks touch while alive; like ``logs``), ``stragglers`` (``off``, ``report`` or
  ``restart``), ``restart`` (``auto``, ``requeue`` or ``resubmit``: ``workflows.policy.restart_strategy``),
  ``monitor`` (``on``, the default, or ``off``: its owner's pause, read again before every action Rebound would
  take for the job: ``workflows.policy.owner_steering``),
  ``ckpt_fallback`` (``off`` or ``quarantine``: what may be done about a partial newest checkpoint).
* Every value is a request, held under the operator's ceilings (below): ``budget``, ``hang``, ``stragglers``,
  ``ckpt_fallback``, ``logs`` and ``heartbeat`` may be clamped, never refused for being too much.
* An unknown key, a bad value, a repeated single-valued key or ``rebound key=value`` without the colon raise
  ``OptInError`` naming the key. The caller treats that as "not opted in" and warns: guessing what a mistyped
  spec meant (``budget=O``) could restart a job its owner wanted left alone.

Operators opt jobs in without touching them through ``JobSelector``s (partitions, users, a name pattern; all
given criteria must match). ``spec_for`` combines both: the job's comment wins, key by key, over the first
selector that matches, but under the operator's ceilings (``workflows.policy.optin_caps``): the ``optin.*``
settings bound ``budget`` (``optin.max_budget``), ``hang`` (``optin.min_hang_s`` .. ``optin.max_hang_s``),
``stragglers`` (``optin.stragglers``), ``ckpt_fallback`` (``optin.checkpoint_fallback``) and the ``logs``/``heartbeat``
globs (``optin.max_log_patterns`` each, ``**`` only with ``optin.recursive_globs``); a matching selector's own
explicit values are ceilings too (the lower wins). A clamped ask is not an error: the job is watched with the
clamped value and its timeline says what was clamped and by which setting. A job that neither opted in nor was
selected is never touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError, field_validator

from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import RecoverySpec
from workflows.domain.slurm import SlurmJob
from workflows.policy.optin_caps import apply_caps

__all__ = [
    "OptInError",
    "JobSelector",
    "UnsupportedJob",
    "checkpoint_fallback",
    "parse_comment",
    "select",
    "spec_for",
    "with_fallback",
]

#: Comment key -> ``RecoverySpec`` field.
KEYS = {
    "ckpt": "checkpoint_dir",
    "budget": "restart_budget",
    "policy": "policy",
    "logs": "logs",
    "hang": "hang_after_s",
    "heartbeat": "heartbeat",
    "stragglers": "stragglers",
    "restart": "restart",
    "ckpt_fallback": "checkpoint_fallback",
    "monitor": "monitor",
}
#: Keys that may repeat or list several comma-separated globs.
_GLOB_KEYS = ("logs", "heartbeat")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
_FIELD_TO_KEY = {field: key for key, field in KEYS.items()}

# ``rebound`` as a word of its own: not part of a path, a name or a value (``/opt/rebound``, ``policy=rebound``).
_MARKER = re.compile(r"(?:^|(?<=[\s;,|]))rebound(?=$|[\s;,|:])")
_ITEM_SEPARATORS = re.compile(r"[;,|]")
_TOKEN_SEPARATORS = re.compile(r"[;\s]+")
_LOOSE_SEPARATORS = re.compile(r"[;,\s]+")
_POLICY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


class OptInError(ValueError):
    """A ``rebound`` opt-in comment that cannot be understood; ``key`` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        """Build the error.

        Args:
            key: The comment key at fault (``budget``), or ``rebound`` for the marker itself.
            message: What is wrong and what was expected.
        """
        super().__init__(f"rebound opt-in comment: {key}: {message}")
        self.key = key


class UnsupportedJob(OptInError):
    """A job that opted in (or was selected) but that Rebound cannot watch without mis-mapping it; left alone and
    reported like a malformed opt-in, with the reason."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, f"rebound: job not supported: {message}")
        self.key = "rebound"


def parse_comment(comment: str) -> RecoverySpec | None:
    """The recovery spec a job's Slurm comment asks for, or None when the comment does not opt in.

    Only the keys the comment gives are set on the result (``model_fields_set``), so ``spec_for`` can lay them
    over a selector's spec.

    Args:
        comment: The job's comment (``SlurmJob.comment``), possibly empty or holding other text too.

    Returns:
        The spec (all defaults for a bare ``rebound``), or None when there is no opt-in marker.

    Raises:
        OptInError: The marker is there but the spec is malformed (see the module docstring).
    """
    for marker in _MARKER.finditer(comment):
        rest = comment[marker.end() :]
        stripped = rest.lstrip()
        if stripped.startswith(":"):
            spec_text = stripped[1:].split("|", 1)[0]
            return _parse_spec(spec_text)
        # ``rebound budget=3`` or ``rebound;budget=3``: a spec without its colon must not pass for a bare opt-in.
        first = next((t for t in _LOOSE_SEPARATORS.split(rest.split("|", 1)[0]) if t), "")
        if "=" in first and first.partition("=")[0].lower() in KEYS:
            raise OptInError("rebound", f"expected 'rebound:' before {first!r} (the colon is missing)")
        if _is_whole_item(comment, marker.start(), marker.end()):
            return RecoverySpec()
        # Otherwise the word is part of running text: keep looking for a real marker.
    return None


class JobSelector(Frozen):
    """An operator's rule that opts matching jobs in with ``spec``; every criterion given must match.

    A selector without criteria matches every job of the cluster.
    """

    partitions: tuple[str, ...] = ()
    """The job runs (or pends) in one of these partitions."""
    users: tuple[str, ...] = ()
    """The job belongs to one of these users."""
    name_regex: str | None = None
    """A regular expression the whole job name must match (``re.fullmatch``)."""
    spec: RecoverySpec = RecoverySpec()
    """How selected jobs are recovered; the job's own comment overrides it key by key."""

    @field_validator("name_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"name_regex {value!r} is not a valid regular expression: {e}") from e
        return value

    def matches(self, job: SlurmJob) -> bool:
        """True when ``job`` meets every criterion of this selector.

        Args:
            job: The job as the scheduler lists it; a pending job may list several partitions, comma-separated.
        """
        if self.partitions:
            job_partitions = {p.strip() for p in job.partition.split(",") if p.strip()}
            if job_partitions.isdisjoint(self.partitions):
                return False
        if self.users and job.user not in self.users:
            return False
        return self.name_regex is None or re.fullmatch(self.name_regex, job.name) is not None


def select(job: SlurmJob, selectors: Iterable[JobSelector]) -> RecoverySpec | None:
    """The spec of the first selector that matches ``job``, or None; the job's comment is not consulted here.

    Args:
        job: The job to match.
        selectors: The operator's selectors, in priority order.
    """
    return next((s.spec for s in selectors if s.matches(job)), None)


def spec_for(job: SlurmJob, selectors: Iterable[JobSelector], caps: OptInCaps | None = None) -> RecoverySpec | None:
    """How to recover ``job``, or None when Rebound must leave it alone.

    The job's own comment wins key by key over the first matching selector (the owner knows the checkpoint
    directory), but only under the operator's ceilings: the ``optin.*`` settings and the selector's own explicit
    values (``workflows.policy.optin_caps``; ``budget=100`` under a selector's ``restart_budget = 3`` gets 3, and
    the clamp is noted in ``RecoverySpec.capped``). A malformed comment is not overruled by a selector: the job's
    owner asked for something we cannot read, so nothing is done.

    Args:
        job: The job to decide on.
        selectors: The operator's selectors, in priority order.
        caps: The operator's ceilings on a comment's asks; None: the defaults of ``OptInCaps``.

    Raises:
        OptInError: The job's comment carries a malformed ``rebound`` spec; ``UnsupportedJob`` when the job opted
            in (or was selected) but is of a kind Rebound cannot watch safely: a heterogeneous job's component.
    """
    own = parse_comment(job.comment)
    selected = select(job, selectors)
    if (own is not None or selected is not None) and job.is_heterogeneous:
        raise UnsupportedJob(
            f"heterogeneous job (component +{job.het_job_offset} of {job.het_job_id}), not watched: its components'"
            " logs, ranks and nodes cannot yet be mapped as one job"
        )
    if own is None:
        return selected
    merged = own if selected is None else selected.model_copy(update={n: getattr(own, n) for n in own.model_fields_set})
    return apply_caps(merged, own.model_fields_set, selected, caps or OptInCaps())


def with_fallback(spec: RecoverySpec, operator_default: CheckpointFallback) -> RecoverySpec:
    """``spec`` with its checkpoint fallback decided: the job's own (comment or selector), else the operator's.

    Args:
        spec: The job's spec (``spec_for``).
        operator_default: The operator's setting (``checkpoints.fallback``).
    """
    if spec.checkpoint_fallback is not None:
        return spec
    return spec.model_copy(update={"checkpoint_fallback": operator_default})


def checkpoint_fallback(spec: RecoverySpec) -> CheckpointFallback:
    """What may be done about a partial newest checkpoint of this job before a restart (off when undecided)."""
    return spec.checkpoint_fallback or CheckpointFallback.OFF


def _is_whole_item(comment: str, start: int, end: int) -> bool:
    """True when ``comment[start:end]`` is alone between item separators (or the comment's ends)."""
    before = _ITEM_SEPARATORS.split(comment[:start])[-1]
    after = _ITEM_SEPARATORS.split(comment[end:], maxsplit=1)[0]
    return not before.strip() and not after.strip()


def _parse_spec(text: str) -> RecoverySpec:
    fields: dict[str, Any] = {}
    globs: dict[str, list[str]] = {key: [] for key in _GLOB_KEYS}
    for token in _TOKEN_SEPARATORS.split(text.strip()):
        if not token:
            continue
        raw_key, sep, value = token.partition("=")
        key = raw_key.lower()
        if not sep or not raw_key:
            raise OptInError(token, "expected key=value")
        if key not in KEYS:
            raise OptInError(raw_key, f"unknown key (expected one of {', '.join(KEYS)})")
        if not value:
            raise OptInError(key, "empty value")
        if key in globs:
            globs[key] += [_absolute(key, pattern) for pattern in value.split(",") if pattern]
            continue
        if KEYS[key] in fields:
            raise OptInError(key, "given more than once")
        fields[KEYS[key]] = _value(key, value)
    for key, patterns in globs.items():
        if patterns:
            fields[KEYS[key]] = tuple(patterns)
    try:
        return RecoverySpec(**fields)
    except ValidationError as e:
        error = e.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        raise OptInError(_FIELD_TO_KEY.get(field, field), str(error["msg"])) from e


def _value(key: str, value: str) -> object:
    if key == "budget":
        if not (value.isascii() and value.isdigit()):
            raise OptInError(key, f"expected a whole number of restarts, got {value!r}")
        return int(value)
    if key == "policy":
        if not _POLICY_NAME.fullmatch(value):
            raise OptInError(key, f"expected a policy name (letters, digits, _ . -), got {value!r}")
        return value
    if key == "hang":
        m = _DURATION.fullmatch(value.lower()) if value.isascii() else None
        if m is None:
            raise OptInError(key, f"expected a duration such as 600, 90s, 10m or 1h, got {value!r}")
        return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if key == "monitor":
        if value.lower() not in ("on", "off"):
            raise OptInError(key, f"expected on or off, got {value!r}")
        return value.lower() == "on"
    if key == "stragglers":
        if value.lower() not in ("off", "report", "restart"):
            raise OptInError(key, f"expected off, report or restart, got {value!r}")
        return value.lower()
    if key == "restart":
        if value.lower() not in ("auto", "requeue", "resubmit"):
            raise OptInError(key, f"expected auto, requeue or resubmit, got {value!r}")
        return value.lower()
    if key == "ckpt_fallback":
        if value.lower() not in {f.value for f in CheckpointFallback}:
            raise OptInError(key, f"expected quarantine or off, got {value!r}")
        return CheckpointFallback(value.lower())
    return _absolute(key, value)


def _absolute(key: str, path: str) -> str:
    # Rebound reads these from outside the job, where a relative path has no meaning.
    if not path.startswith("/"):
        raise OptInError(key, f"expected an absolute path, got {path!r}")
    return path
