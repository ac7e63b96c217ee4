"""DALI batches: a feed of checked bytes in, finite epochs of decoded, resized images out.

`DaliBatches` is a recipe over a `Feed` (chunks of one batch); every
`iter()` is an independent epoch with its own `FeedEpoch` and its own DALI
pipeline, checked out of a small pool of idle pipelines: a pipeline is built
once and reused by later epochs (its `external_source` is pointed at the new
epoch's feed), so epochs neither re-list nor rebuild. Two epochs running at
once use two pipelines. An epoch abandoned midway drops its pipeline (it holds
that epoch's prefetched batches) and stops its reads.

A decode failure that slipped past the byte checks kills the pipeline; the
epoch then decodes the batches DALI had taken one file at a time to name the
culprit, and raises (`on_error="raise"`) or drops it, replays the rest into a
new pipeline and carries on (`"skip"`). When no file fails alone (a batch too
big for memory together), the batches are replayed one file each, so the next
failure names its file. Nothing raised while the feed is read (a bad file
under `"raise"`, anything unexpected) passes through DALI's callback: the slot
ends DALI's input and the epoch raises it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from dali_loader.decode.dali_graph import (
    Input,
    build_pipeline,
    dali_reason,
    probe_decode,
    raw_views,
)
from dali_loader.decode.png_stage import big_png
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import pixels_like_keras
from dali_loader.errors import CorruptImageError
from dali_loader.exiting import exiting, track
from dali_loader.feed.epochs import Chunk, Feed, FeedEpoch
from dali_loader.lazy import import_tf
from dali_loader.malloc import keep_read_buffers, trim_freed_memory

logger = logging.getLogger(__name__)

_IDLE_PIPELINES = 2  # idle pipelines kept for later epochs


class HostPixels:
    """The host-pixel input of a CPU pipeline (`build_pipeline`'s `host_pixels`):
    per sample, a big PNG's pixels decoded by TF (`png_stage.big_png`; Keras's
    pixels), else an empty HWC array; such a file's encoded sample becomes a
    1-byte placeholder (the graph's other branch never sees it). Runs as the
    batch enters DALI, so one batch's big PNGs are decoded at a time, not a
    read-ahead window's. Counts `host_png_decodes` (again for a replayed batch).

    Why: DALI's CPU PNG decoder (nvImageCodec's OpenCV extension) holds two
    copies of the pixels at once (`cv::imdecode`'s Mat, then DALI's output it is
    copied into); TF's libpng decodes into one, which DALI reads in place
    (`no_copy`). Measured, one 20000x20000 PNG among 12 small ones: peak RSS
    2.93 GiB with DALI's decoder, 1.88 GiB with this; Keras 1.78
    (tests/test_hostile.py). A PNG TF rejects goes to DALI's decoder as before
    (which names it if it fails there too).
    """

    _PLACEHOLDER = np.zeros(1, np.uint8)

    def __init__(self, channels: int):
        self.channels = channels
        self._empty = np.zeros((0, 0, channels), np.uint8)

    def __call__(self, chunk: Chunk, epoch: FeedEpoch) -> tuple[list, list]:
        """`(encoded, pixels)`: the two batches of `chunk` for DALI."""
        encoded, pixels = [], []
        for pos, data in zip(chunk.positions, chunk.items):
            px = self._empty
            if big_png(data):
                try:
                    px = pixels_like_keras(data, epoch.path(pos), self.channels, import_tf())
                except CorruptImageError:
                    pass  # DALI's decoder gets it, as without this input
                else:
                    epoch.tally.add("host_png_decodes")
            pixels.append(px)
            encoded.append(np.frombuffer(data, dtype=np.uint8) if px is self._empty
                           else self._PLACEHOLDER)
        return encoded, pixels


class _Slot:
    """What a pipeline's `external_source` pulls from: the batches of the epoch
    that holds the pipeline now. Every batch handed to DALI is also queued in
    `in_flight`, so outputs are matched with their labels and files.
    With `host` (a `HostPixels`), each batch is a pair (encoded, pixels) that
    DALI does not copy: both are kept in `held` until the batch is out."""

    def __init__(self, raw: bool = False, host: HostPixels | None = None):
        self.raw = raw  # raw GPU-ready entries: handed over as HWC views
        self.host = host
        self.epoch: FeedEpoch | None = None
        self.batch_size = 1
        self.replay: collections.deque[Chunk] = collections.deque()
        self.in_flight: collections.deque[Chunk] = collections.deque()
        self.held: collections.deque[tuple] = collections.deque()  # with `host`, per batch
        self.error: BaseException | None = None  # what the feed raised; DALI saw an end

    def start(self, epoch: FeedEpoch | None, batch_size: int = 1) -> None:
        self.epoch = epoch
        self.batch_size = batch_size
        self.replay.clear()
        self.in_flight.clear()
        self.held.clear()
        self.error = None

    def detach(self) -> None:
        """Lets go of the epoch, but not of the batches handed to DALI: a pipeline
        dropped midway may still read them (views, `no_copy`) until it is shut
        down, and it holds this slot until then."""
        self.epoch = None
        self.replay.clear()

    def pop(self) -> Chunk:
        """The oldest batch in flight, whose output is out: DALI is done with it."""
        if self.held:
            self.held.popleft()
        return self.in_flight.popleft()

    def __iter__(self):
        return self

    def __next__(self) -> list:
        if self.error is not None:
            raise StopIteration
        try:
            return self._next()
        except StopIteration:
            raise
        except BaseException as e:  # never through DALI's callback: the epoch raises it
            self.error = e
            raise StopIteration from None

    def _next(self) -> list:
        if self.replay:
            chunk = self.replay.popleft()
        elif self.epoch is None:
            raise StopIteration
        else:
            chunk = self.epoch.next_chunk(self.batch_size)
        if chunk is None:
            raise StopIteration
        if self.host is not None:
            pair = self.host(chunk, self.epoch)
            self.held.append(pair)
            self.in_flight.append(chunk)
            return pair
        self.in_flight.append(chunk)
        if self.raw:
            return raw_views(chunk.items)
        return [np.frombuffer(d, dtype=np.uint8) for d in chunk.items]


def _count_true(flags) -> int:
    """How many of a DALI batch of bool scalars are True."""
    if flags.is_dense_tensor():
        return int(np.count_nonzero(np.asarray(flags.as_tensor())))
    return sum(bool(np.asarray(f)) for f in flags)


class DaliBatches:
    """Finite epochs of `(images, labels)` numpy batches, decoded by DALI.

    Args:
        feed: A `Feed` of `CheckedBytes` items whose chunk size is the batch size.
        spec: The output image spec.
        device: "cpu" or "gpu" (the `mixed` decoder and GPU resize).
        num_threads: DALI CPU threads (default: cores available).
        device_id: The CUDA device, with "gpu" (one per replica under a strategy).
        input: What the feed's items are: the files (`CheckedBytes`) or
            GPU-ready cache entries (`feed.ready.ReadyBytes`), compact or raw.
        png_native: With `Input.FILES`, PNGs are decoded by the native core's
            DALI operator on DALI's CPU threads, the files it leaves by DALI's
            decoder (`dali_graph.image_graph`); each epoch counts `png_native`,
            the PNGs it decoded.
        max_pixels: The operator's pixel limit (the feed's checks apply it first).
        host_pixels: Big PNGs are decoded by TF before DALI (`HostPixels`; the
            plan's `big_pngs`: on the CPU, for the files). On a GPU, DALI's
            decoder keeps them: with JPEGs the branch would hold the `mixed`
            decoder, which DALI's conditionals documentation does not show
            (linked in `dali_graph._input_pixels`), and no GPU has run the branch.
    """

    def __init__(self, feed: Feed, spec: ImageSpec, *, device: str = "cpu",
                 num_threads: int | None = None, device_id: int = 0,
                 input: Input = Input.FILES, png_native: bool = False,
                 max_pixels: int | None = None, host_pixels: bool = False):
        if device not in ("cpu", "gpu"):
            raise ValueError(f'`device` must be "cpu" or "gpu". Received: device={device}')
        if host_pixels and (device != "cpu" or input not in (Input.FILES, Input.FILES_OR_RAW)):
            raise ValueError("Big PNGs are decoded before DALI on the CPU, for the files. "
                             f"Received: host_pixels=True, device={device}, input={input}")
        if png_native and input is not Input.FILES:
            raise ValueError("The native PNG operator decodes the files (Input.FILES). "
                             f"Received: input={input}, png_native=True")
        self.feed = feed
        self.spec = spec
        self.device = device
        self.num_threads = num_threads
        self.device_id = device_id
        self.input = input
        self.png_native = png_native
        self.max_pixels = max_pixels
        self.host_pixels = host_pixels
        self.batch_size = feed.chunk_size
        self.pipeline_builds = 0
        # Per epoch, bounded: feed epoch start and pipeline checkout (or build).
        self.epoch_setup_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        self._idle: list[tuple[object, _Slot]] = []
        self._lock = threading.Lock()
        trim_freed_memory()

    # -- what the dataset reports ------------------------------------------
    @property
    def num_files(self) -> int:
        return self.feed.num_files

    @property
    def source(self):
        return self.feed.source

    @property
    def skipped(self) -> dict[str, str]:
        return self.feed.skipped

    @property
    def epochs_started(self) -> int:
        return self.feed.epochs_started

    @property
    def epoch_stats(self) -> list[dict[str, int]]:
        """Per finished epoch: the feed's tallies plus `cpu_decodes`, the images
        decoded on the CPU: every file on the CPU; on a GPU every file but the
        JPEGs (nvImageCodec decodes no PNG on the GPU); with the GPU-ready
        cache, only the files it had to fill (cached entries are not decoded
        on the CPU)."""
        if self.input not in (Input.FILES, Input.FILES_OR_RAW):
            return self.feed.epoch_stats
        gpu = self.device == "gpu"
        return [dict(t, cpu_decodes=t.get("files", 0) - (t.get("jpeg", 0) if gpu else 0))
                for t in list(self.feed.epoch_tallies)]

    def __len__(self) -> int:
        return -(-self.feed.num_files // self.batch_size)

    # -- pipelines ---------------------------------------------------------
    def _build(self) -> tuple[object, _Slot]:
        host = HostPixels(self.spec.channels) if self.host_pixels else None
        slot = _Slot(raw=self.input is Input.READY_RAW, host=host)
        with self._lock:
            self.pipeline_builds += 1
        pipe = build_pipeline(slot, self.spec, self.batch_size, gpu=self.device == "gpu",
                              device_id=self.device_id, num_threads=self.num_threads,
                              input=self.input, host_pixels=host is not None,
                              png_native=self.png_native, max_pixels=self.max_pixels)
        track(pipe, pipeline=True)  # shut down before DALI's own exit hook runs
        return pipe, slot

    def _checkout(self) -> tuple[object, _Slot]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._build()

    def _checkin(self, pipe, slot: _Slot) -> None:
        with self._lock:
            if len(self._idle) < _IDLE_PIPELINES:
                self._idle.append((pipe, slot))

    # -- epochs --------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """A new, independent epoch of `(images, labels)`; labels is None when unlabelled."""
        return self.epoch()

    def seek(self, epoch: int) -> None:
        """Numbers the next epoch `epoch` (see `Feed.seek`)."""
        self.feed.seek(epoch)

    def epoch(self, number: int | None = None, start_step: int = 0
              ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Epoch `number` (default: the next), from batch `start_step` on."""
        t0 = time.perf_counter()
        if self.input in (Input.READY_COMPACT, Input.READY_COMPACT_GPU, Input.READY_RAW):
            # The cache's fills decode, encode and read on the feed's threads: buffers of
            # a photo's size from the heap, not a fresh mapping each (dali_loader.malloc;
            # measured: docs/gpu_ready.md, "The fills' memory").
            keep_read_buffers()
        epoch = self.feed.epoch(number, start_step)
        pipe, slot = self._checkout()
        slot.start(epoch, self.batch_size)
        self.epoch_setup_seconds.append(time.perf_counter() - t0)
        clean = False
        try:
            while not exiting():  # at exit the epoch ends (dali_loader.exiting)
                try:
                    out, *ok = pipe.run()
                except StopIteration:
                    if slot.error is not None:
                        raise slot.error from None
                    break
                except Exception as err:  # DALI's pipeline died on some file
                    if exiting():
                        return  # its feed stopped: nothing to blame, no pipeline to build
                    pipe, slot = self._recover(err, slot, epoch)
                    continue
                chunk = slot.pop()
                if ok:  # the native PNG operator's per-sample flags
                    epoch.tally.add("png_native", _count_true(ok[0]))
                yield self._to_numpy(out), epoch.labels(chunk.positions)
            if not exiting():
                pipe.reset()
                clean = True
        finally:
            epoch.close()
            if clean:
                slot.start(None)
                self._checkin(pipe, slot)
            else:  # dropped: what it was handed stays with it until it shuts down
                slot.detach()

    def _to_numpy(self, out) -> np.ndarray:
        if self.device == "gpu":
            out = out.as_cpu()
        if out.is_dense_tensor():
            # No copy: the view keeps DALI's buffer alive (exec_dynamic=True).
            return np.asarray(out.as_tensor())
        return np.stack([np.asarray(t) for t in out])  # e.g. after fn.slice

    def _recover(self, err: Exception, slot: _Slot, epoch: FeedEpoch) -> tuple[object, _Slot]:
        """Names the file that killed the pipeline; raises, or skips it and
        replays the other taken batches into a new pipeline."""
        suspects = list(slot.replay) + list(slot.in_flight)
        culprits: dict[int, str] = {}
        for chunk in suspects:
            for pos, data in zip(chunk.positions, chunk.items):
                problem = probe_decode(data, self.spec, self.input, self.png_native,
                                       self.max_pixels)
                if problem:
                    culprits[pos] = problem
            if culprits:
                break
        taken = slot.in_flight[0] if slot.in_flight else None
        slot.detach()  # the failed pipeline is dropped: what it was handed stays with it
        if not culprits and taken is not None and len(taken.positions) == 1:
            # A batch of one file failed, alone: that file, with DALI's reason.
            culprits[taken.positions[0]] = dali_reason(str(err))
        if not culprits and not suspects:  # no file was in it: nothing to blame or skip
            raise RuntimeError(f"The DALI pipeline failed with no file in it: {err}") from err
        paths = self.feed.index.paths
        refilled = (self._refill(culprits, epoch)
                    if self.input in (Input.READY_COMPACT, Input.READY_COMPACT_GPU) else {})
        for pos, problem in culprits.items():
            epoch.errors(CorruptImageError(paths[pos], f"the decoder failed ({problem})"))
        if not culprits and not refilled:  # together too much (memory): one file per batch
            logger.info("The DALI pipeline failed and no single file reproduces it (%s); "
                        "replaying %d batches one file each.", dali_reason(str(err)),
                        len(suspects))
            suspects = [Chunk([item], [pos]) for c in suspects
                        for item, pos in zip(c.items, c.positions)]
        pipe, new_slot = self._build()
        new_slot.start(epoch, self.batch_size)
        for chunk in suspects:
            keep = [i for i, p in enumerate(chunk.positions) if p not in culprits]
            if keep:
                new_slot.replay.append(Chunk([refilled.get(chunk.positions[i], chunk.items[i])
                                              for i in keep],
                                             [chunk.positions[i] for i in keep]))
        return pipe, new_slot

    def _refill(self, culprits: dict[int, str], epoch: FeedEpoch) -> dict[int, object]:
        """Compact cache entries the operator refused (damaged after they were written:
        their pixels' CRC-32): each file decoded again and its entry replaced; taken out
        of `culprits`. Returns the new entries by position (a file that no longer
        decodes stays a culprit, with its decoder's error)."""
        ready = self.feed.items.ready
        out = {}
        for pos in list(culprits):
            path = self.feed.index.paths[pos]
            logger.warning("The GPU-ready cache entry of %s is damaged (%s); decoding the file "
                           "again.", path, culprits[pos])
            try:
                out[pos] = ready.fill(path, epoch.tally, raw_back=True)
            except CorruptImageError as e:
                culprits[pos] = e.reason
                continue
            del culprits[pos]
        return out

    def close(self) -> None:
        """Drops the idle pipelines and stops the feed's reads."""
        with self._lock:
            self._idle.clear()
        self.feed.close()

    def __enter__(self) -> DaliBatches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
