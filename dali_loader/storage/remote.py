"""Remote sources (``gs://`` and other fsspec schemes): listing and verified, cached fetching.

``gs://`` goes through ``google-cloud-storage`` (Application Default Credentials,
anonymous access when there are none, ``STORAGE_EMULATOR_HOST`` honoured) with an
HTTP connection pool sized for ``max_in_flight`` concurrent downloads. Other schemes
(``s3://``, ``az://``, ``memory://``, ...) go through fsspec; both backends live in
:mod:`dali_loader.storage.gcs` and :mod:`dali_loader.storage.fsspec_backend`. This module
lists, verifies and caches: every fetched object is verified (crc32c, else md5, else size),
retried with exponential backoff and full jitter on transient failures, and kept in a
:class:`~dali_loader.storage.cache.DiskCache`.

The first listing of a source fails fast and clearly: the backend's ``check``
(one small request under a short deadline) comes first, and a listing failure that
is the storage's (unreachable endpoint, refused credentials, missing bucket, nothing
under the prefix) is raised as a one-line :class:`~dali_loader.errors.StorageError`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from dali_loader.args import positive_int
from dali_loader.errors import StorageError
from dali_loader.storage.cache import DiskCache, WriteFailures, checksum_problem
from dali_loader.storage.objects import ObjectFetchError, ObjectInfo
from dali_loader.storage.urls import parse_url, suspect, unsafe_reason

logger = logging.getLogger(__name__)

_MAX_WARNED = 20
LIST_THREADS = 32  # concurrent prefix listings (each a sequential chain of pages)


def _describe(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(code, int):
        text = f"HTTP {code} ({text})"
    return text if len(text) <= 300 else text[:297] + "..."


# ------------------------------------------------------------------ source
class RemoteSource:
    """A ``scheme://bucket/prefix`` dataset root: list it, fetch objects through the cache.

    Build one with :func:`open_remote`. ``fetch`` is thread-safe and holds no lock
    while downloading.
    """

    def __init__(self, url: str, backend, cache: DiskCache | None, *,
                 max_attempts: int = 8, initial_backoff: float = 0.05, max_backoff: float = 5.0,
                 deadline: float = 300.0, max_pending_writes: int = 64):
        self.scheme, self.bucket, self.prefix = parse_url(url)
        self.url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.cache = cache
        self._write_failures = WriteFailures(cache.root if cache is not None else "")
        self._backend = backend
        self._list_prefix = self.prefix + "/" if self.prefix else ""
        self._max_attempts = max_attempts
        self._backoff = (initial_backoff, max_backoff)
        self._deadline = deadline
        # Write-behind: fetch() returns as soon as the bytes are verified; the cache
        # write (temp file + fsync + rename) runs on writer threads, at most
        # max_pending_writes queued (then fetch waits: back-pressure, bounded memory).
        self._writer: cf.ThreadPoolExecutor | None = None
        self._writer_lock = threading.Lock()
        self._write_slots = threading.BoundedSemaphore(max_pending_writes)
        self._max_pending = max_pending_writes
        self._pending: dict[tuple[str, str], bytes] = {}  # queued writes, served from memory
        self._checked = False
        self.manifest_used: float | None = None  # the manifest's creation time, when the listing came from one

    @contextlib.contextmanager
    def _listing(self) -> Iterator[None]:
        """Raises the storage's listing failures as the backend describes them (StorageError)."""
        start = time.monotonic()
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            describe = getattr(self._backend, "listing_error", None)
            err = describe(exc, self.url, time.monotonic() - start) if describe is not None else None
            if err is None:
                raise
            raise err from exc

    def _empty_error(self) -> StorageError:
        if not self.prefix:
            return StorageError(f"No objects in {self.url}: the bucket {self.bucket!r} is empty. "
                                "Check the URL, or upload the dataset first.")
        return StorageError(f"No objects under {self.url}/ (prefix {self._list_prefix!r} of bucket "
                            f"{self.bucket!r}). Check the prefix; object names are case-sensitive.")

    def check(self) -> None:
        """Once per source (the first listing calls it): the backend's quick check, if it has one.

        Raises:
            StorageError: as :meth:`list_objects`, within about ten seconds.
        """
        if self._checked:
            return
        check = getattr(self._backend, "check", None)
        if check is not None:
            with self._listing():
                if check(self._list_prefix) is False:
                    raise self._empty_error()
        self._checked = True

    def list_objects(self, manifest: str = "off") -> list[ObjectInfo]:
        """Every object under the prefix (all pages), sorted by name.

        Includes ``"dir/"`` placeholder objects (``rel`` ends with '/'). Names that
        are unusable as dataset paths are dropped with a warning naming them.
        The listing runs one prefix per first-level folder, concurrently
        (:meth:`list_rows`). ``manifest`` (``storage.manifest.MANIFEST_MODES``):
        ``"use"`` takes the listing from the manifest in the cache directory when
        there is one (logged, with how to refresh it) and writes it otherwise;
        ``"refresh"`` lists and rewrites it; ``"off"`` neither reads nor writes it.
        ``manifest_used`` is then the manifest's creation time, or None.

        Raises:
            StorageError: the endpoint is unreachable, the credentials are refused,
                the bucket does not exist, or no object exists under the prefix.
        """
        from dali_loader.storage import manifest as mf

        mf.check_manifest_mode(manifest)
        path = mf.manifest_path(self.cache.root, self.url) if self.cache is not None and manifest != "off" else None
        loaded = mf.load_manifest(path, self.url) if path is not None and manifest == "use" else None
        self.manifest_used = None
        if loaded is not None:
            rows, created = loaded
            self.manifest_used = created
            logger.info("%s: using the listing manifest written %s (%d objects; objects added since are "
                           "not seen). To list again, pass manifest=\"refresh\" or run `dali-loader cache "
                           "manifest %s`.", self.url, mf.describe_age(created), len(rows), self.url)
        else:
            rows = self.list_rows()
        out: list[ObjectInfo] = []
        dropped: list[tuple[str, str]] = []
        n = len(self._list_prefix)
        bucket, scheme = self.bucket, self.scheme
        for name, size, gen, crc, md5 in rows:
            rel = name[n:]
            if not rel:
                continue  # the placeholder of the prefix itself
            reason = unsafe_reason(rel) if suspect(rel) else None  # one search for most names
            if reason:
                dropped.append((name, reason))
                continue
            out.append(ObjectInfo(rel, name, size, gen, crc, md5, bucket, scheme))
        if not rows:
            raise self._empty_error()
        if path is not None and loaded is None:
            try:
                mf.save_manifest(path, self.url, rows)
            except OSError as e:  # a read-only or full cache disk must not stop training
                logger.warning("Could not write the listing manifest %s: %s", path, e)
        for name, reason in dropped[:_MAX_WARNED]:
            logger.warning("Skipping %s://%s/%r: unusable as a dataset path (%s).",
                           self.scheme, self.bucket, name, reason)
        if len(dropped) > _MAX_WARNED:
            logger.warning("Skipped %d more objects with unusable names under %s.",
                           len(dropped) - _MAX_WARNED, self.url)
        if any(a.name > b.name for a, b in zip(out, out[1:])):  # rows come sorted; a manifest edited by hand may not
            out.sort(key=lambda o: o.name)
        return out

    def list_rows(self, parallel: int = LIST_THREADS) -> list[tuple[str, int, str, str | None, str | None]]:
        """The backend's listing rows ``(name, size, generation, crc32c, md5)``, sorted by name.

        With ``parallel`` > 1 and a backend that lists one level (``list_level``):
        one delimiter listing of the prefix, then each sub-prefix listed whole
        on ``parallel`` threads, so the wall time approaches pages x latency /
        ``parallel``. A flat prefix (no sub-folders) is that one listing.
        """
        self.check()
        level = getattr(self._backend, "list_level", None)
        with self._listing():
            if parallel <= 1 or level is None:
                rows = list(self._backend.iter_objects(self._list_prefix))
            else:
                rows, subs = level(self._list_prefix)
                if subs:
                    with cf.ThreadPoolExecutor(min(parallel, len(subs)), thread_name_prefix="list") as pool:
                        for part in pool.map(lambda p: list(self._backend.iter_objects(p)), subs):
                            rows += part
        rows.sort()
        return rows

    def list_class_dirs(self) -> list[str]:
        """First-level "directories" under the prefix (sorted, without slashes).

        Raises:
            StorageError: as :meth:`list_objects`.
        """
        self.check()
        with self._listing():
            dirs = self._backend.iter_dirs(self._list_prefix)
        return sorted(d for d in dirs if d and unsafe_reason(d) is None)

    def fetch(self, info: ObjectInfo, keep: bool = True) -> bytes:
        """The verified bytes of ``info``: from the cache, else downloaded (and
        cached, with ``keep``).

        Raises:
            ObjectFetchError: the object kept failing, or is gone/forbidden.
        """
        if self.cache is not None:
            data = self._pending.get((info.name, info.generation)) or self.cache.get(self.bucket, info)
            if data is not None:
                return data
        data = self._download_verified(info)
        if self.cache is not None and keep:
            self._write_behind(info, data)
        return data

    def pin(self, info: ObjectInfo) -> tuple[str, int] | None:
        """`(pinned cache file, payload offset)` of an object this process has
        verified and written to the cache, held against eviction until `unpin`;
        or None (then use `fetch`)."""
        if self.cache is None or (info.name, info.generation) in self._pending:
            return None
        return self.cache.pin(self.bucket, info)

    def unpin(self, pinned: str) -> None:
        """Releases a file returned by `pin`."""
        assert self.cache is not None  # `pin` returns a file only with a cache
        self.cache.unpin(pinned)

    def _write_behind(self, info: ObjectInfo, data: bytes) -> None:
        assert self.cache is not None  # `fetch` writes behind only with a cache
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    self._writer = cf.ThreadPoolExecutor(16, thread_name_prefix="cache-writer")
        self._write_slots.acquire()
        key = (info.name, info.generation)
        with self._writer_lock:
            self._pending[key] = data
        try:
            fut = self._writer.submit(self.cache.put, self.bucket, info, data)
        except BaseException:
            self._write_done(key, None)
            raise
        fut.add_done_callback(lambda f: self._write_done(key, f))

    def _write_done(self, key: tuple[str, str], fut: cf.Future | None) -> None:
        with self._writer_lock:
            self._pending.pop(key, None)
        self._write_slots.release()
        if fut is None:
            return
        err = fut.exception()
        if err is not None:  # a full disk must not stop training: refetched later
            if isinstance(err, OSError):
                self._write_failures.add(err)  # logged once per cause
            else:
                logger.warning("Could not write to the cache %s: %s", getattr(self.cache, "root", None), err)

    def flush(self) -> None:
        """Wait until every cache write queued by fetch() is on disk."""
        for _ in range(self._max_pending):
            self._write_slots.acquire()
        for _ in range(self._max_pending):
            self._write_slots.release()

    def ensure_cached(self, info: ObjectInfo) -> bool:
        """Make sure a verified copy is cached; True when it had to be downloaded."""
        if self.cache is None:
            raise ValueError("ensure_cached needs a cache. Received: cache=None")
        if self.cache.contains(self.bucket, info):
            return False
        self.cache.put(self.bucket, info, self._download_verified(info))
        return True

    def _download_verified(self, info: ObjectInfo) -> bytes:
        from google.api_core.retry import exponential_sleep_generator  # full jitter

        delays = exponential_sleep_generator(*self._backoff, multiplier=2.0)
        give_up_at = time.monotonic() + self._deadline
        reason = "no attempt made"
        for attempt in range(1, self._max_attempts + 1):
            try:
                data = self._backend.download(info)
            except Exception as exc:  # classified below; permanent ones raise at once
                if not self._backend.retryable(exc):
                    if type(exc).__name__ == "NotFound" and info.generation:
                        raise ObjectFetchError(info.url, f"not found at generation {info.generation} "
                                               "(deleted or changed since it was listed)") from exc
                    raise ObjectFetchError(info.url, _describe(exc)) from exc
                reason = _describe(exc)
            else:
                problem = checksum_problem(data, info.size, info.crc32c, info.md5)
                if problem is None:
                    return data
                reason = problem
            delay = next(delays)
            if attempt == self._max_attempts or time.monotonic() + delay > give_up_at:
                break
            logger.debug("Retrying %s in %.2fs (attempt %d): %s", info.url, delay, attempt, reason)
            time.sleep(delay)
        raise ObjectFetchError(info.url, f"{reason} (gave up after {attempt} attempts)")

    def close(self) -> None:
        """Finish pending cache writes, release pins and close the HTTP session."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self.cache is not None:
            failed = sum(self._write_failures.take().values())
            if failed:
                logger.warning("%d writes to the cache %s failed in all; those objects were "
                               "read uncached.", failed, self.cache.root)
            self.cache.close()
        self._backend.close()

    def __enter__(self) -> RemoteSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_remote(url: str, *, cache_dir: str | None = None, cache_max_bytes: int | None = None,
                max_in_flight: int = 64, max_attempts: int = 8, timeout: float = 60.0,
                media_via: str = "urllib3") -> RemoteSource:
    """Open ``gs://bucket/prefix`` (or another fsspec URL) with a disk cache.

    Args:
        url: ``gs://bucket/prefix``; ``gcs://``, ``s3://``, ``az://``... also work
            (non-gs schemes need their fsspec package, e.g. ``s3fs``).
        cache_dir: cache directory; default ``$XDG_CACHE_HOME/dali-loader``.
        cache_max_bytes: cache size bound (LRU eviction); default half of the free
            disk space.
        max_in_flight: concurrent downloads the caller will run (sizes the HTTP
            connection pool).
        max_attempts: attempts per object before :class:`ObjectFetchError`.
        timeout: per-request read timeout in seconds.
        media_via: gs:// downloads through "urllib3" (default, less CPU per object) or
            the google-cloud-storage "client" (``Blob.download_as_bytes``).

    Raises:
        ValueError: ``max_in_flight`` or ``max_attempts`` is not a positive integer.
        StorageError: the credentials file named by GOOGLE_APPLICATION_CREDENTIALS is
            unusable. Unreachable storage is reported by the first listing.
    """
    positive_int("max_in_flight", max_in_flight)
    positive_int("max_attempts", max_attempts)
    backend = _make_backend(url, pool_size=max_in_flight + 4, timeout=timeout, media_via=media_via)
    try:
        cache = DiskCache(cache_dir, cache_max_bytes)
    except BaseException:
        backend.close()
        raise
    return RemoteSource(url, backend, cache, max_attempts=max_attempts, max_pending_writes=max_in_flight)


def check_remote(url: str) -> None:
    """Fails fast when ``url`` cannot be listed: one small request, no cache.

    For tools that list with their own client: call this first to get the clear,
    bounded-time error instead of minutes of retries.

    Raises:
        StorageError: unreachable endpoint, refused credentials, missing bucket, or
            no object under the prefix.
    """
    source = RemoteSource(url, _make_backend(url, pool_size=2, timeout=60.0, media_via="client"), None)
    try:
        source.check()
    finally:
        source.close()


def _make_backend(url: str, *, pool_size: int, timeout: float, media_via: str):
    scheme, bucket, _ = parse_url(url)
    if scheme == "gs":
        from dali_loader.storage.gcs import GCSBackend

        return GCSBackend(bucket, pool_size=pool_size, timeout=timeout, media_via=media_via)
    from dali_loader.storage.fsspec_backend import FsspecBackend

    return FsspecBackend(scheme, bucket)
