"""The GPU-ready cache as item readers: each image decoded on the CPU once, then read ready.

The first time a file is read, its pixels are decoded exactly as Keras does
(the `decode` callable the caller gives: TF's kernels) and re-encoded
losslessly (`formats.ready`) into the source's disk cache. Later reads,
in any epoch and any process sharing the cache, take the entry instead and
never decode the file on the CPU again.

Entries are keyed by the file's identity (a gs:// object's generation; a
local file's path, size and mtime), the form and the colour mode (the only
options that change the decoded pixels; resizing happens after). They are
written atomically, LRU-bounded by the cache's size, and shared by processes
(`storage.cache.DiskCache`).

A dataset's readers keep one row per file (`ReadyTable`, 56 bytes): the
entry's key, computed once (again only when a local file's size or mtime
changes), and its payload offset once checked. A cached read is one stat of
the source file (local folders), one `open` of the entry, and one `close`
when the consumer releases it: the open descriptor is the pin. Any process
may evict the entry meanwhile; POSIX keeps an open file readable, so an
entry handed out is read exactly once, whole. The first use of an entry in a
process checks its header (the same file, form and version) and its size
(written whole: temp file, then rename); the CRC32C in the header is checked
when the entry is written and when `bytes(path)` reads it (the prefetch tool).

A file the decoder rejects raises `CorruptImageError` naming it; a file
that cannot be read, `UnreadableFileError`: the feed's `on_error` policy
applies as for any reader.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, overload

import numpy as np

from dali_loader.errors import CorruptImageError, UnreadableFileError
from dali_loader.feed.checks import over_limit
from dali_loader.feed.items import OpenEntry, read_errors
from dali_loader.formats import png
from dali_loader.formats.limits import BIG_PNG_PIXELS
from dali_loader.formats.ready import ReadyForm, encode_parts, join_parts
from dali_loader.formats.sniff import image_size
from dali_loader.storage.cache import DerivedMeta, DiskCache, WriteFailures

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when what an entry holds changes


# An entry's bytes: read as they are, or a view of the memory `alloc` gave (no copy).
# (A name of its own: inside `ReadyCache`, `bytes` is the method.)
Blob = bytes | bytearray | memoryview
FileBytes = bytes  # a file's bytes as the source read them


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

    def count(self, what: str, tally) -> None:
        """Counts a `hits` or `fills` (and into an epoch's `tally`)."""
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)
        if tally is not None:
            tally.add(f"cache_{what}")

    def bytes(self, path: str, tally=None) -> Blob:
        """The entry's bytes, checked against its CRC32C (filled first when missing);
        a large entry is not copied."""
        data = self.cache.get(self.namespace, self.meta(path), remember=False, view=True,
                              alloc=self.alloc)
        if data is not None:
            self.count("hits", tally)
            return data
        return self.fill(path, tally)

    @overload
    def fill(self, path: str, tally=None, store: bool = True,
             read_back: Literal[True] = True,
             read: tuple[FileBytes, str | None] | None = None, raw_back: bool = False) -> Blob: ...
    @overload
    def fill(self, path: str, tally=None, store: bool = True, *,
             read_back: bool, read: tuple[FileBytes, str | None] | None = None,
             raw_back: bool = False) -> Blob | None: ...

    def fill(self, path: str, tally=None, store: bool = True,
             read_back: bool = True,
             read: tuple[FileBytes, str | None] | None = None,
             raw_back: bool = False) -> Blob | None:
        """Reads and decodes `path` on the CPU, stores its entry (unless not
        `store`), returns its bytes (None when it was stored and not `read_back`:
        the caller opens the entry itself). `read`: the file's bytes and version
        when the caller read them. `raw_back`: for a reader that takes either form
        (the DALI operator), an image of at most `BIG_PNG_PIXELS` comes back as a
        raw entry of its pixels once its entry is stored, not read back and decoded
        again.

        The decoded pixels are written as they are and dropped before the entry
        is read back, so a large image is held once (never pixels and entry)."""
        data, version = read or self.read(path)
        del read
        decoded = self.decode(data, path)
        del data
        parts = encode_parts(decoded, self.form)
        # Kept only to hand back (never a big image's: it would be held twice).
        pixels = (decoded if raw_back and decoded.shape[0] * decoded.shape[1] <= BIG_PNG_PIXELS
                  else None)
        del decoded
        self.count("fills", tally)
        if not (store and self._store(path, version, parts, tally)):
            return join_parts(parts)
        del parts
        if pixels is not None:
            return join_parts(encode_parts(pixels, ReadyForm.RAW))
        meta = DerivedMeta(path, version or "")  # stored: the version was known
        if not read_back:
            return None
        entry = self.cache.get(self.namespace, meta, remember=False, view=True, alloc=self.alloc)
        # Evicted at once (a cache smaller than its working set): decoded again, not stored.
        return entry if entry is not None else self.fill(path, tally, store=False)

    def fill_pixels(self, path: str, tally=None,
                    read: tuple[FileBytes, str | None] | None = None) -> np.ndarray:
        """Reads and decodes `path` on the CPU, stores its entry, and returns the
        pixels themselves (HxWxC uint8): a caller that wants pixels (the TF path's
        compact batches) does not decode the entry it just wrote. `read`: the file's
        bytes and version when the caller read them."""
        data, version = read or self.read(path)
        del read
        pixels = self.decode(data, path)
        del data
        self.count("fills", tally)
        self._store(path, version, encode_parts(pixels, self.form), tally)
        return pixels

    def read(self, path: str) -> tuple[FileBytes, str | None]:
        """`path`'s bytes and the version they are of (a failed read named)."""
        with read_errors(path):
            return self.source.read_versioned(path)

    def store(self, path: str, version: str, entry: list | Blob, tally=None) -> bool:
        """Writes an entry encoded elsewhere (the TF op's fills) for `path` as of
        `version`; False when it was not stored."""
        return self._store(path, version, entry, tally)

    def _store(self, path: str, version: str | None, parts: list | Blob, tally) -> bool:
        """Writes `path`'s entry (as of `version`); False when it was not stored
        (the file changed while it was read, a full or read-only cache)."""
        if version is None:
            logger.info("%s changed while it was read; not cached.", path)
            return False
        try:
            return self.cache.put(self.namespace, DerivedMeta(path, version), parts,
                                  remember=False)
        except OSError as e:  # a full disk must not stop training: logged once per cause
            self.write_failures.add(e)
            if tally is not None:
                tally.add("cache_write_failures")
            return False


