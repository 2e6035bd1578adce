"""Which log files a job may make Rebound read: a security boundary, not a convenience.

A job names its log files itself (``sbatch --comment 'rebound: logs=...'``, or its ``--output``), and the worker
that reads them usually runs as root and quotes what it read in incident evidence. Without a policy a job owner
could point Rebound at ``/etc/shadow`` or at another user's files. ``LogAccess`` says what may be read:

* **Roots.** With roots configured, a file is readable only if its real path (every symlink resolved) lies
  under one of them. A pattern is checked before it is globbed: it must be absolute, have no ``..`` component,
  and its literal leading directories (up to the first wildcard) must resolve under a root, so Rebound never
  even lists a directory outside the roots.
* **Owner.** With an owner uid, a file must belong to that user: a job makes Rebound read its own user's files
  only (this also defeats hard links to someone else's file, which no root check can see).

``LogTail`` applies the checks to every file it opens: the roots before opening (symlinks resolved), the owner on
the file's ``stat``, and both again on the opened descriptor (its real path via ``/proc/self/fd``), so a symlink
swapped between check and open is caught too. Whatever fails is skipped and reported with its reason.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LogAccess"]

# Linux names an open descriptor's file here; where it does not exist, the checks before opening stand alone.
_FD_PATH = "/proc/self/fd/{fd}"


class LogAccess:
    """The policy for one job's log files: allowed roots and the owner they must belong to.

    Args:
        roots: Directories the files must really lie under (symlinks resolved, also in the roots themselves);
            empty for no root restriction.
        owner_uid: The numeric user id the files must belong to (the job's user); None for no owner check.

    Raises:
        ValueError: A root is not an absolute path, or ``owner_uid`` is negative.
        TypeError: ``owner_uid`` is not an int, or a root is neither ``str`` nor ``Path``.
    """

    def __init__(self, roots: Sequence[Path | str] = (), owner_uid: int | None = None) -> None:
        if isinstance(roots, str | bytes):
            raise TypeError("roots must be a sequence of directories, not a single path")
        resolved: list[str] = []
        for root in roots:
            if not isinstance(root, str | Path):
                raise TypeError(f"a log root must be a path, got {type(root).__name__}: {root!r:.80}")
            text = str(root)
            if not os.path.isabs(text) or "\0" in text:
                raise ValueError(f"a log root must be an absolute path, got {text!r:.200}")
            resolved.append(os.path.realpath(text))
        if owner_uid is not None and (isinstance(owner_uid, bool) or not isinstance(owner_uid, int)):
            raise TypeError(f"owner_uid must be an int or None, got {type(owner_uid).__name__}")
        if owner_uid is not None and owner_uid < 0:
            raise ValueError(f"owner_uid must not be negative, got {owner_uid}")
        self._roots = tuple(dict.fromkeys(resolved))
        self._owner_uid = owner_uid
        self._closed: str | None = None

    @classmethod
    def for_job(cls, roots: Sequence[Path | str], user_id: int | None, *, require_owner: bool) -> LogAccess:
        """The policy for a job, from the worker's settings (``watch.log_roots``, ``watch.log_require_owner``).

        Fails closed: when the owner is required but the scheduler did not say who the job's user is, every
        pattern is refused rather than read unchecked.
        """
        if require_owner and user_id is None:
            access = cls(roots)
            access._closed = "the job's numeric user id is unknown, so file ownership cannot be checked"
            return access
        return cls(roots, user_id if require_owner else None)

    @property
    def roots(self) -> tuple[str, ...]:
        """The roots, resolved."""
        return self._roots

    @property
    def owner_uid(self) -> int | None:
        return self._owner_uid

    def check_pattern(self, pattern: str) -> str | None:
        """Why the glob ``pattern`` may not even be listed, or None when it may.

        Args:
            pattern: A glob pattern (srun placeholders already turned into ``*``).
        """
        if self._closed is not None:
            return self._closed
        if not self._roots:
            return None
        if not os.path.isabs(pattern):
            return "not an absolute path (log roots are configured)"
        parts = pattern.split("/")
        if ".." in parts:
            return "has a '..' component (log roots are configured)"
        literal: list[str] = []
        for part in parts:
            if glob.has_magic(part):
                break
            literal.append(part)
        prefix = "/".join(literal) or "/"
        return self._outside(prefix, what="its directory")

    def check_path(self, path: str) -> str | None:
        """Why ``path`` may not be opened, judged by its real path before opening; None when it may."""
        if self._closed is not None:
            return self._closed
        return self._outside(path, what="it") if self._roots else None

    def check_owner(self, uid: int) -> str | None:
        """Why a file owned by ``uid`` may not be read; None when it may."""
        if self._closed is not None:
            return self._closed
        if self._owner_uid is None or uid == self._owner_uid:
            return None
        return f"owned by uid {uid}, not by the job's user (uid {self._owner_uid})"

    def check_fd(self, fd: int, uid: int) -> str | None:
        """Why the file open as ``fd`` (owned by ``uid``) may not be read: the checks again on what was opened.

        The real path comes from the kernel (``/proc/self/fd``), so a symlink swapped after ``check_path`` is
        caught. Where that is unavailable, only the owner is checked again.
        """
        reason = self.check_owner(uid)
        if reason is not None or not self._roots:
            return reason
        try:
            real = os.readlink(_FD_PATH.format(fd=fd))
        except OSError:
            return None
        real = real.removesuffix(" (deleted)")
        if not real.startswith("/"):
            return None  # not a path (an anonymous file): nothing to compare
        return None if self._under(real) else f"outside the log roots: it is {real!r:.200} ({self._roots_text()})"

    def _outside(self, path: str, *, what: str) -> str | None:
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError) as e:
            return f"cannot resolve {what}: {e}"
        if self._under(real):
            return None
        return f"outside the log roots: {what} resolves to {real!r:.200} ({self._roots_text()})"

    def _under(self, real: str) -> bool:
        return any(root == "/" or real == root or real.startswith(root + "/") for root in self._roots)

    def _roots_text(self) -> str:
        return "roots: " + ", ".join(self._roots)
