"""Which of the scheduler's nodes the current trial runs on, for a sandbox factory that places
sandboxes by node (a Ray cluster's, ``termgym.sandboxes.ray``): ``current_node`` is set by the
scheduler around each trial it launches (``placed_on``) and read where the trial's sandbox is made;
None outside a scheduler (``termgym check``), where the factory chooses."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

current_node: ContextVar[str | None] = ContextVar("termgym_current_node", default=None)


@contextlib.contextmanager
def placed_on(node: str) -> Iterator[None]:
    """Within the block (and the tasks it starts), the trial runs on the node named ``node``."""
    token = current_node.set(node)
    try:
        yield
    finally:
        current_node.reset(token)
