"""The errors every stage shares: a bad file (corrupt or unreadable) and unusable storage.

A file the loader cannot use is a `BadFileError` naming it; the `on_error`
policy raises it or records it and leaves the file out. `CorruptImageError`
(the bytes are not a sound image), `UnresizableImageError` (it decodes, but
Keras's resize of it fails) and `UnreadableFileError` (the bytes could
not be read, after retries) are kept apart, so a storage problem is never
reported as a bad image. `StorageError` is the storage itself failing before
any file is read: an unreachable endpoint, refused credentials, a missing
bucket or prefix.
"""

from __future__ import annotations

_FIX = 'Remove or replace the file, or pass on_error="skip" to leave bad files out.'


class BadFileError(Exception):
    """A file the loader cannot use.

    Attributes:
        path: The file (local path or URL).
        reason: What is wrong with it.
    """

    kind = "bad file"

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        return f"Cannot load {self.path}: {self.reason}. {_FIX}"

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class CorruptImageError(BadFileError, ValueError):
    """The file's bytes are not a sound image."""

    kind = "corrupt"

    def _message(self) -> str:
        return f"Cannot load image file {self.path}: {self.reason}. {_FIX}"


class UnresizableImageError(BadFileError, ValueError):
    """The file decodes, but Keras's resize of it to the requested size fails
    (e.g. `pad_to_aspect_ratio` of a 3x400 image to 64x48: a zero dimension)."""

    kind = "unresizable"

    def _message(self) -> str:
        return (f"Cannot resize image file {self.path}: {self.reason}. Remove or replace the "
                "file, change image_size or the aspect-ratio option, or pass "
                'on_error="skip" to leave such files out.')


class UnreadableFileError(BadFileError, OSError):
    """The file's bytes could not be read (after retries, for remote objects)."""

    kind = "unreadable"

    def _message(self) -> str:
        return (f"Cannot read {self.path}: {self.reason}. Check the storage and retry, "
                'or pass on_error="skip" to leave unreadable files out.')


class StorageError(RuntimeError):
    """The storage cannot be used at all; the message names the cause and the fix."""