class ReadyTable:
    """One dataset's rows of the GPU-ready cache, by index position: each
    entry's key (SHA-256, computed once per dataset, again only when a local
    file changed), the source version it was computed for, the payload offset
    once the entry was checked in this process, and when this process last
    refreshed its place in the LRU order. 56 bytes per file, whatever the epochs."""

    def __init__(self, ready: ReadyCache, paths: list[str]):
        n = len(paths)
        self.ready = ready
        self.paths = paths
        self.local = ready.source.remote is None
        self._digest = np.zeros((n, 32), np.uint8)
        self._size = np.full(n, -1, np.int64)  # -1: no key yet
        self._mtime = np.zeros(n, np.int64)
        self._offset = np.zeros(n, np.int32)  # 0: not checked in this process
        self._touched = np.zeros(n, np.uint32)  # seconds since _t0 (+1) of the last mtime refresh
        self._t0 = time.monotonic()

    def _entry(self, pos: int) -> tuple[str, str]:
        """`(entry file, source version)` of position `pos` (one stat for local files)."""
        path = self.paths[pos]
        if self.local:
            try:
                st = os.stat(path)
            except OSError:
                with read_errors(path):  # says what went wrong, naming the file
                    raise
            size, mtime = st.st_size, st.st_mtime_ns
            version = None
        else:
            size, mtime = 0, 0
            version = self.ready.source.version(path)
        if self._size[pos] != size or self._mtime[pos] != mtime:  # first use, or the file changed
            version = version or f"{size}.{mtime}"
            self._digest[pos] = np.frombuffer(
                DiskCache.digest(self.ready.namespace, path, version), np.uint8)
            self._size[pos], self._mtime[pos] = size, mtime
            self._offset[pos] = 0
        return self.ready.cache.entry_path(self._digest[pos].tobytes().hex()), version or f"{size}.{mtime}"

    def forget(self, pos: int) -> None:
        """Marks `pos`'s entry unchecked in this process (it was found damaged)."""
        self._offset[pos] = 0

    def open(self, pos: int) -> OpenEntry | None:
        """The entry of `pos`, open (checked on its first use in this process), or
        None when it is missing, bad (removed) or cannot be opened now."""
        entry, version = self._entry(pos)
        try:
            fd = os.open(entry, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as e:  # EMFILE and the like: read it as bytes instead
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                logger.debug("Cannot open the cache entry %s: %s", entry, e)
            return None
        try:
            offset = int(self._offset[pos])
            if not offset:
                offset = self.ready.cache.check_open(fd, entry, self.ready.namespace,
                                                     DerivedMeta(self.paths[pos], version)) or 0
                if not offset:
                    os.close(fd)
                    return None
                self._offset[pos] = offset
            now = int(time.monotonic() - self._t0) + 1
            if now - int(self._touched[pos]) >= self.ready.cache.touch_interval_s or not self._touched[pos]:
                self._touched[pos] = now
                self.ready.cache.touch_fd(fd)
        except BaseException:
            os.close(fd)
            raise
        return OpenEntry(fd, offset)


class PngFill(NamedTuple):
    """A PNG to fill the cache from in the graph (the native op decodes it and writes
    its entry, `ReadyCache.store` keeps it): its bytes, its version when read, and
    its size from a sound IHDR."""

    data: bytes
    version: str | None
    height: int
    width: int


class ReadyPinned:
    """Item reader for a consumer that reads entries itself (the TF path's batch
    reader): by index position, an open entry (`OpenEntry`, which the kernel is
    asked to read ahead, `POSIX_FADV_WILLNEED`), closed when released; or, when it
    had to be filled: the entry's bytes (raw form); for the compact form a PNG for
    the TF op to decode and write (`PngFill`, with `png_fills`: the plan's
    `fill_where` is the op), else the decoded pixels (the batch copies them) or,
    for a big image, the entry written and opened (`_fill`)."""

    io = True
    holds = True
    tallies = True
    positional = True

    def __init__(self, ready: ReadyCache, paths: list[str], png_fills: bool = False,
                 max_pixels: int | None = None):
        self.ready = ready
        self.table = ReadyTable(ready, paths)
        self.png_fills = png_fills and ready.form is ReadyForm.COMPACT
        self.max_pixels = max_pixels
        self.refused: set[str] = set()  # files the op refused: decoded here from then on

    def _fill(self, pos: int, tally) -> PngFill | np.ndarray | OpenEntry | Blob:
        """A compact miss: a PNG with a sound header for the op to decode and write
        (`png_fills`), else its pixels decoded here (the batch copies them; the entry
        is written), or, for an image over `BIG_PNG_PIXELS` or of unknown size, its
        entry written and then read like a hit (a big image's pixels are never held
        twice). A file the op refused once (libpng's, or corrupt) is decoded here,
        where its error, if any, is raised before it is counted as a fill."""
        path = self.table.paths[pos]
        data, version = self.ready.read(path)
        head = png.read_ihdr(data)
        size = (head.width, head.height) if head is not None else image_size(data)
        small = size is not None and size[0] * size[1] <= BIG_PNG_PIXELS
        if (self.png_fills and small and head is not None and not png.ihdr_problem(head)
                and path not in self.refused):
            problem = over_limit(size, self.max_pixels)
            if problem:
                raise CorruptImageError(path, problem)
            return PngFill(data, version, head.height, head.width)  # counted once in a batch
        held = [(data, version)]  # handed over: the fill drops the bytes once decoded
        del data, head
        if small:
            return self.ready.fill_pixels(path, tally, read=held.pop())
        stored = self.ready.fill(path, tally, read_back=False, read=held.pop())
        if stored is not None:  # not stored (changed while read, a full or read-only cache)
            return stored
        item = self.table.open(pos)
        # Evicted at once: decoded again, not stored.
        return item if item is not None else self.ready.fill(path, tally, store=False)

    def __call__(self, pos: int, tally=None) -> OpenEntry | Blob | np.ndarray | PngFill:
        item = self.table.open(pos)
        if item is None:
            path = self.table.paths[pos]
            if self.ready.form is ReadyForm.COMPACT:
                return self._fill(pos, tally)
            # Filled, then opened like a hit: the pixels are read once, from the file
            # into the batch (a large image is never held twice).
            data = self.ready.fill(path, tally, read_back=False)
            if data is not None:  # not stored (changed while read, a full or read-only cache)
                return data
            item = self.table.open(pos)
            if item is None:  # evicted at once: decoded again, not stored
                return self.ready.fill(path, tally, store=False)
        else:
            self.ready.count("hits", tally)
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(item.fd, item.offset, 0, os.POSIX_FADV_WILLNEED)
            except OSError:  # only a hint
                pass
        return item

    def release(self, item: Any) -> None:
        if isinstance(item, OpenEntry):
            os.close(item.fd)


class ReadyBytes:
    """Item reader by index position: the entry's bytes (compact entries for the
    native TF op or DALI operator, their headers checked; raw pixels for DALI)."""

    io = True
    holds = False
    tallies = True
    positional = True

    def __init__(self, ready: ReadyCache, paths: list[str]):
        self.ready = ready
        self.table = ReadyTable(ready, paths)

    def __call__(self, pos: int, tally=None) -> Blob:
        item = self.table.open(pos)
        if item is None:  # the operator takes the fill's pixels as they are (a raw entry)
            return self.ready.fill(self.table.paths[pos], tally, raw_back=True)
        try:
            size = os.fstat(item.fd).st_size - item.offset
            data: Blob
            if self.ready.alloc is None:
                data = os.pread(item.fd, size, item.offset)
            else:  # into the decoder's pooled memory: a large entry does not add a copy
                # numpy's stubs give ndarray `__buffer__` (typing's Buffer) from Python 3.12 only
                buf = memoryview(self.ready.alloc(size)).cast("B")  # type: ignore[arg-type]
                data = buf[:os.preadv(item.fd, [buf], item.offset)]
        except OSError as e:
            raise UnreadableFileError(self.table.paths[pos], f"reading its cache entry failed ({e})") from None
        finally:
            os.close(item.fd)
        if len(data) != size:
            return self.ready.fill(self.table.paths[pos], tally)
        if self.ready.form is ReadyForm.COMPACT and not self._sound(pos, data, tally):
            return self.ready.fill(self.table.paths[pos], tally)  # replaces the entry
        self.ready.count("hits", tally)
        return data

    def _sound(self, pos: int, data, tally) -> bool:
        """Whether a compact entry's header, chunk table and frame headers hold (the
        core's checks, no decompression); a bad entry is logged, to be refilled. The
        pixels' CRC-32 is checked where the entry is decoded."""
        from dali_loader.formats import compact

        try:
            compact.info(data)
        except compact.EntryError as e:
            logger.warning("The GPU-ready cache entry of %s is damaged (%s); decoding the "
                           "file again.", self.table.paths[pos], e)
            self.table.forget(pos)
            if tally is not None:
                tally.add("cache_bad_entries")
            return False
        return True

    def release(self, item: Any) -> None:
        pass
