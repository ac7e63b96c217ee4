"""Cleanup that a finalizer asks for runs on one thread of its own, never inside the finalizer.

Why: a finalizer (a `weakref.finalize` callback, a `__del__`) runs wherever the garbage
collector or the last reference drop happens: on any thread, at any allocation, perhaps
while that thread holds the very lock, cache file lock (`flock`) or worker thread that
the cleanup then waits for. Waiting there deadlocks that thread *inside the collector*.
And CPython runs one collection at a time: while one is stuck, `gc.collect()` in every
other thread returns 0 without collecting, so no reference cycle is freed again for the
rest of the process (seen here: a dropped gs:// dataset's cache writer collected its own
source and joined the other writers, which waited for the cache lock it held; two tests
that wait for a dropped dataset to be collected then failed together, in 2 of 6 full
suite runs).

So the loader's finalizers only queue their work: `queue.SimpleQueue.put` is documented
as safe to call from `__del__` methods and weakref callbacks
(https://docs.python.org/3/library/queue.html#queue.SimpleQueue.put). One daemon thread,
started outside any finalizer (when the first `finalize` is registered), runs the queue in
order. At interpreter exit the queue is drained in the exiting thread, and work queued
after that runs at once (no collector is running then).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_queue: queue.SimpleQueue = queue.SimpleQueue()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None
_inline = False  # exiting: run queued work at once, in the caller


def later(fn: Callable[..., Any], *args: Any) -> None:
    """Runs `fn(*args)` on the reaper thread; safe to call inside a finalizer."""
    if _inline:
        _run(fn, args)
    else:
        _queue.put((fn, args))


def start() -> None:
    """Starts the reaper thread (idempotent). Call it outside finalizers: starting a
    thread takes `threading`'s own locks."""
    global _thread
    if _thread is not None:
        return
    with _start_lock:
        if _thread is None:
            thread = threading.Thread(target=_loop, name="dali-loader-reaper", daemon=True)
            thread.start()
            atexit.register(_drain)  # after weakref.finalize's own exit hook: runs first
            _thread = thread


def idle() -> bool:
    """Whether nothing queued is waiting (a finalizer's work may still be running)."""
    return _queue.empty()


class Finalizer:
    """An object's cleanup: run at once by calling it (or `close()`), queued to the
    reaper thread when the object is garbage-collected or at exit.

    Attributes:
        alive: False once the cleanup ran or was queued.
    """

    def __init__(self, obj: object, fn: Callable[..., Any], *args: Any):
        start()
        self._fn = fn
        self._finalize = weakref.finalize(obj, later, fn, *args)

    @property
    def alive(self) -> bool:
        return self._finalize.alive

    def __call__(self) -> None:
        """Runs the cleanup now, in this thread (once; later calls do nothing)."""
        info = self._finalize.detach()
        if info is not None:
            _, _, (fn, *args), _ = info
            fn(*args)


def _run(fn: Callable[..., Any], args: tuple) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a cleanup's failure must not stop the others
        logger.warning("dali-loader: cleanup %r failed", fn, exc_info=True)


def _loop() -> None:
    while True:
        fn, args = _queue.get()
        _run(fn, args)
        del fn, args  # let go of the object's resources before waiting again


def _after_fork_in_child() -> None:
    """A forked child has no reaper thread: the next `Finalizer` starts its own."""
    global _queue, _thread, _start_lock
    _queue, _thread, _start_lock = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _drain() -> None:
    global _inline
    _inline = True
    while True:
        try:
            fn, args = _queue.get_nowait()
        except queue.Empty:
            return
        _run(fn, args)
