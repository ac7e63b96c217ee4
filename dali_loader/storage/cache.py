"""A bounded, verified, multi-process-safe local disk cache for remote objects.

Layout under ``root``::

    v1/objects/ab/ab12...   one file per object: header + payload
    v1/tmp/                 temp files being written (pid in the name)
    v1/pins/PID.ID/         hard links to entries a reader holds (pid in the name)
    v1/lock                 fcntl lock, held only for bookkeeping and eviction
    v1/usage                the bytes in objects/, as processes last synced them

A cache file is named by ``sha256(bucket, object name, generation)``, never by the
object name, so hostile names cannot escape ``root`` and a changed object (new
generation) is a different entry. Each file starts with a JSON header (bucket, name,
generation, size, checksums); a hit is trusted only when the header matches the
listing and the payload has the expected size and checksum. Writes go to a temp file
and are ``os.replace``d into place, so a killed writer never leaves a partial file
under an object's name. No fsync by default: a process verifies each entry before first use
against the checksum, so even a file torn by a power loss is detected and fetched again.
Least-recently-used order is the file mtime, refreshed on every hit; eviction trims to a low watermark under the lock.

A reader that hands an entry's path to another reader (TF reads warm entries
itself) first *pins* it: a hard link under ``pins/``. Eviction unlinks only the
name under ``objects/``, so a pinned file stays readable until it is unpinned;
pins of a killed process are removed like its temp files. (The GPU-ready
cache holds an open descriptor instead: `check_open`, `feed.ready`.)

Opening a cache does not stat every entry: the usage is read from ``v1/usage``,
which each process updates with what it added (every `_SYNC_EVERY` writes and on
close) and eviction rewrites exactly; only a cache without it is scanned once.

A cache this process cannot write in (a read-only mount, a folder of another
user) is opened read-only: its verified entries are used as they are, without
the lock (a complete cache shipped on a read-only image), and nothing new is
written (`put` returns False). A write that fails (a full disk) is the
caller's to count: `WriteFailures` logs the first of each cause only.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from typing import Protocol
from collections.abc import Iterator

from dali_loader.formats import cache_entry

logger = logging.getLogger(__name__)

_LOW_WATERMARK = 0.9  # evict down to this fraction of max_bytes
_TOUCH_EVERY_S = 60.0
_SYNC_EVERY = 256  # writes between updates of the shared usage file
_MAX_REMEMBERED = 200_000  # entries whose verification and LRU refresh one process remembers


class ObjectMeta(Protocol):
    """What the cache needs to know about an object (``remote.ObjectInfo`` fits)."""

    # Read-only (properties): `remote.ObjectInfo` is a frozen dataclass.
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def generation(self) -> str: ...
    @property
    def crc32c(self) -> str | None: ...
    @property
    def md5(self) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class DerivedMeta:
    """An entry the cache checks against itself: made here (not downloaded), its
    size and CRC32C are taken when it is written and verified on every read.

    `name` and `generation` identify what it was derived from (e.g. a file and
    its size and mtime); the caller's `bucket` names the derivation."""

    name: str
    generation: str
    size: None = None
    crc32c: None = None
    md5: None = None


def _header_problem(header: dict, bucket: str, meta: ObjectMeta, payload: int) -> str | None:
    """Why an entry's header does not vouch for ``meta`` and a payload of ``payload``
    bytes, or None: the one rule of both readers (`get`, `check_open`)."""
    size = header.get("size")
    if (header.get("bucket"), header.get("name"), header.get("generation")) != \
            (bucket, meta.name, meta.generation):
        return "header does not match the object"
    if not isinstance(size, int) or (meta.size is not None and size != meta.size):
        return "wrong size in the header"
    if isinstance(meta, DerivedMeta) and not header.get("crc32c"):
        return "no checksum in the header"
    if payload != size:
        return f"partial or wrong size: {payload} of {size} bytes"
    return None


_CRC_STEP = 64 << 20  # bytes per CRC32C update: a large entry is never copied whole


def _crc32c(data) -> str:
    """Base64 CRC32C of bytes, or of buffers (memoryviews, numpy arrays; a list
    of them one after the other) in steps: a large entry is never copied whole."""
    import google_crc32c

    if isinstance(data, bytes):
        return base64.b64encode(struct.pack(">I", google_crc32c.value(data))).decode()
    crc = google_crc32c.Checksum()
    for part in data if isinstance(data, list) else [data]:
        view = memoryview(part).cast("B")
        for at in range(0, len(view), _CRC_STEP):
            crc.update(bytes(view[at:at + _CRC_STEP]))
    return base64.b64encode(crc.digest()).decode()


