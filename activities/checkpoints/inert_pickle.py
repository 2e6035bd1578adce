"""Reading the plain data out of a pickle without running anything it names.

A checkpoint's pickles (DCP's ``.metadata``, the ``data.pkl`` inside a ``torch.save`` zip) name classes and
functions that an ordinary unpickler would import and call. Rebound runs as root and the files belong to users, so
it never does that: every global the pickle names resolves to a fresh ``Inert`` stand-in class that records the
arguments and state handed to it and does nothing else, and persistent ids (a ``torch.save`` file's tensor storages)
become ``Inert`` too. What survives is the plain structure: dicts, lists, tuples, strings, numbers, and ``Inert``
objects whose ``state`` holds their attributes. A pickle this cannot read raises ``UnreadablePickle``; the callers
then say "unreadable" rather than guess.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["Inert", "UnreadablePickle", "load_inert", "state_of"]

#: The largest pickle read: a DCP ``.metadata`` of a very large model is tens of MiB; more is not a checkpoint's.
MAX_PICKLE_BYTES = 256 * 1024 * 1024


class UnreadablePickle(ValueError):
    """The bytes are not a pickle this reader can take apart (truncated, unknown opcode, too large)."""


class Inert:
    """Stands in for any class or function a pickle names: keeps what it was given, never runs anything."""

    module: str = ""
    qualname: str = ""
    args: tuple[Any, ...]
    state: dict[Any, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:  # NEWOBJ, NEWOBJ_EX: cls.__new__(cls, *args)
        obj = super().__new__(cls)
        obj.args = args
        obj.state = {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE: cls(*args)
        self.args = args

    def __setstate__(self, state: Any) -> None:  # BUILD
        # A dataclass pickles its __dict__; a class with __slots__ pickles (dict or None, slots dict).
        if isinstance(state, tuple) and len(state) == 2:
            merged: dict[Any, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            self.state = merged
        elif isinstance(state, dict):
            self.state = dict(state)
        else:
            self.state = {"__state__": state}

    # Stand-ins are keys of dicts (DCP's MetadataIndex): identity hashing is all that is needed.
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Inert({self.module}.{self.qualname})"


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type[Inert]:
        # A new class per global: nothing from the file is imported, called or looked up in this process.
        return type(name, (Inert,), {"module": module, "qualname": name})

    def persistent_load(self, pid: Any) -> Inert:
        stand_in = Inert()
        stand_in.state = {"__persistent_id__": pid}
        return stand_in


def load_inert(data: bytes) -> Any:
    """The plain structure of a pickle, every named global replaced by an ``Inert`` stand-in.

    Raises:
        UnreadablePickle: The bytes are too large, truncated or not a pickle.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise UnreadablePickle(f"pickle of {len(data)} bytes is larger than {MAX_PICKLE_BYTES}")
    try:
        return _InertUnpickler(io.BytesIO(data)).load()
    except RecursionError as e:
        raise UnreadablePickle("pickle nests too deeply") from e
    except Exception as e:  # noqa: BLE001 - any failure of a hostile or broken pickle means "unreadable"
        raise UnreadablePickle(f"{type(e).__name__}: {e}") from e


def state_of(obj: Any) -> dict[Any, Any]:
    """The attributes an ``Inert`` stand-in was given (empty for anything else)."""
    return obj.state if isinstance(obj, Inert) else {}
