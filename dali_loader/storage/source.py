"""Where the bytes come from: a local folder, a FUSE/network mount, or a URL.

A `Source` answers what the index and the feed ask: which files exist
(relative names), which first-level folders exist (class discovery), how to
read one file's bytes (thread-safe), and for URLs, how to hold a verified
cache entry so another reader can take it from disk (`pin`). Remote URLs go
through `storage.remote` and its verified disk cache; the connections and
cache pins are released when the source is closed or garbage-collected.
"""

from __future__ import annotations

import enum
import os
import posixpath
import threading

from dali_loader.reaper import Finalizer
from dali_loader.storage.local import (
    local_subdirs,
    on_network_fs,
    read_local,
    read_local_versioned,
    version_of,
    walk_local,
)
from dali_loader.storage.urls import is_remote


class SourceKind(enum.Enum):
    """Where a source's files live, which decides who reads them."""

    LOCAL_DISK = "local disk"  # cheap reads: TF's own reads are fine
    NETWORK_FS = "network file system"  # FUSE/NFS: per-file latency, many reads in flight
    REMOTE = "remote"  # gs://, s3://...: fetched and verified into a local cache


def kind_of(source: str) -> SourceKind:
    """Where `source`'s files live, from its name (a URL) or its mount (`/proc/mounts`),
    before it is listed: the one place this is decided."""
    if is_remote(source):
        return SourceKind.REMOTE
    if source.startswith("file://"):
        source = source[len("file://"):]
    return SourceKind.NETWORK_FS if on_network_fs(source) else SourceKind.LOCAL_DISK


class Source:
    """A listed dataset root.

    Attributes:
        root: The folder or normalized URL the names are relative to.
        rel_files: Every file, '/'-separated, relative to `root`.
        subdirs: First-level folder names.
        kind: A `SourceKind`.
        remote: The `RemoteSource` for URLs, else None.
    """

    def __init__(self, root: str, rel_files: list[str], subdirs: list[str], kind: SourceKind,
                 remote=None, objects: dict | None = None, *, cache_dir: str | None = None,
                 cache_max_bytes: int | None = None):
        self.root = root
        self.rel_files = rel_files
        self.subdirs = subdirs
        self.kind = kind
        self.remote = remote
        self._objects = objects or {}  # URL -> ObjectInfo
        self._users = 0
        self._lock = threading.Lock()
        self._cache_args = (cache_dir, cache_max_bytes)
        self._local_caches: list = []  # at most one, closed with the source
        # Collected: closed on the reaper's thread, never inside the collector (reaper.py).
        self._finalizer = Finalizer(self, _close, remote, self._local_caches)

    def forget_listing(self) -> None:
        """Drops `rel_files` once an index holds the paths (about 80 bytes per file)."""
        self.rel_files = []

    @property
    def join(self):
        """Joins a root and name parts: `posixpath.join` for URLs, else `os.path.join`."""
        return posixpath.join if self.remote is not None else os.path.join

    def read(self, path: str) -> bytes:
        """The bytes of one full path or URL (verified and cached, for URLs)."""
        if self.remote is None:
            return read_local(path)
        return self.remote.fetch(self._objects[path])

    def version(self, path: str) -> str:
        """What identifies the current content of `path` in cache keys: a gs://
        object's generation (from the listing), a local file's size and mtime.

        Raises:
            FileNotFoundError: a local file gone since indexing.
        """
        if self.remote is None:
            return version_of(os.stat(path))
        return self._objects[path].generation

    def size(self, path: str) -> int:
        """The size of `path` in bytes (URLs: from the listing)."""
        if self.remote is None:
            return os.path.getsize(path)
        return self._objects[path].size

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        """The bytes of `path` and the version they are (None when a local file
        changed while it was read). URLs are downloaded verified against the
        listing, but not kept in the object cache (the caller keeps what it
        derives)."""
        if self.remote is None:
            return read_local_versioned(path)
        info = self._objects[path]
        return self.remote.fetch(info, keep=False), info.generation

    @property
    def cache(self):
        """The local `DiskCache`: a URL's object cache, or for a folder one
        opened on first use (`cache_dir`, `cache_max_bytes`), for derived entries."""
        if self.remote is not None:
            return self.remote.cache
        with self._lock:
            if not self._local_caches:
                from dali_loader.storage.cache import DiskCache

                self._local_caches.append(DiskCache(*self._cache_args))
            return self._local_caches[0]

    def pin(self, path: str) -> tuple[str, int] | None:
        """For URLs: `(local file, payload offset)` of a verified cache entry,
        held against eviction until `unpin`; None when not cached (use `read`)."""
        if self.remote is None:
            return None
        return self.remote.pin(self._objects[path])

    def unpin(self, pinned: str) -> None:
        """Releases a file returned by `pin`."""
        self.remote.unpin(pinned)

    def acquire(self) -> None:
        """One more user (a feed) that needs the source open."""
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """A user is done; the last one closes the source."""
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    def close(self) -> None:
        """Finishes queued cache writes, releases pins and closes connections
        (idempotent). Also runs when the source is garbage-collected."""
        self._finalizer()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(remote, caches: list) -> None:
    if remote is not None:
        remote.close()
    for cache in caches:
        cache.close()


def open_source(
    directory: str,
    follow_links: bool = False,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
    max_in_flight: int = 64,
    labels_inferred: bool = True,
    manifest: str = "use",
) -> Source:
    """Lists a local folder or a remote prefix (with `manifest`, see
    `RemoteSource.list_objects`; local folders are always walked).

    Raises:
        FileNotFoundError: the local folder does not exist.
    """
    if is_remote(directory):
        from dali_loader.storage.remote import open_remote

        remote = open_remote(directory, cache_dir=cache_dir, cache_max_bytes=cache_max_bytes,
                             max_in_flight=max_in_flight)
        try:
            infos = remote.list_objects(manifest)
        except BaseException:
            remote.close()
            raise
        objects = {}
        rel_files = []
        base = remote.url + "/"
        for info in infos:
            if info.rel.endswith("/"):
                continue  # a folder placeholder object
            rel_files.append(info.rel)
            objects[base + info.rel] = info
        subdirs = sorted({i.rel.split("/", 1)[0] for i in infos if "/" in i.rel})
        return Source(remote.url, rel_files, subdirs, SourceKind.REMOTE, remote, objects)

    if directory.startswith("file://"):
        directory = directory[len("file://"):]
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Directory not found: {directory}. Pass an existing folder, a FUSE "
            "mount point, or a gs://bucket/prefix URL."
        )
    rel_files = walk_local(directory, follow_links)
    if labels_inferred and not follow_links:
        # Keras walks each class folder on its own, so a class folder that is
        # itself a symlink is listed even without follow_links.
        for d in local_subdirs(directory):
            if os.path.islink(os.path.join(directory, d)):
                sub = walk_local(os.path.join(directory, d), follow_links)
                rel_files += [f"{d}/{r}" for r in sub]
    return Source(directory, rel_files, local_subdirs(directory), kind_of(directory),
                  cache_dir=cache_dir, cache_max_bytes=cache_max_bytes)
