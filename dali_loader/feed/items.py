"""How one indexed file becomes an item for a decoder: an item reader per decoder and source.

Each reader is a callable `reader(path) -> item` (or `reader(position)` when
its `positional` is True: the GPU-ready cache's, `feed.ready`), run on the read-ahead's
threads, that raises a `BadFileError` naming the file when it cannot; `io`
says whether it does I/O at all (else it runs inline), `holds` whether its
items hold something to give back, and `release(item)` gives it back (a pinned
cache file). Items that hold nothing are not tracked after they are handed out.

- `CheckedBytes`: the bytes, checked (content sniff, PNG chunk/CRC walk), for
  DALI, whose pipeline dies on a bad file.
- `RawBytes`: the bytes, unchecked, for TF's kernels (their failures are audited).
- `Paths`: the path itself; TF reads local disk files cheaper than Python does
  (each file's header read once, for `max_pixels`).
- `PinnedOrBytes`: a verified gs:// cache entry, pinned so that no eviction
  removes it before TF has read it, or else the bytes (fetched and cached).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from dali_loader.errors import CorruptImageError, UnreadableFileError
from dali_loader.feed.checks import peek_size_problem, prepare, size_problem
from dali_loader.formats.limits import DEFAULT_MAX_PIXELS
from dali_loader.formats.sniff import sniff
from dali_loader.storage.objects import ObjectFetchError


class Pinned(NamedTuple):
    """A verified local copy that stays on disk until released: read it from `offset` on."""

    file: str
    offset: int


class OpenEntry(NamedTuple):
    """A verified cache entry, open: read it from `offset` on; the descriptor
    keeps it readable (whatever evicts it) until the holder closes it."""

    fd: int
    offset: int


@contextlib.contextmanager
def read_errors(path: str) -> Iterator[None]:
    """Turns a failed read of `path` (gone, fetch failed, I/O error) into `UnreadableFileError`."""
    try:
        yield
    except FileNotFoundError:
        raise UnreadableFileError(path, _missing_reason(path)) from None
    except ObjectFetchError as e:
        raise UnreadableFileError(path, e.reason) from None
    except OSError as e:
        raise UnreadableFileError(path, f"read failed ({e})") from None


def _missing_reason(path: str) -> str:
    """Why a listed local file is not there: a dangling symlink (naming its
    target), or gone since indexing."""
    try:
        target = os.readlink(path)
    except (OSError, ValueError):  # not a link, or a URL
        return "the file disappeared since indexing"
    return f"a dangling symbolic link (its target {target!r} does not exist)"


def read_bytes(source, path: str) -> bytes:
    """`source.read(path)`, with read failures as `UnreadableFileError`."""
    with read_errors(path):
        return source.read(path)


def _refuse_over(path: str, problem: str | None) -> None:
    if problem:
        raise CorruptImageError(path, problem)


class RawBytes:
    """Bytes for a decoder whose failures are audited (TF's kernels): only the
    header's size is checked (`max_pixels`)."""

    io = True
    holds = False

    def __init__(self, source, max_pixels: int | None = DEFAULT_MAX_PIXELS):
        self.source = source
        self.max_pixels = max_pixels

    def __call__(self, path: str) -> bytes:
        data = read_bytes(self.source, path)
        _refuse_over(path, size_problem(data, self.max_pixels))
        return data

    def release(self, item: Any) -> None:
        pass


class CheckedBytes(RawBytes):
    """Checked bytes for DALI; `rgba` expands alpha the way libpng does; images
    whose header claims over `max_pixels` are refused.
    Counts JPEGs into an epoch's tally (`jpeg`: the files a GPU decodes)."""

    tallies = True

    def __init__(self, source, rgba: bool = False, max_pixels: int | None = DEFAULT_MAX_PIXELS):
        super().__init__(source, max_pixels)
        self.rgba = rgba

    def __call__(self, path: str, tally=None) -> bytes:
        data = prepare(read_bytes(self.source, path), path, rgba=self.rgba,
                       max_pixels=self.max_pixels)
        if tally is not None and sniff(data) == "jpeg":
            tally.add("jpeg")
        return data


class Paths:
    """The path itself: the decoder reads the file (TF, on a local disk). Takes
    index positions (`positional`). The header is read here, to refuse an image
    over `max_pixels` (None: not read), once per file while it passes: a file's
    later epochs cost no I/O in Python. (TF's decoder refuses PNGs and JPEGs of
    2**29 pixels or more itself, on every read, before allocating.)"""

    io = False
    holds = False
    positional = True

    def __init__(self, paths: list[str], max_pixels: int | None = DEFAULT_MAX_PIXELS):
        self.paths = paths
        self.max_pixels = max_pixels
        # One byte per file: whether its header passed (set by any epoch's thread).
        self._passed = None if max_pixels is None else np.zeros(len(paths), np.bool_)

    def __call__(self, pos: int) -> str:
        path = self.paths[pos]
        if self._passed is not None and not self._passed[pos]:
            with read_errors(path):
                _refuse_over(path, peek_size_problem(path, self.max_pixels))
            self._passed[pos] = True
        return path

    def release(self, item: Any) -> None:
        pass


class PinnedOrBytes:
    """A pinned verified cache entry when there is one, else the (cached) bytes."""

    io = True
    holds = True

    def __init__(self, source, max_pixels: int | None = DEFAULT_MAX_PIXELS):
        self.source = source
        self.max_pixels = max_pixels

    def __call__(self, path: str) -> Pinned | bytes:
        where = self.source.pin(path)
        if where is None:
            data = read_bytes(self.source, path)
            _refuse_over(path, size_problem(data, self.max_pixels))
            return data
        try:
            with read_errors(path):
                _refuse_over(path, peek_size_problem(where[0], self.max_pixels, where[1]))
        except BaseException:
            self.source.unpin(where[0])
            raise
        return Pinned(*where)

    def release(self, item: Any) -> None:
        if isinstance(item, Pinned):
            self.source.unpin(item.file)
