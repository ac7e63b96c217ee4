"""The TF-free loader: an index in, finite epochs of numpy batches out.

One `BatchLoader` owns one DALI pipeline for its whole life. Each epoch:
an order (a fresh permutation when shuffling) -> bounded read-ahead with many
reads in flight -> byte checks -> DALI decode/resize -> (images, labels).
Epochs are finite, every file appears exactly once, the last partial batch is
kept, and a new epoch re-lists nothing and rebuilds nothing.

A decode failure that slipped past the byte checks kills the DALI pipeline;
the loader then decodes that batch's files one by one to name the culprit,
rebuilds the pipeline, and raises (`on_error="raise"`) or drops the file and
carries on (`on_error="skip"`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dali_loader.index import Index
from dali_loader.pipeline import ImageSpec, build_pipeline, probe_decode
from dali_loader.readahead import ReadAhead
from dali_loader.sources import read_local
from dali_loader.validate import CorruptImageError, prepare

logger = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


class _Batch:
    __slots__ = ("positions", "paths", "data")

    def __init__(self):
        self.positions: list[int] = []
        self.paths: list[str] = []
        self.data: list[bytes] = []


class _EpochFeed:
    """What DALI's external_source pulls from: batches for the current epoch.

    The pipeline keeps one instance for its life; `start()` points it at a new
    epoch's stream. Every batch handed to DALI is also queued in `in_flight`,
    so outputs can be matched with their labels and files.
    """

    def __init__(self, owner: BatchLoader):
        self.owner = owner
        self.stream: Iterator[Any] | None = None
        self.replay: collections.deque[_Batch] = collections.deque()
        self.in_flight: collections.deque[_Batch] = collections.deque()

    def start(self, stream: Iterator[Any] | None) -> None:
        self.stream = stream
        self.replay.clear()
        self.in_flight.clear()

    def __iter__(self):
        return self

    def __next__(self) -> list[np.ndarray]:
        if self.replay:
            batch = self.replay.popleft()
        else:
            batch = self.owner._next_batch(self.stream)
        if batch is None:
            raise StopIteration
        self.in_flight.append(batch)
        return [np.frombuffer(d, dtype=np.uint8) for d in batch.data]


class BatchLoader:
    """Finite epochs of decoded, resized image batches from an index.

    Args:
        index: The files and labels, in dataset order.
        spec: The output image spec.
        batch_size: Images per batch (the last batch may be smaller).
        shuffle: Reshuffle the order every epoch.
        seed: Seed of the per-epoch permutations.
        read_fn: Reads one path to bytes (thread-safe); local files by default.
        device: "cpu" or "gpu".
        num_threads: Decode threads: DALI CPU threads, or the parallel TF decodes
            of `tfdata.to_tf_dataset` (default: available cores).
        on_error: "raise" or "skip" for files that cannot be read or decoded.
        max_in_flight: Reads in flight (threads of the read-ahead pool).
        read_ahead: Files read ahead of the decoder (default 2 batches, at
            least `max_in_flight`).
        decode: Decode with DALI (default). With False the loader does I/O
            only and yields `(list of checked encoded bytes, labels,
            positions in the index)` batches, for a caller that decodes with
            its own kernels.
        read: With `decode=False`, False yields file paths instead of bytes
            (the caller reads; for local disks, where reads are cheap).
        locate_fn: With `decode=False`: maps a path to `(local file, payload
            offset)` when its bytes already sit verified in a local cache; such
            items are yielded as that tuple instead of bytes, for the caller to
            read itself (a warm gs:// epoch then copies nothing through Python).
        chunk_size: With `decode=False`: files per yielded chunk (default
            `batch_size`). A caller that batches again after decoding (tf.data)
            can take smaller chunks and start decoding as soon as the first few
            files arrive, not the first whole batch.
    """

    def __init__(
        self,
        index: Index,
        spec: ImageSpec,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        read_fn: Callable[[str], bytes] | None = None,
        device: str = "cpu",
        num_threads: int | None = None,
        on_error: str = "raise",
        max_in_flight: int = 16,
        read_ahead: int | None = None,
        decode: bool = True,
        read: bool = True,
        locate_fn: Callable[[str], tuple[str, int] | None] | None = None,
        chunk_size: int | None = None,
    ):
        if on_error not in ON_ERROR:
            raise ValueError(
                f"`on_error` must be one of {ON_ERROR}. Received: on_error={on_error}"
            )
        if device not in ("cpu", "gpu"):
            raise ValueError(f'`device` must be "cpu" or "gpu". Received: device={device}')
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"`batch_size` must be a positive integer. Received: batch_size={batch_size}"
            )
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(
                f"`chunk_size` must be a positive integer or None. Received: chunk_size={chunk_size}"
            )
        self.index = index
        self.spec = spec
        self.batch_size = batch_size
        self.chunk_size = chunk_size or batch_size
        self.shuffle = shuffle
        self.seed = int(np.random.randint(1e6)) if seed is None else int(seed)
        self.device = device
        self.num_threads = num_threads
        self.on_error = on_error
        self.decode = decode
        self.read = read or decode
        self._locate_fn = None if decode else locate_fn
        self.skipped: dict[str, str] = {}
        self._skipped_pos: set[int] = set()  # the same files, as index positions
        self._read_fn = read_fn or read_local
        window = max(read_ahead or 2 * batch_size, max_in_flight)
        self._reader = ReadAhead(self._read_one, max_in_flight, window)
        self._feed = _EpochFeed(self)
        self._pipe = None
        self._pipe_clean = False
        self._active: object | None = None
        self.epoch = 0
        self.pipeline_builds = 0
        # Per epoch: set-up before the first batch is asked for (order,
        # read-ahead start, DALI pipeline (re)build when needed).
        self.epoch_setup_seconds: list[float] = []

    # -- sizes ---------------------------------------------------------------
    @property
    def num_files(self) -> int:
        """Files per epoch (before any skipped file)."""
        return len(self.index)

    @property
    def class_names(self) -> list[str] | None:
        """Class names in label order."""
        return self.index.class_names

    def __len__(self) -> int:
        return -(-len(self.index) // self.batch_size)

    # -- reading -------------------------------------------------------------
    def _read_one(self, pos: int) -> tuple[int, Any]:
        path = self.index.paths[pos]
        try:
            if self._locate_fn is not None:
                where = self._locate_fn(path)
                if where is not None:
                    return pos, where
            data = self._read_fn(path)
            if not self.decode:  # the caller's decoder; its failures are audited
                return pos, data
            rgba = self.spec.channels == 4  # DALI drops some alpha: Pillow expands it
            return pos, prepare(data, path, rgba=rgba)
        except CorruptImageError as e:
            return pos, e
        except FileNotFoundError:
            return pos, CorruptImageError(path, "the file disappeared since indexing")
        except OSError as e:
            return pos, CorruptImageError(path, f"read failed ({e})")

    def _next_batch(self, stream: Iterator[Any] | None, size: int | None = None) -> _Batch | None:
        """Collects up to `size` (default batch_size) good files from the epoch's stream."""
        size = size or self.batch_size
        if stream is None:
            return None
        batch = _Batch()
        for pos, item in stream:
            if isinstance(item, Exception):
                self._bad(pos, item)
                continue
            batch.positions.append(pos)
            batch.paths.append(self.index.paths[pos])
            batch.data.append(item)
            if len(batch.positions) == size:
                break
        return batch if batch.positions else None

    def report_bad(self, pos: int, reason: str) -> None:
        """A file a caller's own decoder rejected: raise or skip, as configured."""
        path = self.index.paths[pos]
        self._bad(pos, CorruptImageError(path, reason))

    def _bad(self, pos: int, err: Exception) -> None:
        if self.on_error == "raise":
            raise err
        path = self.index.paths[pos]
        reason = getattr(err, "reason", str(err))
        if path not in self.skipped:
            logger.warning("Skipping %s: %s", path, reason)
        self.skipped[path] = reason
        self._skipped_pos.add(pos)

    # -- epochs --------------------------------------------------------------
    def epoch_order(self, epoch: int) -> np.ndarray:
        """The positions of `index` in the order epoch `epoch` reads them."""
        n = len(self.index)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _order_without_skipped(self, epoch: int) -> np.ndarray:
        order = self.epoch_order(epoch)
        if not self._skipped_pos:
            return order
        return order[~np.isin(order, np.fromiter(self._skipped_pos, np.int64))]

    def _ensure_pipeline(self) -> None:
        if self._pipe is not None and self._pipe_clean:
            return
        self._pipe = None  # drop a dead or half-consumed pipeline first
        self.pipeline_builds += 1
        self._pipe = build_pipeline(
            self._feed,
            self.spec,
            self.batch_size,
            gpu=self.device == "gpu",
            num_threads=self.num_threads,
        )

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Yields one epoch of `(images, labels)`; labels is None when unlabelled.

        One epoch runs at a time: starting a new one abandons an unfinished
        one (its iterator just ends), as when Keras stops an epoch early.
        """
        if not self.decode:
            yield from self._encoded_epoch()
            return
        t0 = time.perf_counter()
        token = self._active = object()
        epoch = self.epoch
        self.epoch += 1
        stream = self._reader.map(self._order_without_skipped(epoch).tolist())
        self._feed.start(stream)
        self._ensure_pipeline()
        self._pipe_clean = False  # until the epoch runs to its end
        self.epoch_setup_seconds.append(time.perf_counter() - t0)
        try:
            while self._active is token:
                try:
                    (out,) = self._pipe.run()
                except StopIteration:
                    break
                except CorruptImageError:
                    raise
                except Exception as err:  # DALI's pipeline died on some file
                    self._recover(err)
                    continue
                batch = self._feed.in_flight.popleft()
                images = self._to_numpy(out)
                labels = None
                if self.index.labels is not None:
                    labels = self.index.labels[batch.positions]
                yield images, labels
            else:
                return  # abandoned: a newer epoch owns the pipeline now
            self._pipe.reset()
            self._pipe_clean = True
        finally:
            if self._active is token:
                stream.close()
                self._feed.start(None)
                self._active = None

    def _encoded_epoch(self) -> Iterator[tuple[list, np.ndarray | None, list[int]]]:
        """One epoch of checked, encoded batches (or just paths); no decoding."""
        t0 = time.perf_counter()
        epoch = self.epoch
        self.epoch += 1
        order = self._order_without_skipped(epoch).tolist()
        self.epoch_setup_seconds.append(time.perf_counter() - t0)
        if not self.read:  # the caller reads the files itself
            paths, labels = self.index.paths, self.index.labels
            for i in range(0, len(order), self.chunk_size):
                pos = order[i : i + self.chunk_size]
                yield [paths[p] for p in pos], None if labels is None else labels[pos], pos
            return
        stream = self._reader.map(order)
        try:
            while (batch := self._next_batch(stream, self.chunk_size)) is not None:
                labels = None
                if self.index.labels is not None:
                    labels = self.index.labels[batch.positions]
                yield batch.data, labels, batch.positions
        finally:
            stream.close()

    def _to_numpy(self, out) -> np.ndarray:
        if self.device == "gpu":
            out = out.as_cpu()
        if out.is_dense_tensor():
            # Zero-copy: the view keeps DALI's buffer alive (exec_dynamic=True).
            return np.asarray(out.as_tensor())
        return np.stack([np.asarray(t) for t in out])  # e.g. after fn.slice

    def _recover(self, err: Exception) -> None:
        """Names the file that killed the pipeline; raises or skips it."""
        suspects = list(self._feed.in_flight)
        culprits: dict[str, str] = {}
        culprit_pos: dict[str, int] = {}
        for batch in suspects:
            for pos, path, data in zip(batch.positions, batch.paths, batch.data):
                problem = probe_decode(data, self.spec)
                if problem:
                    culprits[path] = problem
                    culprit_pos[path] = pos
            if culprits:
                break
        self._pipe = None
        if not culprits:
            raise RuntimeError(
                f"The DALI pipeline failed and no single file reproduces it: {err}"
            ) from err
        if self.on_error == "raise":
            path, problem = next(iter(culprits.items()))
            raise CorruptImageError(path, f"the decoder failed ({problem})") from None
        for path, problem in culprits.items():
            self._bad(culprit_pos[path], CorruptImageError(path, problem))
        # Replay every batch DALI had taken, minus the bad files, into a new pipeline.
        self._feed.replay.clear()
        for batch in suspects:
            keep = [i for i, p in enumerate(batch.paths) if p not in culprits]
            if keep:
                nb = _Batch()
                nb.positions = [batch.positions[i] for i in keep]
                nb.paths = [batch.paths[i] for i in keep]
                nb.data = [batch.data[i] for i in keep]
                self._feed.replay.append(nb)
        self._feed.in_flight.clear()
        self._ensure_pipeline()

    def close(self) -> None:
        """Releases the pipeline and the read threads."""
        self._pipe = None
        self._reader.close()

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
