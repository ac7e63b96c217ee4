"""The trainer's count of what each epoch delivered: every file once, or which were not.

A graph dataset's elements carry their file's position and whether the worker
could read and decode it (`graph_dataset`). The trainer records each batch
here (one Python call per batch, on the trainer only; the workers' graph has
no Python): per epoch, how many times each file arrived, which files were bad
(raised, or skipped and reported) and, once the next epoch starts or on
request, which were missing or repeated (a tf.data service worker restarted
mid-epoch: at-most-once, docs/service.md).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np

from dali_loader.errors import BadFileError
from dali_loader.feed.policy import SkipReport, check_on_error

logger = logging.getLogger(__name__)

BAD_REASON = ("TensorFlow could not read or decode it on the worker that had it (the worker's "
              "log has TensorFlow's message)")
KEEP_EPOCHS = 2  # per-file counts kept for the last epochs; older ones keep their summary


class WorkerBadFileError(BadFileError, ValueError):
    """A file a worker's graph could not read or decode (the trainer learns only that)."""

    kind = "bad"


@dataclasses.dataclass(frozen=True)
class EpochCount:
    """What one epoch (one `iter()`) delivered to the trainer.

    Attributes:
        epoch: 0 for the first iteration of the dataset, then 1, 2, ...
        files: Files in the index.
        delivered: Files that arrived (each counted once).
        skipped: Bad files left out (`on_error="skip"`).
        missing: Files that never arrived and were not reported bad.
        repeated: Files that arrived more than once.
    """

    epoch: int
    files: int
    delivered: int
    skipped: int
    missing: int
    repeated: int

    @property
    def exactly_once(self) -> bool:
        """Every good file once, none twice."""
        return self.missing == 0 and self.repeated == 0


class EpochTally:
    """Per-epoch arrival counts of one dataset's files, fed batch by batch (thread-safe)."""

    def __init__(self, paths: list[str], on_error: str):
        self.paths = paths
        self.on_error = check_on_error(on_error)
        self.skip_report = SkipReport()
        self._lock = threading.Lock()
        self._epochs: dict[int, int] = {}  # epoch key -> epoch number
        self._counts: dict[int, np.ndarray] = {}  # epoch number -> arrivals per file
        self._bad: dict[int, set[int]] = {}
        self._done: dict[int, EpochCount] = {}

    def record(self, key, positions, ok) -> np.int64:
        """Records one batch of epoch `key`: file positions and their ok flags.

        Raises:
            WorkerBadFileError: a bad file, with `on_error="raise"` (naming it).
        """
        key = int(key)
        positions = np.asarray(positions, np.int64)
        ok = np.asarray(ok, bool)
        with self._lock:
            epoch = self._epoch_of(key)
            np.add.at(self._counts[epoch], positions[ok], 1)
            bad = positions[~ok]
            self._bad[epoch].update(int(p) for p in bad)
        for p in bad:
            err = WorkerBadFileError(self.paths[int(p)], BAD_REASON)
            if self.on_error == "raise":
                raise err
            if self.skip_report.add(err):
                logger.warning("Skipping %s: %s", err.path, err.reason)
        return np.int64(len(positions))

    def _epoch_of(self, key: int) -> int:
        if key not in self._epochs:
            for older in list(self._counts):
                self._close(older)
            epoch = len(self._epochs)
            self._epochs[key] = epoch
            self._counts[epoch] = np.zeros(len(self.paths), np.int32)
            self._bad[epoch] = set()
            stale = [e for e in self._counts if e <= epoch - KEEP_EPOCHS]
            for e in stale:
                del self._counts[e], self._bad[e]
        return self._epochs[key]

    def _summary(self, epoch: int) -> EpochCount:
        counts, bad = self._counts[epoch], self._bad[epoch]
        arrived = counts > 0
        return EpochCount(epoch, len(self.paths), int(arrived.sum()), len(bad),
                          int((~arrived).sum()) - len(bad),
                          int((counts > 1).sum()))

    def _close(self, epoch: int) -> None:
        """Summarises an epoch once the next one starts; warns when it was not exactly once."""
        if epoch in self._done:
            return
        s = self._done[epoch] = self._summary(epoch)
        if not s.exactly_once:
            logger.warning("Epoch %d: %d of %d files missing, %d repeated (a tf.data service worker "
                           "restarted mid-epoch? docs/service.md)", epoch, s.missing, s.files, s.repeated)

    def epochs(self) -> list[EpochCount]:
        """Every epoch so far, the current one as it stands."""
        with self._lock:
            out = dict(self._done)
            for epoch in self._counts:
                if epoch not in out:
                    out[epoch] = self._summary(epoch)
        return [out[e] for e in sorted(out)]

    def arrivals(self, epoch: int) -> np.ndarray:
        """How many times each file arrived in `epoch` (one of the last `KEEP_EPOCHS`)."""
        with self._lock:
            return self._counts[epoch].copy()
