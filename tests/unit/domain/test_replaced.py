"""``replaced`` is ``model_copy(update=...)`` made directly: the same model, values, fields set and dump."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import PrivateAttr, ValidationError

from workflows.domain.base import Frozen, replaced
from workflows.domain.progress import ProgressState, RankProgress

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


class _WithPrivate(Frozen):
    x: int = 0
    _memo: dict[str, int] = PrivateAttr(default_factory=dict)


@pytest.mark.parametrize(
    ("model", "update"),
    [
        (RankProgress(rank=2, first_seen=T0), {"last_step": 3, "gaps_s": (1.0, 2.0), "straggler_streak": 1}),
        (RankProgress(rank=0, node="n1", first_seen=T0, last_step=9), {}),
        (ProgressState(ranks=(RankProgress(rank=1, first_seen=T0),)), {"ignored": 2, "watching_since": T0}),
        (_WithPrivate(x=1), {"x": 5}),
    ],
)
def test_replaced_is_model_copy(model: Frozen, update: dict[str, object]) -> None:
    before = model.model_dump(mode="json")
    new, expected = replaced(model, update), model.model_copy(update=update)
    assert type(new) is type(expected) and new == expected
    assert new.model_fields_set == expected.model_fields_set
    assert new.model_dump(mode="json", exclude_unset=True) == expected.model_dump(mode="json", exclude_unset=True)
    assert new.__pydantic_private__ == expected.__pydantic_private__
    assert model.model_dump(mode="json") == before  # the original is untouched
    with pytest.raises(ValidationError):
        new.__setattr__(next(iter(type(model).model_fields)), 1)  # still frozen
