"""The base model every Temporal payload derives from."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, strict about unknown fields: what crosses a Temporal boundary must not drift silently."""

    # Attribute docstrings become field descriptions: settings built from these models document themselves.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
