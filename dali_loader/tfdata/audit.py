"""The TF path's audit: every file an iteration emitted is delivered, or named.

TF's kernels decode under `ignore_errors()`, which drops, without a word, a
failing file (the per-file graph) or the whole batch holding it (the decode fused
with the batch; `tf_path.Batching`). Each iteration gets an `Auditor`, registered
under a token that rides along with every element: the surviving positions are
checked, in order, against what that iteration emitted. A gap is what dropped:
the auditor reads each of its files again and decodes it eagerly (`recover`). The
files that decode are handed back, in order, to be delivered before the batch
that revealed the gap; a file that does not is named (unreadable, corrupt, or
unresizable) and handed to the iteration's `on_error` handler. Each iteration
ends with a marker no decode can drop, so a gap at its very end is caught too,
and an exception of the feed is held and raised there (raised earlier,
`ignore_errors()` would swallow it and cut the epoch short).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from dali_loader.errors import BadFileError
from dali_loader.feed.epochs import Chunk, FeedEpoch

logger = logging.getLogger(__name__)
T = TypeVar("T")
END = -1  # the marker's position
_FINISHED_KEPT = 64  # fed-out iterations awaiting their last checks


class Auditor:
    """One iteration: emits its feed epoch's chunks, then checks decoded positions.

    Args:
        open_epoch: Starts the iteration's `FeedEpoch` (in `chunks`, so that a
            failure to start is held and raised like any other).
        recover: `path -> pixels or exception` for a file of a dropped batch:
            its pixels (as the batch would have held them), a `BadFileError`
            (unreadable, corrupt or unresizable) or another error to raise.
    """

    def __init__(self, open_epoch: Callable[[], FeedEpoch],
                 recover: Callable[[str], Any]):
        self._open_epoch = open_epoch
        self.epoch: FeedEpoch | None = None
        self.recover = recover
        self.emitted: collections.deque[int] = collections.deque()
        self.withheld: set[int] = set()  # emitted, but not sent to TF: recovered here
        self.error: BaseException | None = None

    def chunks(self, convert: Callable[[FeedEpoch, Chunk], T] = lambda e, c: c,
               sizes: Iterable[int] = ()) -> Iterator[T]:
        """`convert(epoch, chunk)` for each of the epoch's chunks, of `sizes`
        files while it lasts, then of the feed's chunk size. Any exception (the
        feed's, or `convert`'s) is held for the marker's check."""
        try:
            self.epoch = self._open_epoch()
            sizes = iter(sizes)
            while (chunk := self.epoch.next_chunk(next(sizes, None))) is not None:
                element = convert(self.epoch, chunk)
                self.emitted.extend(chunk.positions)
                yield element
        except Exception as e:  # noqa: BLE001 - raised by check() at the marker
            self.error = e
        self.emitted.append(END)

    def close(self) -> None:
        """Ends the iteration's epoch (its reads and held items)."""
        if self.epoch is not None:
            self.epoch.close()

    def check(self, positions: list[int]) -> tuple[bool, list[tuple[int, Any]]]:
        """Accounts for every emitted position up to each survivor. Returns whether
        the iteration ended, and the files recovered from the gaps before the
        survivors (position, pixels), in order: they come before the survivors."""
        recovered: list[tuple[int, Any]] = []
        try:
            for pos in positions:
                gap: list[int] = []
                while self.emitted and self.emitted[0] != pos:
                    gap.append(self.emitted.popleft())
                if gap:
                    self._dropped(gap, recovered)
                if self.emitted:
                    self.emitted.popleft()
        finally:
            if self.epoch is not None:
                self.epoch.release(positions)
        if positions and positions[-1] == END:
            self.close()
            if self.error is not None:
                err, self.error = self.error, None
                raise err
            return True, recovered
        return False, recovered

    def _dropped(self, gap: list[int], recovered: list[tuple[int, Any]]) -> None:
        """A gap of dropped positions: each file recovered, or its error handled."""
        failed = 0
        for pos in gap:
            self.epoch.release([pos])
            out = self.recover(self.epoch.path(pos))
            if isinstance(out, BadFileError):
                failed += 1
                self.epoch.errors(out)  # raises, or records and goes on
            elif isinstance(out, BaseException):
                raise out
            else:
                recovered.append((pos, out))
        if not failed and not self.withheld.issuperset(gap):
            # TF failed on one of them, but none fails now: delivered
            logger.warning(
                "%d file(s) from %s on dropped out of TensorFlow's decode, but each reads "
                "and decodes now: delivered. Please report this with the storage used.",
                len(gap), self.epoch.path(gap[0]))


class AuditRegistry:
    """Auditors by token, for the `numpy_function` that checks batches (thread-safe).

    An iteration is registered when it starts and dropped at its marker's
    check, or when it is abandoned. One fed out but abandoned before its last
    check is dropped after `_FINISHED_KEPT` later ones: memory stays bounded.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._auditors: dict[int, Auditor] = {}
        self._fed_out: collections.OrderedDict[int, None] = collections.OrderedDict()

    def open(self, auditor: Auditor) -> int:
        with self._lock:
            token = next(self._tokens)
            self._auditors[token] = auditor
        return token

    def fed_out(self, token: int) -> None:
        """The iteration emitted its marker; its last checks are still to come."""
        with self._lock:
            self._fed_out[token] = None
            stale = []
            while len(self._fed_out) > _FINISHED_KEPT:
                old, _ = self._fed_out.popitem(last=False)
                stale.append(self._auditors.pop(old, None))
        for auditor in stale:
            if auditor is not None:
                auditor.close()

    def close(self, token: int) -> None:
        with self._lock:
            auditor = self._auditors.pop(token, None)
            self._fed_out.pop(token, None)
        if auditor is not None:
            auditor.close()

    def __len__(self) -> int:
        return len(self._auditors)

    @property
    def feeding(self) -> int:
        """Iterations still feeding files (an abandoned one's ends with its generator)."""
        with self._lock:
            return len(self._auditors) - len(self._fed_out)

    @property
    def awaiting(self) -> int:
        """Iterations that fed out every file, their last batches' checks to come
        (none come for an iterator abandoned in between: at most `_FINISHED_KEPT`)."""
        with self._lock:
            return len(self._fed_out)

    def check(self, token: int, positions: list[int]) -> list[tuple[int, Any]]:
        """Checks one batch of iteration `token` (its surviving positions, in
        order); returns the files recovered before them (`Auditor.check`)."""
        with self._lock:
            auditor = self._auditors.get(token)
        if auditor is None:  # an abandoned iteration: nobody reads its batches
            return []
        ended, recovered = auditor.check(positions)
        if ended:
            self.close(token)
        return recovered
