"""Interpreter exit: everything the loader owns stops before DALI's and TF's own teardown.

Why (measured, docs/architecture.md "Ctrl-C and exit"): at exit, TF's iterators
still pull batches through Python (`from_generator`'s `py_func`, the audit's
`py_function`) on TF's own threads. Once Python starts finalizing, such a thread
that waits for the GIL is ended by `pthread_exit` (CPython's rule for threads
that take the GIL during finalization): unwinding through TF's `noexcept`
frames aborts the process ("terminate called without an active exception"),
or the thread vanishes and the iterator's destructor waits for it forever (a
hang). A generator still running during DALI's atexit hook also builds a new
pipeline while `_shutdown_pipelines` iterates, which fails its assertion.

So one hook, `stop_all`, runs first: it is registered with `threading`'s exit
hooks (before the read-ahead pools are joined and before any `atexit` hook)
and again with `atexit` after TF and DALI are imported (atexit runs last in,
first out). It sets `EXITING`, stops every tracked feed's reads, waits (bounded)
until no Python call from TF is in flight and none started for a short while:
every generator the loader hands TF ends at its next step, so its TF iterator
finalizes while Python still runs. Then it shuts down the DALI pipelines the
loader built. TF's calls into Python after that are refused by TF itself
(`Py_IsInitialized()` is false once finalizing starts), cleanly.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook registers first, so ours runs before it
import logging
import threading
import time
import types
import weakref
from collections.abc import Iterator

logger = logging.getLogger(__name__)

EXITING = threading.Event()
QUIET_SECONDS = 0.2  # no call from TF into the loader for this long: TF's threads are idle
DRAIN_SECONDS = 5.0  # the longest `stop_all` waits for calls in flight

_closers: weakref.WeakSet = weakref.WeakSet()  # objects whose close() stops their reads
_pipelines: weakref.WeakSet = weakref.WeakSet()  # DALI pipelines the loader built
_lock = threading.Lock()
_in_flight = 0
_last_call = 0.0
_threading_hook = False


def exiting() -> bool:
    """Whether the interpreter is exiting (`stop_all` ran)."""
    return EXITING.is_set()


def track(obj, *, pipeline: bool = False) -> None:
    """Stops `obj` at exit: `obj.close()`, or with `pipeline` a DALI pipeline
    shut down once no call is in flight. Call it after TF or DALI is imported:
    the hook moves after their own (so it runs before them)."""
    (_pipelines if pipeline else _closers).add(obj)
    _install()


def _install() -> None:
    global _threading_hook
    atexit.unregister(stop_all)
    atexit.register(stop_all)
    if not _threading_hook:
        try:  # the earliest hook: before non-daemon threads and thread pools are joined
            threading._register_atexit(stop_all)  # noqa: SLF001 - what concurrent.futures uses
            _threading_hook = True
        except (AttributeError, RuntimeError):  # no such hook, or already shutting down
            pass


class _Call:
    """Counts a call from TF into the loader while it runs."""

    def __enter__(self):
        global _in_flight, _last_call
        with _lock:
            _in_flight += 1
            _last_call = time.monotonic()

    def __exit__(self, *exc):
        global _in_flight, _last_call
        with _lock:
            _in_flight -= 1
            _last_call = time.monotonic()


in_call = _Call()


def stoppable(gen: Iterator) -> Iterator:
    """`gen`'s items, each step counted as a call in flight; ends at exit."""
    try:
        while not EXITING.is_set():
            with in_call:
                try:
                    item = next(gen)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            try:
                close()
            except ValueError:  # running in another thread (at exit): it ends at its next step
                pass


def call_guarded(fn, *args):
    """`fn(*args)` counted as a call in flight; a generator it returns is `stoppable`."""
    with in_call:
        result = fn(*args)
    return stoppable(result) if isinstance(result, types.GeneratorType) else result


def _quiet(deadline: float) -> bool:
    while time.monotonic() < deadline:
        with _lock:
            idle = _in_flight == 0 and time.monotonic() - _last_call >= QUIET_SECONDS
        if idle:
            return True
        time.sleep(0.01)
    return False


def stop_all() -> None:
    """Stops every tracked feed and pipeline; idempotent. Called at exit."""
    if EXITING.is_set():
        return
    EXITING.set()
    t0 = time.monotonic()
    for obj in list(_closers):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - exiting: log and go on
            logger.debug("closing %r at exit failed", obj, exc_info=True)
    if not _quiet(t0 + DRAIN_SECONDS):
        logger.warning("dali-loader: %d call(s) from TensorFlow still running %.1f s after "
                       "exit began", _in_flight, DRAIN_SECONDS)
    for pipe in list(_pipelines):
        shutdown = getattr(pipe, "_shutdown", None)  # what DALI's own atexit hook calls
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - exiting: log and go on
                logger.debug("shutting down a DALI pipeline at exit failed", exc_info=True)
    logger.debug("dali-loader stopped in %.3f s at exit", time.monotonic() - t0)
