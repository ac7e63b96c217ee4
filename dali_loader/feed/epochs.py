"""The feed: epochs of checked, encoded items in order, each iteration independent.

A `Feed` is a recipe (index, item reader, chunk size, order, error policy)
plus shared resources (one read-ahead pool). Every `iter(feed)` is a
`FeedEpoch` that owns everything about that pass: its epoch number and order,
its reads in flight, its error record and the items it still holds. Any
number of them may run at once, interleaved or abandoned; each yields every
file of its epoch exactly once (or reports it). Closing an epoch, or dropping
it, cancels its reads and releases what it holds.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from dali_loader.args import positive_int
from dali_loader.errors import BadFileError, CorruptImageError
from dali_loader.exiting import exiting, track
from dali_loader.feed.order import epoch_order, shard_of
from dali_loader.plan import shard_size
from dali_loader.feed.policy import EpochErrors, SkipReport, check_on_error
from dali_loader.feed.readahead import ReadAhead
from dali_loader.index import Index
from dali_loader.reaper import Finalizer

logger = logging.getLogger(__name__)


class Tally:
    """Thread-safe event counts of one epoch: `files` handed out, and what
    readers that take a `tally` count (the GPU-ready cache's `cache_fills` and
    `cache_hits`, `CheckedBytes`'s `jpeg`)."""

    def __init__(self):
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] += n

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Chunk(NamedTuple):
    """Consecutive good items of an epoch and their positions in the index."""

    items: list[Any]
    positions: list[int]


