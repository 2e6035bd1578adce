"""The base model every Temporal payload derives from."""

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen", "replaced"]


class Frozen(BaseModel):
    """Immutable, strict about unknown fields: what crosses a Temporal boundary must not drift silently."""

    # Attribute docstrings become field descriptions: settings built from these models document themselves.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


F = TypeVar("F", bound=Frozen)
_set = object.__setattr__


def replaced(model: F, update: Mapping[str, Any]) -> F:
    """``model.model_copy(update=update)``: the same copy (the values are not validated, as there), made directly.

    pydantic's generic copy (``__copy__`` of the dict, the extra, the fields set and the private values, one
    ``copy.copy`` each) was a good part of a watch hub's CPU: it copies every rank's progress on every poll. A
    ``Frozen`` model has no extra and, unless it declares private attributes, no private values; one that has them
    takes ``model_copy``.
    """
    if model.__pydantic_private__ is not None or model.__pydantic_extra__ is not None:
        return model.model_copy(update=update)
    new = model.__class__.__new__(model.__class__)
    _set(new, "__dict__", {**model.__dict__, **update})
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | update.keys())
    _set(new, "__pydantic_private__", None)
    return new
