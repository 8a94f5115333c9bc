"""The garbage collector of a process that drives many concurrent episodes.

Hundreds of live episodes keep hundreds of thousands of objects (messages, transcripts, the
client's connections); CPython's default thresholds then run full collections over all of them,
pausing every episode for tens to hundreds of milliseconds (bench/model_agent.py measures the
pauses). ``settled_heap`` moves what start-up built out of the collector's view (``gc.freeze``)
and collects the youngest generation every ``young`` allocations instead of every 700, so that
collections are rare and short. Reference counting still frees everything that is not in a cycle
at once, so memory does not grow with the thresholds.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def settled_heap(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Collect once, freeze the survivors and raise the youngest generation's threshold; on exit,
    unfreeze and put the thresholds back (so a process that goes on, a test session, is as before)."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, thresholds[1], max(thresholds[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