class Feed:
    """Epochs of items from `index`, read ahead with `max_in_flight` reads.

    Args:
        index: The files and labels, in dataset order.
        items: An item reader (`dali_loader.feed.items`).
        chunk_size: Items per chunk (the last one may be smaller).
        shuffle: A fresh permutation per epoch, from `seed` and the epoch number.
        seed: The permutations' seed.
        on_error: "raise" or "skip" for files that cannot be read or decoded.
        max_in_flight: Reads in flight (threads of the shared read-ahead pool).
        read_ahead: Items read ahead of the consumer per epoch (default: two
            chunks, at least `max_in_flight`).
        source: The `Source` the items come from; the feed holds it open
            until it is closed or garbage-collected.
        batch_size: The consumer's batch size (default: `chunk_size`): the
            unit of sharding.
        shard: `(pipeline, num_pipelines)`: read only this input pipeline's
            batches of each epoch (`order.shard_of`); `(0, 1)` reads all.
    """

    def __init__(self, index: Index, items, *, chunk_size: int, shuffle: bool = False,
                 seed: int = 0, on_error: str = "raise", max_in_flight: int = 64,
                 read_ahead: int | None = None, source=None, batch_size: int | None = None,
                 shard: tuple[int, int] = (0, 1)):
        self.index = index
        self.items = items
        self.chunk_size = positive_int("chunk_size", chunk_size)
        self.batch_size = positive_int("batch_size", batch_size or chunk_size)
        pipeline, pipelines = shard
        positive_int("num_pipelines", pipelines)
        if not isinstance(pipeline, int) or not 0 <= pipeline < pipelines:
            raise ValueError("The input pipeline id must be in [0, num_pipelines). "
                             f"Received: shard={shard}")
        self.shard = (pipeline, pipelines)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.on_error = check_on_error(on_error)
        self.max_in_flight = positive_int("max_in_flight", max_in_flight)
        self.report = SkipReport()
        # The `plan.Plan` this feed was built from (set by `make_loader`): the TF
        # path's graph reads which graph, reads, decode calls and PNG decoder run.
        self.plan = None
        self._started = 0
        self._next = 0  # the next iteration's epoch number
        self._lock = threading.Lock()
        self.source = source
        self._reader = None
        if items.io:
            window = max(read_ahead or 2 * self.chunk_size, self.max_in_flight)
            self._reader = ReadAhead(items, self.max_in_flight, window)
        if source is not None:
            source.acquire()
        # Collected: released on the reaper's thread, never inside the collector (reaper.py).
        self._finalizer = Finalizer(self, _release, self._reader, source)
        track(self)  # its reads stop when the interpreter exits
        # Per epoch, bounded: set-up before the first chunk is asked for.
        self.epoch_setup_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        # Per finished epoch, bounded: {"epoch": n, "files": good items handed
        # out, plus what the reader counted (e.g. "cache_fills", "cache_hits")}.
        self.epoch_tallies: collections.deque[dict[str, int]] = collections.deque(maxlen=1000)

    @property
    def num_files(self) -> int:
        """Files this feed reads per epoch (its shard; before any skipped file)."""
        return shard_size(len(self.index), self.batch_size, *self.shard)

    @property
    def shards_even(self) -> bool:
        """Whether every input pipeline reads as many batches per epoch as this one
        (always, unsharded). Under tf.distribute, pipelines that declared different
        batch counts would run different step counts."""
        batches = -(-len(self.index) // self.batch_size)
        return batches % self.shard[1] == 0

    @property
    def num_batches(self) -> int:
        """Batches this feed reads per whole epoch (its shard)."""
        return -(-self.num_files // self.batch_size)

    @property
    def epoch_stats(self) -> list[dict[str, int]]:
        """Per finished epoch: `epoch_tallies` plus `cpu_decodes`, the images
        decoded on the CPU when TF's kernels decode: every file, or with the
        GPU-ready cache only those it had to fill."""
        ready = hasattr(self.items, "ready")
        return [dict(t, cpu_decodes=t.get("cache_fills" if ready else "files", 0))
                for t in list(self.epoch_tallies)]

    @property
    def epochs_started(self) -> int:
        """Iterations started so far."""
        return self._started

    @property
    def skipped(self) -> dict[str, str]:
        """File -> reason for every file any iteration left out (`on_error="skip"`)."""
        return self.report.as_dict()

    @property
    def closed(self) -> bool:
        """Whether `close()` ran (or the feed was garbage-collected)."""
        return not self._finalizer.alive

    def epoch(self, number: int | None = None, start_step: int = 0) -> FeedEpoch:
        """A new, independent iteration: epoch `number` (default: the next one),
        from its batch `start_step` on; the batches before it are not read."""
        if self.closed:
            raise RuntimeError("This dataset was closed; create a new one to iterate again.")
        with self._lock:
            if number is None:
                number = self._next
                self._next += 1
            self._started += 1
        return FeedEpoch(self, number, start_step)

    def __iter__(self) -> FeedEpoch:
        return self.epoch()

    def check_start_step(self, start_step: int) -> int:
        """Validates a first batch for `epoch`: an integer in [0, num_batches]."""
        if not isinstance(start_step, int) or not 0 <= start_step <= self.num_batches:
            raise ValueError(f"`start_step` must be an integer in [0, {self.num_batches}] (the "
                             f"batches of an epoch). Received: start_step={start_step!r}")
        return start_step

    def seek(self, epoch: int) -> None:
        """Numbers the next iteration `epoch` (then `epoch + 1`, ...): after a
        restart, epochs keep the order they would have had."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"`epoch` must be a non-negative integer. Received: epoch={epoch!r}")
        with self._lock:
            self._next = epoch

    def close(self) -> None:
        """Stops the read threads (running epochs stop getting new reads) and lets
        go of the source (closed when its last feed lets go). Idempotent."""
        self._finalizer()

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _release(reader: ReadAhead | None, source) -> None:
    if reader is not None:
        reader.close()
    if source is not None:
        source.release()


class FeedEpoch:
    """One pass over the feed's index: yields `Chunk`s; `close()` ends it early.

    Attributes:
        number: The epoch number (decides the order when shuffling).
        start_step: The first batch read (a resumed epoch skips the ones before).
        order: The index positions this epoch reads (its shard), in order.
        errors: This epoch's `on_error` handler and its record of skipped files.
    """

    def __init__(self, feed: Feed, number: int, start_step: int = 0):
        t0 = time.perf_counter()
        feed.check_start_step(start_step)
        self.number = number
        self.start_step = start_step
        order = epoch_order(len(feed.index), feed.shuffle, feed.seed, number)
        self.order = shard_of(order, feed.batch_size, *feed.shard)[start_step * feed.batch_size:]
        self.errors = EpochErrors(feed.on_error, feed.report)
        self.tally = Tally()
        self._feed = feed
        self._items = feed.items
        read = self._items
        if getattr(read, "tallies", False):  # readers that count into this epoch's tally
            read = functools.partial(read, tally=self.tally)
        # Only items that hold something (a pin) are tracked until released;
        # bytes or paths are not kept once handed out.
        self._holds = getattr(feed.items, "holds", True)
        self._paths = feed.index.paths
        self._held: dict[int, Any] = {}  # position -> item not yet released
        # Re-entrant: a generator that owns this epoch may be collected, and run its
        # `finally: epoch.close()`, in a thread that is inside `release` here.
        self._lock = threading.RLock()
        order = self.order.tolist()
        # A positional reader (the GPU-ready cache's) takes index positions, not paths.
        keys = order if getattr(self._items, "positional", False) else (self._paths[p] for p in order)
        self._stream: Iterator[Any]
        if feed._reader is not None:
            self._stream = feed._reader.map(keys, discard=self._items.release, fn=read)
        else:
            self._stream = (self._read_inline(read, k) for k in keys)
        self._results = zip(order, self._stream)
        self._pulled = 0  # positions taken from the stream (kept or skipped)
        self.closed = False
        feed.epoch_setup_seconds.append(time.perf_counter() - t0)

    @staticmethod
    def _read_inline(read, key) -> Any:
        try:
            return read(key)
        except (BadFileError, MemoryError) as e:  # one file's: the policy decides
            return e

    def next_chunk(self, size: int | None = None) -> Chunk | None:
        """Up to `size` (default: the feed's chunk size) good items, or None at
        the end. A bad file goes to `errors` (raised, or recorded and left out)."""
        size = size or self._feed.chunk_size
        if exiting():
            return None
        if self._feed.closed:
            raise RuntimeError("The dataset was closed while an epoch was running.")
        items, positions = [], []
        while not exiting():  # at exit the epoch ends here (dali_loader.exiting)
            try:
                pos, result = next(self._results)
                self._pulled += 1
            except StopIteration:
                break
            except (cf.CancelledError, RuntimeError):  # the read pool stopped at exit
                if exiting():
                    return None
                raise
            if isinstance(result, MemoryError):  # one file's read or decode: its error
                result = CorruptImageError(self._paths[pos], "out of memory while reading or "
                                           "decoding it (see max_pixels)")
            if isinstance(result, BadFileError):
                self.errors(result)
                continue
            if isinstance(result, BaseException):
                raise result  # a bug or an unexpected failure: never swallowed
            if not self._hold(pos, result):
                return None  # closed meanwhile: the epoch is over
            items.append(result)
            positions.append(pos)
            if len(items) == size:
                break
        if not items:
            return None
        self.tally.add("files", len(items))
        return Chunk(items, positions)

    @property
    def remaining(self) -> int:
        """Positions of `order` not yet taken by `next_chunk` (0: the chunk just taken
        was the epoch's last)."""
        return len(self.order) - self._pulled

    def _hold(self, pos: int, item: Any) -> bool:
        """Holds an item until it is released (or the epoch closes); after
        `close()`, releases it at once and returns False."""
        with self._lock:
            if not self.closed:
                if self._holds:
                    self._held[pos] = item
                return True
        self._items.release(item)
        return False

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        chunk = self.next_chunk()
        if chunk is None:
            raise StopIteration
        return chunk

    def path(self, pos: int) -> str:
        """The file at index position `pos`."""
        return self._paths[pos]

    def labels(self, positions) -> np.ndarray | None:
        """The labels of `positions` (None when unlabelled)."""
        labels = self._feed.index.labels
        return None if labels is None else labels[positions]

    def release(self, positions) -> None:
        """Lets go of the items at `positions` (a consumer is done with them)."""
        if not self._holds:
            return
        with self._lock:
            items = [self._held.pop(p, None) for p in positions]
        for item in items:
            if item is not None:
                self._items.release(item)

    def close(self) -> None:
        """Ends the epoch: cancels reads not started, releases every held item."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            held, self._held = list(self._held.values()), {}
        tally = self.tally.as_dict()
        self._feed.epoch_tallies.append({"epoch": self.number, **tally})
        if tally.get("cache_write_failures"):
            logger.warning("Epoch %d: %d cache writes failed; those files were read uncached.",
                           self.number, tally["cache_write_failures"])
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()
        for item in held:
            self._items.release(item)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
