"""The `on_error` policy, as a handler: raise a bad file's error, or record it and go on."""

from __future__ import annotations

import logging
import threading

from dali_loader.errors import BadFileError
from dali_loader.plan import ON_ERROR, check_on_error  # noqa: F401 - the one check

logger = logging.getLogger(__name__)


class SkipReport:
    """What every iteration of one dataset left out, for the user (thread-safe).

    Reporting only: it never changes what a later epoch reads.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._files: dict[str, BadFileError] = {}

    def add(self, err: BadFileError) -> bool:
        """Records `err`; True when its file was not recorded before."""
        with self._lock:
            new = err.path not in self._files
            self._files[err.path] = err
        return new

    def as_dict(self) -> dict[str, str]:
        """File -> reason, for every file left out so far."""
        with self._lock:
            return {p: e.reason for p, e in self._files.items()}

    def of_kind(self, kind: str) -> dict[str, str]:
        """File -> reason, for files of one `BadFileError.kind` ("corrupt", "unreadable")."""
        with self._lock:
            return {p: e.reason for p, e in self._files.items() if e.kind == kind}


class EpochErrors:
    """One iteration's handler: raises a bad file's error, or records it there and
    in the dataset's `SkipReport`, and logs it once."""

    def __init__(self, on_error: str, report: SkipReport):
        self.on_error = check_on_error(on_error)
        self.report = report
        self.skipped: dict[str, str] = {}

    def __call__(self, err: BadFileError) -> None:
        if self.on_error == "raise":
            raise err
        self.skipped[err.path] = err.reason
        if self.report.add(err):
            logger.warning("Skipping %s: %s [%s]", err.path, err.reason, err.kind)
