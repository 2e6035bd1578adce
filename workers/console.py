"""What every ``rebound`` command shares: its exit codes and its JSON output.

Exit codes: 0 success, 1 failure, 2 usage error, 3 Temporal unreachable, 4 not found, 5 refused (not an operator,
approval not pending).
"""

from __future__ import annotations

import json

from workflows.domain.errors import FailureKind

__all__ = [
    "EXIT_FAIL",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "exit_code_for",
    "print_json",
]

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
#: The Fleet or a JobRecovery refused the request (not an operator, unknown or already decided approval).
EXIT_REFUSED = 5


def exit_code_for(kind: FailureKind) -> int:
    """The exit code of a command that failed with a ``ReboundError`` of this kind."""
    if kind is FailureKind.TEMPORAL_UNREACHABLE:
        return EXIT_UNREACHABLE
    if kind in (FailureKind.JOB_NOT_FOUND, FailureKind.NODE_NOT_FOUND):
        return EXIT_NOT_FOUND
    return EXIT_FAIL


def print_json(data: object) -> None:
    """Machine-readable output (``--json``): indented, with dates and paths as strings."""
    print(json.dumps(data, indent=2, default=str))
