"""Turning classified adapter errors into Temporal's ApplicationError, at the activity boundary only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError

from workflows.domain.errors import ReboundError


@contextmanager
def classified_errors() -> Iterator[None]:
    """Re-raise a ``ReboundError`` as ``ApplicationError(type=kind)``; retryable only for transient kinds."""
    try:
        yield
    except ReboundError as e:
        raise ApplicationError(e.message, type=e.kind.value, non_retryable=not e.kind.retryable) from e
