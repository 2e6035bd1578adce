"""The worker's GC settings: start-up objects frozen, thresholds raised, and cycles still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from workers.gc_tuning import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_tune_gc_freezes_start_up_and_raises_the_thresholds(restored_gc: None) -> None:
    kept = _Node()
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen objects are no longer tracked by collections


def test_cycles_made_after_tuning_are_still_collected(restored_gc: None) -> None:
    tune_gc()
    ref = weakref.ref(_Node())
    gc.collect()
    assert ref() is None
