"""What a job's comment asked for, held under the operator's ceilings. Pure.

The job's owner writes its comment, so each key is a request: ``apply_caps`` clamps the keys a comment decides
(the ones it gives, and the defaults of a job that only its comment opted in) under two ceilings, the lower
winning: the operator's ``optin.*`` settings (``OptInCaps``) and the explicit values of the selector that also
matched the job. A selector's own values are the operator's and are never clamped. Each clamp leaves a note in
``RecoverySpec.capped`` (``budget=100 capped at 3 by operator policy (selector)``); JobRecovery puts the notes in
the job's timeline as ``CAPPED`` entries and its status's note.

Direction of each ceiling: the budget and the straggler action (off < report < restart) and the checkpoint
fallback (off < quarantine) may not exceed it; the hang window may not be shorter than ``min_hang_s`` (or the
selector's window) nor longer than ``max_hang_s``; log and heartbeat globs are cut to ``max_log_patterns`` each
and, unless ``recursive_globs``, lose every pattern with a ``**`` component.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import RecoverySpec, StragglerAction

__all__ = ["apply_caps"]

_STRAGGLER_ORDER = (StragglerAction.OFF, StragglerAction.REPORT, StragglerAction.RESTART)
_FALLBACK_ORDER = (CheckpointFallback.OFF, CheckpointFallback.QUARANTINE)
_SELECTOR = "the job's selector"


def apply_caps(
    spec: RecoverySpec, asked: Iterable[str], selector: RecoverySpec | None, caps: OptInCaps
) -> RecoverySpec:
    """``spec`` with every field its comment decides held under the ceilings, and a note per clamp in ``capped``.

    Args:
        spec: The job's spec, the comment laid over the selector's (``workflows.policy.optin.spec_for``).
        asked: The ``RecoverySpec`` fields the comment gave (``model_fields_set`` of the parsed comment).
        selector: The spec of the selector that matched the job; None when only the comment opted it in.
        caps: The operator's ceilings (``optin.*`` settings).

    Returns:
        ``spec`` itself when nothing was clamped, else a copy with the clamped values and their notes.
    """
    asked = frozenset(asked)
    chosen = frozenset(selector.model_fields_set) if selector is not None else frozenset()

    def decides(field: str) -> bool:
        # The comment gave it, or nobody did and the default stands for a job only its comment opted in.
        return field in asked or (selector is None and field not in chosen)

    update: dict[str, Any] = {}
    notes: list[str] = []
    if decides("restart_budget"):
        limit, by = _lowest(caps.max_budget, "optin.max_budget", selector, "restart_budget", chosen)
        if spec.restart_budget > limit:
            update["restart_budget"] = limit
            notes.append(f"budget={spec.restart_budget}{_default(asked, 'restart_budget')} capped at {limit} {by}")
    if decides("hang_after_s") and spec.hang_after_s is not None:
        floor, floor_by = caps.min_hang_s, "optin.min_hang_s"
        own = selector.hang_after_s if selector is not None and "hang_after_s" in chosen else None
        if own is not None and own > floor:
            floor, floor_by = own, _SELECTOR
        ceiling = max(caps.max_hang_s, floor)
        if spec.hang_after_s < floor:
            update["hang_after_s"] = floor
            notes.append(f"hang={_secs(spec.hang_after_s)} raised to {_secs(floor)} {_by(floor_by)}")
        elif spec.hang_after_s > ceiling:
            update["hang_after_s"] = ceiling
            notes.append(f"hang={_secs(spec.hang_after_s)} capped at {_secs(ceiling)} {_by('optin.max_hang_s')}")
    if decides("stragglers"):
        top, by = _lowest_ranked(
            caps.stragglers, "optin.stragglers", selector, "stragglers", chosen, order=_STRAGGLER_ORDER
        )
        if _STRAGGLER_ORDER.index(spec.stragglers) > _STRAGGLER_ORDER.index(top):
            update["stragglers"] = top
            notes.append(f"stragglers={spec.stragglers.value} capped at {top.value} {by}")
    if "checkpoint_fallback" in asked and spec.checkpoint_fallback is not None:
        top_fb, by = _lowest_ranked(
            caps.checkpoint_fallback,
            "optin.checkpoint_fallback",
            selector,
            "checkpoint_fallback",
            chosen,
            order=_FALLBACK_ORDER,
        )
        if _FALLBACK_ORDER.index(spec.checkpoint_fallback) > _FALLBACK_ORDER.index(top_fb):
            update["checkpoint_fallback"] = top_fb
            notes.append(f"ckpt_fallback={spec.checkpoint_fallback.value} capped at {top_fb.value} {by}")
    for field, key in (("logs", "logs"), ("heartbeat", "heartbeat")):
        if field in asked:
            kept, dropped = _globs(getattr(spec, field), caps, key)
            if dropped:
                update[field] = kept
                notes += dropped
    if not notes:
        return spec
    return spec.model_copy(update={**update, "capped": (*spec.capped, *notes)})


def _lowest(
    cap: int, cap_name: str, selector: RecoverySpec | None, field: str, chosen: frozenset[str]
) -> tuple[int, str]:
    """The lower of the setting's and the selector's ceiling, and the phrase naming it."""
    if selector is not None and field in chosen and getattr(selector, field) < cap:
        return getattr(selector, field), _by(_SELECTOR)
    return cap, _by(cap_name)


def _lowest_ranked(
    cap: Any,
    cap_name: str,
    selector: RecoverySpec | None,
    field: str,
    chosen: frozenset[str],
    *,
    order: tuple[Any, ...],
) -> tuple[Any, str]:
    value = getattr(selector, field) if selector is not None and field in chosen else None
    if value is not None and order.index(value) < order.index(cap):
        return value, _by(_SELECTOR)
    return cap, _by(cap_name)


def _globs(patterns: tuple[str, ...], caps: OptInCaps, key: str) -> tuple[tuple[str, ...], list[str]]:
    """The patterns a comment may have, and a note for each one dropped (at most two notes: recursion, count)."""
    kept: list[str] = []
    recursive: list[str] = []
    for pattern in patterns:
        if not caps.recursive_globs and "**" in pattern.split("/"):
            recursive.append(pattern)
        else:
            kept.append(pattern)
    notes: list[str] = []
    if recursive:
        notes.append(
            f"{key}={recursive[0]!r:.120} dropped: '**' walks whole trees {_by('optin.recursive_globs')}"
            + (f" ({len(recursive) - 1} more such pattern(s) dropped)" if len(recursive) > 1 else "")
        )
    if len(kept) > caps.max_log_patterns:
        notes.append(
            f"{key}: {len(kept)} patterns capped at {caps.max_log_patterns} {_by('optin.max_log_patterns')}"
            " (the first ones are kept)"
        )
        kept = kept[: caps.max_log_patterns]
    return tuple(kept), notes


def _by(source: str) -> str:
    return f"by operator policy ({source})"


def _default(asked: frozenset[str], field: str) -> str:
    return "" if field in asked else " (the default)"


def _secs(value: float) -> str:
    return f"{value:g}s"
