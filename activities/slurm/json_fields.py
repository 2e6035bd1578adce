"""Typed access to the fields of Slurm's JSON objects (``activities.slurm.parse``): a field of the wrong type raises
``SCHEDULER_BAD_RESPONSE`` naming it; numbers are read in the 22.05 shape and the newer ``{"set", "number"}`` one."""

from __future__ import annotations

from collections.abc import Mapping

from activities.slurm.errors import bad_response
from activities.slurm.hostlist import HostlistError, expand
from workflows.domain.errors import ReboundError

__all__ = ["JsonFields", "is_unset_number", "plain_number"]


class JsonFields:
    """Typed access to one JSON object's fields; a wrong type raises ``SCHEDULER_BAD_RESPONSE`` naming the field."""

    def __init__(self, item: object, source: str, what: str) -> None:
        if not isinstance(item, Mapping):
            raise bad_response(source, f"a {what} entry is {type(item).__name__}, not an object")
        self.item: Mapping[str, object] = item
        self.source = source
        self.what = what

    def raw(self, key: str) -> object:
        """The field's value; a dotted key (``job_resources.nodes``) reads into nested objects, None where one lacks."""
        if "." not in key:
            return self.item.get(key)
        value: object = self.item
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def text(self, key: str) -> str:
        value = self.raw(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.item.get(key)
        if value is None:
            return ()
        if isinstance(value, str):  # some Slurm versions join lists with commas
            return tuple(v for v in value.split(",") if v)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._wrong(key, value, "a list of strings")
        return tuple(value)

    def number(self, key: str) -> int | None:
        value = self.item.get(key)
        if value is None:
            return None
        number = plain_number(value)
        if number is None and not is_unset_number(value):
            raise self._wrong(key, value, "an integer")
        return number

    def flag(self, key: str) -> bool:
        value = self.item.get(key)
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value != 0
        raise self._wrong(key, value, "a boolean")

    def hostlist(self, key: str) -> tuple[str, ...]:
        try:
            return expand(self.text(key))
        except HostlistError as e:
            raise bad_response(self.source, f"{self.what}: '{key}' is not a hostlist: {e}") from e

    def _wrong(self, key: str, value: object, expected: str) -> ReboundError:
        return bad_response(self.source, f"{self.what}: '{key}' should be {expected}, got {value!r:.80}")


def plain_number(value: object) -> int | None:
    """An int, or the ``number`` of a set ``{"set": true, "infinite": false, "number": n}`` (v0.0.39+)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping) and value.get("set", True) and not value.get("infinite", False):
        return plain_number(value.get("number"))
    return None


def is_unset_number(value: object) -> bool:
    return isinstance(value, Mapping) and (not value.get("set", True) or bool(value.get("infinite", False)))
