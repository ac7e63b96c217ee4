"""The GPU-ready cache as item readers: each image decoded on the CPU once, then read ready.

The first time a file is read, its pixels are decoded exactly as Keras does
(the `decode` callable the caller gives: TF's kernels) and re-encoded
losslessly (`decode.ready_forms`) into the source's disk cache. Later reads,
in any epoch and any process sharing the cache, take the entry instead and
never decode the file on the CPU again.

Entries are keyed by the file's identity (a gs:// object's generation; a
local file's path, size and mtime), the form and the colour mode (the only
options that change the decoded pixels; resizing happens after). They are
written atomically, checked against their own CRC32C on first use in a
process, LRU-bounded by the cache's size, and shared by processes
(`storage.cache.DiskCache`).

A file the decoder rejects raises `CorruptImageError` naming it; a file
that cannot be read, `UnreadableFileError`: the feed's `on_error` policy
applies as for any reader.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dali_loader.decode.ready_forms import ReadyForm, encode_parts, join_parts
from dali_loader.feed.items import Pinned, read_errors
from dali_loader.storage.cache import DerivedMeta, WriteFailures

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when what an entry holds changes


class ReadyCache:
    """Looks up, and fills, one source's entries of one form and colour mode.

    Args:
        source: The `storage.source.Source` (its `cache` holds the entries).
        form: The `ReadyForm` the decoder reads.
        channels: 1, 3 or 4 (Keras's colour mode).
        decode: `decode(data, path) -> HxWxC uint8` pixels exactly as Keras
            decodes them; raises `CorruptImageError` naming `path`.
        alloc: `alloc(nbytes)` -> a writable uint8 array that entries are read
            into (e.g. from the decoder's own memory pool); default: bytes.

    `fills` (CPU decodes) and `hits` count since creation; each epoch counts
    its own as `cache_fills` and `cache_hits` (`FeedEpoch.tally`).
    """

    def __init__(self, source, form: ReadyForm, channels: int,
                 decode: Callable[[bytes, str], np.ndarray],
                 alloc: Callable[[int], np.ndarray] | None = None):
        self.source = source
        self.cache = source.cache
        self.form = form
        self.channels = channels
        self.decode = decode
        self.alloc = alloc
        self.namespace = f"ready.v{FORMAT_VERSION}/{form.value}/c{channels}"
        self.fills = 0
        self.hits = 0
        self.write_failures = WriteFailures(self.cache.root)
        self._lock = threading.Lock()

    def meta(self, path: str) -> DerivedMeta:
        """The cache key of `path`'s current content."""
        with read_errors(path):
            return DerivedMeta(path, self.source.version(path))

    def _count(self, what: str, tally) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)
        if tally is not None:
            tally.add(f"cache_{what}")

    def pinned(self, path: str, tally=None) -> Pinned | bytes:
        """A pinned entry (hand its file to a reader; `unpin` it after), or
        the entry's bytes when it cannot be pinned (no hard links, read-only)."""
        meta = self.meta(path)
        where = self.cache.pin(self.namespace, meta)
        if where is None:
            data = self.cache.get(self.namespace, meta, view=True, alloc=self.alloc)
            if data is None:
                return self.fill(path, tally, pinned=True)
            where = self.cache.pin(self.namespace, meta)  # verified now
            if where is None:  # no hard links here (or a read-only cache): the bytes
                self._count("hits", tally)
                return data
        self._count("hits", tally)
        return Pinned(*where)

    def bytes(self, path: str, tally=None) -> bytes:
        """The entry's bytes (filled first when missing); a large entry is not copied."""
        data = self.cache.get(self.namespace, self.meta(path), view=True,
                              alloc=self.alloc)
        if data is not None:
            self._count("hits", tally)
            return data
        return self.fill(path, tally)

    def fill(self, path: str, tally=None, pinned: bool = False,
             store: bool = True) -> Pinned | bytes:
        """Reads and decodes `path` on the CPU, stores its entry (unless not
        `store`), returns it: pinned when asked and possible, else its bytes.

        The decoded pixels are written as they are and dropped before the entry
        is read back, so a large image is held once (never pixels and entry)."""
        with read_errors(path):
            data, version = self.source.read_versioned(path)
        parts = encode_parts(self.decode(data, path), self.form)
        del data
        self._count("fills", tally)
        if version is None or not store:
            if store:
                logger.info("%s changed while it was read; not cached.", path)
            return join_parts(parts)
        meta = DerivedMeta(path, version)
        try:
            stored = self.cache.put(self.namespace, meta, parts)
        except OSError as e:  # a full disk must not stop training: logged once per cause
            self.write_failures.add(e)
            if tally is not None:
                tally.add("cache_write_failures")
            stored = False
        if not stored:
            return join_parts(parts)
        del parts
        where = self.cache.pin(self.namespace, meta) if pinned else None
        if where is not None:
            return Pinned(*where)
        entry = self.cache.get(self.namespace, meta, view=True, alloc=self.alloc)
        # Evicted at once (a cache smaller than its working set): decoded again, not stored.
        return entry if entry is not None else self.fill(path, tally, store=False)

    def release(self, item: Any) -> None:
        if isinstance(item, Pinned):
            self.cache.unpin(item.file)


class ReadyPinned:
    """Item reader for a consumer that reads entries itself (the TF path's batch
    reader): a pinned entry, which the kernel is asked to read ahead
    (`POSIX_FADV_WILLNEED`), or the entry's bytes when it cannot be pinned."""

    io = True
    holds = True
    tallies = True

    def __init__(self, ready: ReadyCache):
        self.ready = ready

    def __call__(self, path: str, tally=None) -> Pinned | bytes:
        item = self.ready.pinned(path, tally)
        if isinstance(item, Pinned) and hasattr(os, "posix_fadvise"):
            try:
                fd = os.open(item.file, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, item.offset, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
            except OSError:  # only a hint
                pass
        return item

    def release(self, item: Any) -> None:
        self.ready.release(item)


class ReadyBytes:
    """Item reader: the entry's bytes (raw pixels for TF's kernels or DALI; or a
    TIFF for DALI)."""

    io = True
    holds = False
    tallies = True

    def __init__(self, ready: ReadyCache):
        self.ready = ready

    def __call__(self, path: str, tally=None) -> bytes:
        return self.ready.bytes(path, tally)

    def release(self, item: Any) -> None:
        pass
