"""What a remote listing returns: one object's identity, size and checksums."""

from __future__ import annotations

from typing import NamedTuple


class ObjectFetchError(IOError):
    """An object could not be fetched (after retries); ``.url`` names it."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"Could not fetch {url}: {reason}")
        self.url = url
        self.reason = reason


class ObjectInfo(NamedTuple):
    """One object of a listing (a named tuple: a listing of a million is made in a fraction of a second).

    Attributes:
        rel: name relative to the prefix, '/'-separated (ends with '/' for a
            directory placeholder object).
        name: full object name in the bucket.
        size: size in bytes.
        generation: the object generation ("" when the backend has none).
        crc32c: base64 big-endian CRC32C as GCS gives it, or None.
        md5: base64 MD5, or None.
        bucket: the bucket.
        scheme: the URL scheme ("gs", "s3", ...).
    """

    rel: str
    name: str
    size: int
    generation: str
    crc32c: str | None
    md5: str | None
    bucket: str = ""
    scheme: str = "gs"

    @property
    def url(self) -> str:
        """``scheme://bucket/name``."""
        return f"{self.scheme}://{self.bucket}/{self.name}"
