"""Ordered read-ahead: many reads in flight, results in the order asked.

The one concurrency primitive between storage and the decoder. A bounded
window of reads runs ahead of the consumer on a thread pool, so a slow store
(FUSE, gs://) keeps `max_in_flight` requests busy while results still come out
in the epoch's order. Exceptions are returned as values, so the caller decides
whether a bad item stops the epoch or is skipped.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class ReadAhead:
    """A persistent pool that maps a read function over items, in order.

    One pool serves any number of concurrent `map` calls: each call's window
    and results are its own.

    Args:
        fn: The read function, called from worker threads.
        max_in_flight: Worker threads, i.e. reads in flight at most.
        window: How many items may be read ahead of the consumer
            (at least `max_in_flight`; default 2x).
    """

    def __init__(
        self, fn: Callable[[Any], Any], max_in_flight: int, window: int | None = None
    ):
        if max_in_flight < 1:
            raise ValueError(
                f"`max_in_flight` must be >= 1. Received: max_in_flight={max_in_flight}"
            )
        self.fn = fn
        self.max_in_flight = max_in_flight
        self.window = max(window or 2 * max_in_flight, max_in_flight)
        self._pool: cf.ThreadPoolExecutor | None = None

    def _call(self, item: Any) -> Any:
        return _returning_errors(self.fn, item)

    def map(self, items: Iterable[Any], discard: Callable[[Any], None] | None = None,
            fn: Callable[[Any], Any] | None = None) -> Ordered:
        """Yields `fn(item)` (or the exception it raised) for each item, in order.

        `fn` overrides the pool's read function for this call (e.g. one that
        also counts into the caller's tally).

        The first window of reads is submitted at once, before the first
        result is asked for, so reads overlap whatever the caller does next.
        `close()` on the result (also when it is dropped) cancels the reads not
        yet started; each result read but never yielded is passed to `discard`
        (to release what it holds).
        """
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(
                self.max_in_flight, thread_name_prefix="dali-loader-read"
            )
        call = self._call if fn is None else functools.partial(_returning_errors, fn)
        return Ordered(self._pool, call, iter(items), self.window, discard)

    def close(self) -> None:
        """Stops the worker threads (reads not started are cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _returning_errors(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except Exception as e:  # returned, not raised: the consumer decides
        return e


class Ordered:
    """The results of one `ReadAhead.map`, in order; a bounded window in flight."""

    def __init__(self, pool: cf.ThreadPoolExecutor, call: Callable[[Any], Any],
                 items: Iterator[Any], window: int, discard: Callable[[Any], None] | None):
        self._pool = pool
        self._call = call
        self._items = items
        self._discard = discard
        self._pending: collections.deque[cf.Future] = collections.deque()
        for item in items:
            self._pending.append(pool.submit(call, item))
            if len(self._pending) >= window:
                break

    def __iter__(self) -> Ordered:
        return self

    def __next__(self) -> Any:
        if not self._pending:
            raise StopIteration
        result = self._pending.popleft().result()
        for item in self._items:
            self._pending.append(self._pool.submit(self._call, item))
            break
        return result

    def close(self) -> None:
        """Cancels the reads not started; results never yielded go to `discard`."""
        pending, self._pending = self._pending, collections.deque()
        self._items = iter(())
        for f in pending:
            if not f.cancel() and self._discard is not None:  # running or done
                f.add_done_callback(self._discard_result)

    def _discard_result(self, f: cf.Future) -> None:
        if not f.cancelled():
            result = f.result()
            # a failed read holds nothing; `_discard` is set where this callback is added
            if not isinstance(result, Exception) and self._discard is not None:
                self._discard(result)

    def __del__(self):
        self.close()