def _nbytes(part) -> int:
    return part.nbytes if hasattr(part, "nbytes") else len(part)


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/dali-loader`` (``~/.cache/dali-loader`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dali-loader")


def checksum_problem(data: bytes, size: int | None, crc32c: str | None, md5: str | None) -> str | None:
    """Why ``data`` does not match the expected size/checksums, or None when it does.

    CRC32C is used when known (fast, C-accelerated), else MD5; both are base64 as
    GCS reports them.
    """
    if size is not None and len(data) != size:
        return f"size mismatch: expected {size} bytes, got {len(data)}"
    if crc32c:
        got = _crc32c(data)
        if got != crc32c:
            return f"crc32c mismatch: expected {crc32c}, got {got}"
    elif md5:
        got = base64.b64encode(hashlib.md5(data).digest()).decode()
        if got != md5:
            return f"md5 mismatch: expected {md5}, got {got}"
    return None


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache's contents."""

    root: str
    objects: int
    bytes: int
    temp_files: int
    max_bytes: int | None


class DiskCache:
    """The disk cache; thread-safe and shared safely between processes.

    Args:
        root: the cache directory (created if missing).
        max_bytes: the size bound; None means half of (free space + current usage),
            computed when the cache is opened.
        verify_on_hit: check the checksum on every hit (size and header are always
            checked).
        fsync: fsync each file before it is renamed into place (off by default:
            hits are verified, and fsync halved first-epoch throughput here).
        touch_interval_s: refresh an entry's LRU time (its mtime) at most this often
            per process; a hit costs one syscall less in between.
    """

    def __init__(self, root: str | None = None, max_bytes: int | None = None, *,
                 verify_on_hit: bool = True, fsync: bool = False, touch_interval_s: float = _TOUCH_EVERY_S):
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes or None. Received: max_bytes={max_bytes}")
        self.root = os.path.abspath(os.path.expanduser(root or default_cache_dir()))
        self._base = os.path.join(self.root, "v1")
        self._objects = os.path.join(self._base, "objects")
        self._folders: set[str] = set()  # entry folders this instance made or found
        self._tmp = os.path.join(self._base, "tmp")
        self._pins_root = os.path.join(self._base, "pins")
        self._pins = os.path.join(self._pins_root, f"{os.getpid()}.{uuid.uuid4().hex[:12]}")
        self._pin_ids = itertools.count()
        self._pins_made = False
        self.verify_on_hit = verify_on_hit
        self.fsync = fsync
        self.touch_interval_s = touch_interval_s
        self._mutex = threading.Lock()  # guards _approx_bytes
        self._usage = os.path.join(self._base, "usage")
        self.read_only = not self._open_writable()
        if self.read_only:  # no lock: nothing here is written
            used = self._read_usage()
            if used is None:
                used = self._scan_usage()[1]
        else:
            with self._locked():
                self._remove_stale_temp()
                used = self._read_usage()
                if used is None:  # a cache written before the usage file: scanned once
                    used = self._scan_usage()[1]
                    self._write_usage(used)
        if max_bytes is None:
            max_bytes = max(1, (shutil.disk_usage(self.root).free + used) // 2)
        self.max_bytes = int(max_bytes)
        self._approx_bytes = used
        self._delta = 0  # bytes this process added (or removed) since it last synced the usage file
        self._added = 0  # bytes this process ever wrote (an eviction's scan may miss the latest)
        self._writes = 0
        self._touched: dict[str, float] = {}  # path -> when this process last refreshed its mtime
        # path -> (payload offset, payload size), for entries this process verified
        # (read or wrote).
        self._verified: dict[str, tuple[int, int]] = {}

    def _open_writable(self) -> bool:
        """Creates the layout; False (logged once) when this process cannot write in it."""
        try:
            for folder in (self._objects, self._tmp, self._pins_root):
                os.makedirs(folder, exist_ok=True)
            os.close(os.open(os.path.join(self._base, "lock"), os.O_RDWR | os.O_CREAT, 0o644))
            for folder in (self._objects, self._tmp, self._pins_root):
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise PermissionError(errno.EACCES, "not writable", folder)
            return True
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
                raise
            cause = e
        if os.path.isdir(self._objects):
            logger.info("The cache %s is read-only here (%s): its entries are used as they "
                        "are, without taking its lock; nothing new is cached.", self.root,
                        cause.strerror)
        else:
            logger.warning("The cache %s cannot be written (%s): reads go uncached. Pass a "
                           "writable cache_dir to cache them.", self.root, cause.strerror)
        return False

    # ---------------------------------------------------------------- keys
    @staticmethod
    def digest(bucket: str, name: str, generation: str) -> bytes:
        """The SHA-256 digest that names one object version's entry."""
        return hashlib.sha256(f"{bucket}\0{name}\0{generation}\0".encode("utf-8", "surrogatepass")).digest()

    @staticmethod
    def key(bucket: str, name: str, generation: str) -> str:
        """The cache key of one object version: a hex digest, safe as a file name."""
        return DiskCache.digest(bucket, name, generation).hex()

    def entry_path(self, key: str) -> str:
        """The file of the entry named by the hex ``key``."""
        return f"{self._objects}{os.sep}{key[:2]}{os.sep}{key}"

    def path_for(self, bucket: str, meta: ObjectMeta) -> str:
        """The file that holds (or would hold) ``meta``'s bytes."""
        return self.entry_path(self.key(bucket, meta.name, meta.generation))

    # ------------------------------------------------------------ get/put
    def get(self, bucket: str, meta: ObjectMeta, remember: bool = True, *, view: bool = False,
            alloc=None) -> bytes | None:
        """The verified cached bytes of ``meta``, or None (a miss, or a bad entry, removed).

        With ``remember``, this process remembers the entry as verified (for `pin`).
        With ``view``, a memoryview of the payload instead of bytes: no copy of
        the payload (a large entry is held once, not twice); ``alloc(nbytes)``
        then gives the writable uint8 array the file is read into (default: bytes)."""
        path = self.path_for(bucket, meta)
        try:
            blob: bytes | memoryview
            with open(path, "rb") as f:
                if view and alloc is not None:
                    buf = memoryview(alloc(os.fstat(f.fileno()).st_size)).cast("B")
                    blob = buf[:f.readinto(buf)]
                else:  # one read: syscalls hand the GIL over, copies are cheap
                    blob = f.read()
        except FileNotFoundError:
            return None
        problem, data = self._decode(memoryview(blob) if view else blob, bucket, meta)
        if problem:
            self._discard(path, meta.name, bucket, problem, len(blob))
            return None
        if remember:
            self._remember(path, (len(blob) - len(data), len(data)))
        self._touch(path)
        return data

    def _remember(self, path: str, where: tuple[int, int]) -> None:
        if len(self._verified) >= _MAX_REMEMBERED:
            self._verified.clear()  # bounded memory; worst case a re-verification
        self._verified[path] = where

    def _discard(self, path: str, name: str, bucket: str, problem: str, size: int) -> None:
        logger.warning("Discarding the cache entry of %s (%s): %s.", name, bucket, problem)
        with contextlib.suppress(OSError):  # gone, or a read-only cache
            os.unlink(path)
            with self._mutex:
                self._delta -= size
        self._verified.pop(path, None)

    def check_open(self, fd: int, path: str, bucket: str, meta: ObjectMeta) -> int | None:
        """The payload offset of the entry open as ``fd`` (at ``path``) when its
        header names ``meta`` and the file holds the whole payload; else None
        (the entry is removed). Reads the header only: the payload's CRC32C was
        checked when the entry was written, and the file was renamed into place
        whole, so a changed size is what a torn or foreign file shows."""
        try:
            head = os.pread(fd, 4096, 0)
            end = cache_entry.header_end(head)
            problem: str | None = "bad header"
            if end is not None:
                if end > len(head):
                    head = os.pread(fd, end, 0)
                problem = _header_problem(cache_entry.read_header(head, end), bucket, meta,
                                          os.fstat(fd).st_size - end)
        except (OSError, ValueError) as e:
            problem = f"unreadable header ({e})"
        if problem:
            self._discard(path, meta.name, bucket, problem, 0)
            return None
        return end

    def touch_fd(self, fd: int) -> None:
        """Refreshes the LRU time (mtime) of the entry open as ``fd``."""
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(fd)

    def _touch(self, path: str) -> None:
        """Refreshes the entry's least-recently-used clock (its mtime), at most
        once per `touch_interval_s` per entry and process."""
        now = time.monotonic()
        last = self._touched.get(path)
        if last is None or now - last >= self.touch_interval_s:
            if len(self._touched) > 200_000:
                self._touched.clear()  # bounded memory; worst case an extra utime
            self._touched[path] = now
            with contextlib.suppress(OSError):
                os.utime(path)

    def pin(self, bucket: str, meta: ObjectMeta) -> tuple[str, int] | None:
        """Holds an entry this process already verified: `(pinned file, payload
        offset)`, or None (not cached, not verified here, or no hard links on
        this file system; then use `get`).

        The pinned file is a hard link that eviction, by any process, does not
        remove: a reader can take the payload straight from it (TF's own reads)
        without copying it through Python. Release it with `unpin`. A hit
        refreshes the entry's place in the LRU order, like `get`.
        """
        path = self.path_for(bucket, meta)
        verified = self._verified.get(path)
        if verified is None or self.read_only:
            return None
        offset, size = verified
        if not self._pins_made:
            os.makedirs(self._pins, exist_ok=True)
            self._pins_made = True
        pinned = os.path.join(self._pins, f"{os.path.basename(path)}.{next(self._pin_ids)}")
        try:
            os.link(path, pinned)
        except FileNotFoundError:  # evicted since it was verified
            self._verified.pop(path, None)
            return None
        except OSError as e:  # EPERM, EXDEV, ENOTSUP...: no pins on this file system
            logger.debug("Cannot pin %s (%s); reading through Python instead.", path, e)
            return None
        if os.stat(pinned).st_size != offset + size:  # replaced by another writer
            self.unpin(pinned)
            self._verified.pop(path, None)
            return None
        self._touch(path)
        return pinned, offset

    def unpin(self, pinned: str) -> None:
        """Releases a file returned by `pin` (the entry may be evicted again)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pinned)

    def close(self) -> None:
        """Releases every pin this instance still holds; records what it added in the usage file."""
        shutil.rmtree(self._pins, ignore_errors=True)
        self._pins_made = False
        with contextlib.suppress(OSError):
            self._sync_usage()

    def _decode(self, blob, bucket: str, meta: ObjectMeta) -> tuple[str | None, bytes]:
        end = cache_entry.header_end(blob)
        try:
            header = cache_entry.read_header(blob, end) if end is not None else None
        except ValueError:
            header = None
        if header is None:
            return "bad header", b""
        data = blob[end:]
        problem = _header_problem(header, bucket, meta, len(data))
        if problem:
            return problem, b""
        if self.verify_on_hit or isinstance(meta, DerivedMeta):
            if isinstance(meta, DerivedMeta):  # checked against what was written
                size, crc32c, md5 = header["size"], header["crc32c"], None
            else:
                size, crc32c, md5 = meta.size, meta.crc32c, meta.md5
            problem = checksum_problem(data, size, crc32c, md5)
            if problem:
                return problem, b""
        return None, data

    def put(self, bucket: str, meta: ObjectMeta, data, remember: bool = True) -> bool:
        """Store verified ``data`` for ``meta`` atomically; False when it cannot fit
        (or the cache is read-only). ``data``: bytes, or a list of buffers (e.g. a
        header and a numpy array) written one after the other, never joined.

        With ``remember``, this process remembers the entry as verified (for `pin`)."""
        parts = data if isinstance(data, list) else [data]
        size = sum(_nbytes(p) for p in parts)
        if self.read_only or size > self.max_bytes * _LOW_WATERMARK:
            return False
        crc32c = _crc32c(data) if isinstance(meta, DerivedMeta) else meta.crc32c
        header = cache_entry.pack_header({"bucket": bucket, "name": meta.name,
                                          "generation": meta.generation, "size": size,
                                          "crc32c": crc32c, "md5": meta.md5})
        path = self.path_for(bucket, meta)
        tmp = os.path.join(self._tmp, f"{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                for part in parts:
                    f.write(part)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            self._replace(tmp, path)
            if remember:
                self._remember(path, (len(header), size))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with self._mutex:
            self._approx_bytes += len(header) + size
            self._delta += len(header) + size
            self._added += len(header) + size
            self._writes += 1
            over = self._approx_bytes > self.max_bytes
            sync = self._writes % _SYNC_EVERY == 0
        if over:
            self.evict(int(self.max_bytes * _LOW_WATERMARK))
        elif sync:
            self._sync_usage()
        return True

    def _replace(self, tmp: str, path: str) -> None:
        """Renames `tmp` to `path`, making its folder the first time this instance
        writes there (folders are never removed: one `mkdir` per folder, not per
        write; again if the folder went meanwhile)."""
        folder = os.path.dirname(path)
        if folder not in self._folders:
            os.makedirs(folder, exist_ok=True)
            self._folders.add(folder)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            os.makedirs(folder, exist_ok=True)
            os.replace(tmp, path)

    # ------------------------------------------------------------------ usage
    def _read_usage(self) -> int | None:
        try:
            with open(self._usage) as f:
                return max(0, int(json.load(f)["bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_usage(self, used: int) -> None:
        tmp = f"{self._usage}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"bytes": int(used)}, f)
        os.replace(tmp, self._usage)

    def _sync_usage(self) -> None:
        """Adds what this process wrote since the last sync to the shared usage file."""
        if not self._delta:
            return
        with self._locked():
            with self._mutex:
                delta, self._delta = self._delta, 0
            used = self._read_usage()
            if used is None:
                used = self._scan_usage()[1]
            else:
                used = max(0, used + delta)
            self._write_usage(used)
            with self._mutex:
                self._approx_bytes = used + self._delta

    def contains(self, bucket: str, meta: ObjectMeta) -> bool:
        """Whether a verified entry for ``meta`` is cached."""
        return self.get(bucket, meta) is not None

    # ----------------------------------------------------------- bookkeeping
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The cross-process lock (fcntl.flock; a no-op where fcntl is missing)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fd = os.open(os.path.join(self._base, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _entries(self) -> Iterator[os.DirEntry]:
        if not os.path.isdir(self._objects):  # a read-only cache never made
            return
        with os.scandir(self._objects) as shards:
            for shard in shards:
                if shard.is_dir(follow_symlinks=False):
                    with os.scandir(shard.path) as files:
                        yield from (e for e in files if e.is_file(follow_symlinks=False))

    def _scan_usage(self) -> tuple[int, int]:
        n = total = 0
        for e in self._entries():
            with contextlib.suppress(FileNotFoundError):
                total += e.stat(follow_symlinks=False).st_size
                n += 1
        return n, total

    def _remove_stale_temp(self) -> None:
        """Remove temp files and pins of processes that are gone (e.g. killed with SIGKILL)."""
        for folder in (self._tmp, self._pins_root):
            for e in os.scandir(folder):
                pid = e.name.split(".", 1)[0]
                if pid.isdigit() and _pid_alive(int(pid)):
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)

    def evict(self, target_bytes: int) -> int:
        """Delete least-recently-used entries until usage <= ``target_bytes``; returns bytes freed."""
        if self.read_only:
            return 0
        with self._locked():
            with self._mutex:
                added = self._added
            entries = []
            for e in self._entries():
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
            total = sum(size for _, size, _ in entries)
            freed = 0
            entries.sort()
            for _, size, path in entries:
                if total - freed <= target_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._verified.pop(path, None)
                freed += size
            with self._mutex:
                # Entries written while the scan ran may be missing from `total`:
                # counted again (at worst twice), so the next write over the bound
                # evicts again instead of the cache staying over it.
                self._approx_bytes = total - freed + self._added - added
                self._delta = 0
            self._write_usage(total - freed)
        if freed:
            logger.debug("Evicted %d bytes from %s.", freed, self.root)
        return freed

    def stats(self) -> CacheStats:
        """Count entries, bytes and leftover temp files."""
        n, total = self._scan_usage()
        temp = len(os.listdir(self._tmp)) if os.path.isdir(self._tmp) else 0
        return CacheStats(self.root, n, total, temp, self.max_bytes)

    def clear(self) -> None:
        """Remove every entry and temp file of stopped processes."""
        with self._locked():
            for e in list(self._entries()):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
            self._remove_stale_temp()
            with self._mutex:
                self._approx_bytes = 0
                self._delta = 0
            self._write_usage(0)
            self._verified.clear()


class WriteFailures:
    """Failed cache writes (a full disk): the first of each cause is logged, the
    rest only counted; `take()` hands the count over (e.g. at an epoch's end)."""

    def __init__(self, root: str):
        self.root = root
        self._lock = threading.Lock()
        self._causes: set[str] = set()
        self._count: collections.Counter[str] = collections.Counter()

    def add(self, err: OSError) -> None:
        """Counts one failed write; logs it when its cause is new."""
        cause = err.strerror or type(err).__name__
        with self._lock:
            new = cause not in self._causes
            self._causes.add(cause)
            self._count[cause] += 1
        if new:
            logger.warning("Could not write to the cache %s (%s): nothing is lost, the data is "
                           "read uncached; further failures of this cause are counted, not "
                           "logged.", self.root, err)

    def take(self) -> dict[str, int]:
        """Cause -> failed writes since the last call."""
        with self._lock:
            out, self._count = dict(self._count), collections.Counter()
        return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

