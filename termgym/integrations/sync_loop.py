"""termgym's async episodes driven from synchronous callers (a framework's ``init``/``step``/``close``):
one event loop in a daemon thread of its own, shared by every caller in the process.

Why one loop and not one per environment: what sandboxes of a backend share (Daytona's HTTP
sessions, Docker's warm pool) is bound to the loop that made it, and a framework calls its
environments from whatever thread it likes (SkyRL from an executor's worker threads, or from the
thread its own event loop runs on). ``run`` is safe from any thread but the loop's own.

Guarantees: a caller interrupted while it waits (Ctrl-C, a timeout of its own) cancels the
coroutine and waits until it has finished, so the cleanup termgym does on cancellation (stopping a
sandbox) is never cut short. At interpreter exit every resource still registered (``track``) is
closed, then the backends' shared clients, then the loop stops: an environment its framework
never closed leaves nothing running. After a fork the child makes a loop of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread
import contextlib
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
EXIT_GRACE = 60.0  # seconds the exit hook waits for the open resources to close

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_owner_pid = 0
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_hook_registered = False


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _owner_pid, _hook_registered
    with _lock:
        if _loop is None or _owner_pid != os.getpid() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="termgym-sync-loop", daemon=True)
            thread.start()
            _loop, _thread, _owner_pid = loop, thread, os.getpid()
            _open.clear()  # a forked child's copies belong to its parent's loop
            if not _hook_registered:
                _at_exit(_close_at_exit)
                _hook_registered = True
        return _loop


def run(coroutine: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """The coroutine's result, run on the shared loop; its exception propagates. ``timeout``:
    ``TimeoutError`` after that many seconds. However the wait ends early (the timeout, Ctrl-C),
    the coroutine is cancelled and waited for until it has finished its cleanup."""
    loop = _running_loop()
    if threading.current_thread() is _thread:
        coroutine.close()
        raise RuntimeError("termgym's sync loop cannot wait on itself: call run() from another thread")
    finished: concurrent.futures.Future[T] = concurrent.futures.Future()
    tasks: list[asyncio.Task[T]] = []

    def start() -> None:
        task = loop.create_task(coroutine)
        tasks.append(task)
        task.add_done_callback(lambda done: _settle(done, finished))

    loop.call_soon_threadsafe(start)
    try:
        return finished.result(timeout)
    except BaseException:
        if not finished.done():
            loop.call_soon_threadsafe(lambda: tasks[0].cancel())  # after start(): the loop runs callbacks in order
            with contextlib.suppress(BaseException):
                finished.exception()  # until the task has finished its cleanup (a second Ctrl-C ends the wait)
        raise


def _settle(task: asyncio.Task[T], finished: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        finished.set_exception(concurrent.futures.CancelledError())
    elif (error := task.exception()) is not None:
        finished.set_exception(error)
    else:
        finished.set_result(task.result())


def track(resource: Any) -> None:
    """Close ``resource`` (its ``aclose()`` coroutine) at interpreter exit unless ``untrack``ed first."""
    _running_loop()
    _open.add(resource)


def untrack(resource: Any) -> None:
    _open.discard(resource)


def _at_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit while thread pools still take work: ``atexit`` runs after
    ``concurrent.futures`` has shut its pools (``asyncio.to_thread`` then fails), so the hook goes
    where that shutdown is registered (``threading``'s exit hooks, run last-registered first;
    ``concurrent.futures.thread`` is imported above, so its own hook is already there)."""
    register = getattr(threading, "_register_atexit", None)
    (register or atexit.register)(hook)


def _close_at_exit() -> None:
    loop, thread = _loop, _thread
    if loop is None or thread is None or not thread.is_alive() or _owner_pid != os.getpid():
        return
    closers: list[Callable[[], Awaitable[Any]]] = [resource.aclose for resource in list(_open)]
    _open.clear()

    async def close_all() -> None:
        from termgym.sandboxes import close_backends

        await asyncio.gather(*(close() for close in closers), return_exceptions=True)
        await close_backends()

    try:
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(EXIT_GRACE)
    except BaseException:
        pass  # exiting: what could not close is what termgym gc collects
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
