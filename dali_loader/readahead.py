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
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class ReadAhead:
    """A persistent pool that maps a read function over items, in order.

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
        try:
            return self.fn(item)
        except Exception as e:  # returned, not raised: the consumer decides
            return e

    def map(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yields `fn(item)` (or the exception it raised) for each item, in order.

        The first window of reads is submitted at once, before the first
        result is asked for, so reads overlap whatever the caller does next.
        """
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(
                self.max_in_flight, thread_name_prefix="dali-loader-read"
            )
        it = iter(items)
        pending: collections.deque[cf.Future] = collections.deque()
        for item in it:
            pending.append(self._pool.submit(self._call, item))
            if len(pending) >= self.window:
                break
        return self._drain(it, pending)

    def _drain(self, it: Iterator[Any], pending: collections.deque) -> Iterator[Any]:
        try:
            while pending:
                result = pending.popleft().result()
                for item in it:
                    pending.append(self._pool.submit(self._call, item))
                    break
                yield result
        finally:
            for f in pending:
                f.cancel()

    def close(self) -> None:
        """Stops the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
