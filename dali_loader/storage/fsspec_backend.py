"""Any fsspec filesystem (s3://, az://, memory://, ...) behind
:class:`~dali_loader.storage.remote.RemoteSource`."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Iterator

from dali_loader.errors import StorageError

if TYPE_CHECKING:
    from dali_loader.storage.objects import ObjectInfo


class FsspecBackend:
    """Any fsspec filesystem (s3://, az://, memory://, ...)."""

    def __init__(self, scheme: str, bucket: str):
        import fsspec
        from fsspec.registry import known_implementations

        try:
            self.fs = fsspec.filesystem(scheme)
        except ImportError as e:
            impl = known_implementations.get(scheme, {})
            pkg = impl.get("class", scheme).split(".")[0]
            raise ImportError(f"Reading {scheme}:// URLs needs the '{pkg}' package: pip install {pkg} "
                              f"({impl.get('err', e)})") from e
        except ValueError as e:
            raise ValueError(f"Unknown URL scheme {scheme!r}; fsspec has no filesystem for it. "
                             f"Received: scheme={scheme!r}") from e
        self.scheme = scheme
        self.bucket = bucket

    def _path(self, name: str) -> str:
        return self.fs._strip_protocol(f"{self.scheme}://{self.bucket}/{name}".rstrip("/"))

    def _row(self, path: str, d: dict) -> tuple[str, int, str, str | None, str | None]:
        name = path[len(self._path("")):].lstrip("/")
        gen = next((d[k] for k in ("generation", "VersionId", "ETag", "etag", "mtime",
                                   "LastModified", "last_modified", "created") if d.get(k)), "")
        return name, int(d.get("size") or 0), str(gen), d.get("crc32c"), d.get("md5Hash")

    def iter_objects(self, prefix: str) -> Iterator[tuple[str, int, str, str | None, str | None]]:
        """Every object under ``prefix``: ``(name, size, generation, crc32c, md5)``."""
        for path, d in sorted(self.fs.find(self._path(prefix), withdirs=False, detail=True).items()):
            yield self._row(path, d)

    def list_level(self, prefix: str) -> tuple[list[tuple[str, int, str, str | None, str | None]], list[str]]:
        """The objects right under ``prefix`` and its sub-prefixes (full names, ending in '/')."""
        rows, subs = [], []
        bucket_root = self._path("")
        try:
            entries = self.fs.ls(self._path(prefix), detail=True)
        except FileNotFoundError:  # nothing under the prefix: the caller says so
            return [], []
        for e in entries:
            if e.get("type") == "directory":
                subs.append(e["name"].rstrip("/")[len(bucket_root):].lstrip("/") + "/")
            else:
                rows.append(self._row(e["name"], e))
        return rows, subs

    def iter_dirs(self, prefix: str) -> list[str]:
        return [p[len(prefix):].strip("/") for p in self.list_level(prefix)[1]]

    def download(self, info: ObjectInfo) -> bytes:
        return self.fs.cat_file(self._path(info.name))

    def listing_error(self, exc: BaseException, url: str, elapsed: float | None = None) -> StorageError | None:
        """A one-line :class:`StorageError` for a missing bucket/prefix or refused access; else None."""
        if isinstance(exc, FileNotFoundError):
            return StorageError(f"Cannot list {url}: not found ({exc}). Check the bucket and the prefix; "
                                "names are case-sensitive.")
        if isinstance(exc, PermissionError):
            return StorageError(f"Cannot list {url}: access denied ({exc}). Check the credentials that "
                                f"fsspec's {self.scheme}:// filesystem uses (its environment variables or "
                                "config file) and their permission to list the bucket.")
        return None

    @staticmethod
    def retryable(exc: BaseException) -> bool:
        return not isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                                    NotADirectoryError, ValueError, ImportError, TypeError))

    def close(self) -> None:
        pass
