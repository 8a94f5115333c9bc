"""asyncio helpers that never swallow the caller's own cancellation.

``contextlib.suppress(BaseException)`` around ``await task`` after ``task.cancel()`` also swallows
a cancellation aimed at the *caller* (Ctrl-C, a timeout, the scheduler cancelling a trial) when it
arrives during that await, and the caller then carries on as if nothing happened.
"""

from __future__ import annotations

import asyncio


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel ``tasks`` (None entries skipped) and wait until every one has finished. Their own
    outcome (cancelled, or an error) stays with them and is marked retrieved; a cancellation of
    the caller while waiting propagates."""
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in pending:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
