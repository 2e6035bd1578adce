"""The worker's garbage-collector settings: fewer collections over a heap that is mostly long-lived.

A watch hub allocates many short-lived containers per poll (a line's tuple, a rank's progress copy) and frees them
by reference counting; CPython still counts them towards a young-generation collection every 700 net allocations,
and each older-generation collection walks every long-lived object the process holds (modules, pydantic schemas,
the SDK's workflow cache). Measured with ``python -m deploy.scale.hub_cpu --jobs 500 --polls 20 --warmup 70``
(docs/benchmarks/scale.md, "Garbage collector"): median 0.95 -> 0.76 ms of CPU per job per poll over six
alternating pairs. No answer changes: cycles are still collected, only less often, and what startup built is
never garbage.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["GC_THRESHOLDS", "tune_gc"]

log = logging.getLogger("rebound.gc")

#: Young-generation threshold raised from CPython's 700 net container allocations: at most this many short-lived
#: containers wait for a collection (a few MB), and a poll of hundreds of jobs triggers tens of young collections,
#: not thousands. The older generations keep CPython's ratios loosely (their collections are the costly ones).
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Freeze what the process built so far (imports, settings, clients: never garbage, never walked again) and
    raise the collection thresholds. Call once, after start-up and before serving."""
    gc.collect()  # what start-up left as garbage goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.info("gc: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(), GC_THRESHOLDS)
