"""The rollout driver's garbage-collector settings hold only while it drives, and are undone after."""

from __future__ import annotations

import gc

from termgym.agents.heap import YOUNG_THRESHOLD, settled_heap


def test_settled_heap_raises_the_threshold_and_freezes_then_puts_everything_back():
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with settled_heap():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        assert gc.get_freeze_count() > frozen  # what start-up built is out of the collector's view
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
