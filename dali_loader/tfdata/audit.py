"""The TF path's audit: every file an iteration emitted is decoded, or named.

TF's kernels decode under `ignore_errors()`, which drops a failing element
without a word. Each iteration gets an `Auditor`, registered under a token that
rides along with every element: after batching, the surviving positions are
checked, in order, against what that iteration emitted. A gap is a file that
failed in TF; the auditor reads it again and decodes it eagerly to say why
(unreadable, or corrupt) and hands the error to the iteration's `on_error`
handler. Each iteration ends with a marker element, so a failure on its very
last file is caught too, and an exception of the feed is held and raised there
(raised earlier, `ignore_errors()` would swallow it and cut the epoch short).
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from dali_loader.errors import BadFileError
from dali_loader.feed.epochs import Chunk, FeedEpoch

T = TypeVar("T")
END = -1  # the marker's position
_FINISHED_KEPT = 64  # fed-out iterations awaiting their last checks


class Auditor:
    """One iteration: emits its feed epoch's chunks, then checks decoded positions.

    Args:
        open_epoch: Starts the iteration's `FeedEpoch` (in `chunks`, so that a
            failure to start is held and raised like any other).
        diagnose: `path -> exception` for a file that dropped out: a
            `BadFileError` (unreadable or corrupt) or another error to raise.
    """

    def __init__(self, open_epoch: Callable[[], FeedEpoch],
                 diagnose: Callable[[str], Exception]):
        self._open_epoch = open_epoch
        self.epoch: FeedEpoch | None = None
        self.diagnose = diagnose
        self.emitted: collections.deque[int] = collections.deque()
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

    def check(self, positions: list[int]) -> bool:
        """Accounts for every emitted position up to each survivor; True at the end."""
        try:
            for pos in positions:
                while self.emitted and self.emitted[0] != pos:
                    self._dropped(self.emitted.popleft())
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
            return True
        return False

    def _dropped(self, pos: int) -> None:
        self.epoch.release([pos])
        err = self.diagnose(self.epoch.path(pos))
        if isinstance(err, BadFileError):
            self.epoch.errors(err)  # raises, or records and goes on
        else:
            raise err


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

    def check(self, token: int, positions: list[int]) -> bool:
        """Checks one batch of iteration `token` (its surviving positions, in order)."""
        with self._lock:
            auditor = self._auditors.get(token)
        if auditor is None:  # an abandoned iteration: nobody reads its batches
            return True
        if auditor.check(positions):
            self.close(token)
        return True
