"""tf.data output: a finite, Keras-shaped `tf.data.Dataset` over a feed.

Two decode paths behind one dataset:
- DALI (`DaliBatches`, the GPU path): DALI decodes and resizes; batches reach
  TF through the DALI TF plugin on DALI's device (`dali_plugin`), or through
  `from_generator`, one Python call per batch (`Handoff`).
- TensorFlow's own kernels (the CPU default): on a CPU-only machine DALI's PNG
  decoder is no faster than TF's and its resize costs about twice as much
  (docs/benchmarks.md, "Why TF kernels on the CPU"), so the feed does the I/O (index,
  read-ahead, gs:// cache) and TF decodes with the ops of Keras's
  `_load_image_tf`: bit-identical to Keras, for every option. Files TF's
  decoder rejects are dropped by `ignore_errors()` and named by the audit.
With `gpu_ready`, both read GPU-ready cache entries (`feed.ready`) instead of
the files: raw pixels that TF's kernels or DALI reshape (or TIFFs for DALI).
Each iteration of the dataset is an independent epoch (TF calls the generator
once per iterator). TensorFlow is imported lazily.
"""

from __future__ import annotations

import enum
import functools
import itertools
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator

import numpy as np

from dali_loader.decode import dali_png
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.dali_graph import Input, default_num_threads
from dali_loader.decode.png_batches import PngBatches
from dali_loader.decode.png_stage import (
    KerasPixels,
    PixelItems,
    PngDecoder,
    RawOrCheckedItems,
    fill_png_decoder,
    resolve_png_decoder,
)
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.ready_forms import (
    RAW_HEADER,
    ReadyForm,
    check_form_for_decoder,
    decode_raw,
    raw_shape,
)
from dali_loader.decode.tf_kernels import (
    decode_like_keras,
    labels_like_keras,
    pixels_like_keras,
    read_item,
    resize_problem,
    resize_ready_batch,
)
from dali_loader.errors import CorruptImageError, UnresizableImageError
from dali_loader.exiting import stoppable
from dali_loader.feed.checks import DEFAULT_MAX_PIXELS, size_problem
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import (
    CheckedBytes,
    OpenEntry,
    Paths,
    Pinned,
    PinnedOrBytes,
    RawBytes,
    read_bytes,
)
from dali_loader.feed.ready import ReadyBytes, ReadyCache, ReadyPinned
from dali_loader.index import Index
from dali_loader.lazy import import_tf
from dali_loader.malloc import keep_read_buffers
from dali_loader.storage.source import Source, SourceKind
from dali_loader.tfdata.audit import END, AuditRegistry, Auditor
from dali_loader.tfdata.dali_plugin import Handoff, plugin_dataset, resolve_handoff
from dali_loader.tfdata.weak import weakly as _weakly

TF_CHUNK = 16  # files per generator call on the TF path, reading through the feed
# On a local disk, where TF reads: after a ramp from TF_FIRST_CHUNK, x4 per call. Each
# generator call is a hop through Python on TF's threads, which a busy machine delays:
# 512 files take 3 calls (32, 128, 352), not 6 (16, 32, 64, 128, 256, 16; issue 29).
TF_LOCAL_CHUNK = 1024
TF_FIRST_CHUNK = 32
TF_CHUNK_RAMP = 2  # the ramp's shift per call: x4
KEY_STRIDE = 1 << 40  # a TF-path element's key: its iteration's token, then its position
MARKER = KEY_STRIDE - 1  # the end marker's position in a key


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG: the end-of-epoch marker that rides through decode."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


END_MARKER = _tiny_png()
# The marker as a file, for the graph that reads local paths (tests check its bytes).
END_MARKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "end_marker.png")


def _as_string_and_offset(item) -> tuple[bytes, int]:
    """An item as (string, offset): a file to read from `offset` on (a local
    path: 0; a pinned cache entry: its payload offset), or bytes (-1)."""
    if isinstance(item, str):  # as the OS spells it: any name, UTF-8 or not
        return os.fsencode(item), 0
    if isinstance(item, Pinned):
        return os.fsencode(item.file), int(item.offset)
    return item, -1


def make_loader(source: Source, index: Index, spec: ImageSpec, *, batch_size: int,
                shuffle: bool, seed: int, device: str, decoder: str | None = None,
                num_threads: int | None = None, on_error: str = "raise",
                max_in_flight: int = 64, shard: tuple[int, int] = (0, 1),
                device_id: int = 0, gpu_ready: ReadyForm | None = None,
                png_decoder: PngDecoder | str | None = None,
                max_pixels: int | None = DEFAULT_MAX_PIXELS) -> DaliBatches | Feed:
    """What a dataset iterates: `DaliBatches` on the GPU (or `decoder="dali"`),
    else a `Feed` for TF's kernels. On a local disk TF reads the files; FUSE/NFS
    mounts and URLs keep the feed's read-ahead with `max_in_flight` reads.
    `shard` selects one input pipeline's batches of every epoch (`feed.order`).
    `gpu_ready` (a `ReadyForm`, see `ready_forms.resolve_gpu_ready`) reads
    through the GPU-ready cache (`feed.ready`): each file is decoded on the CPU
    once; raw entries are then only reshaped (by TF's kernels or by DALI), TIFF
    entries decoded by DALI, filled by Wuffs where installed unless
    `png_decoder="libpng"`. `png_decoder` (`png_stage.png_route` says what
    runs): on the TF path None is the native core's TF op in the graph where it
    is built ("wuffs" requires it), "libpng" TF's decoder; on the DALI path None
    or "libpng" keep DALI's decoder, and with "wuffs" every PNG is decoded on
    the feed's threads (`png_stage`), DALI reshapes PNGs' raw pixels and
    decodes only the other files; "gpu" (DALI path, no `gpu_ready`)
    decodes each batch's PNGs with the batched GPU PNG decoder before DALI
    (`png_batches`), the other files with TF on the CPU; DALI only resizes.
    Every path refuses images whose header claims over `max_pixels` (None: no limit)."""
    png = resolve_png_decoder(png_decoder, device=device, decoder=decoder, gpu_ready=gpu_ready)
    kw = dict(shuffle=shuffle, seed=seed, on_error=on_error, max_in_flight=max_in_flight,
              source=source, batch_size=batch_size, shard=shard)
    dali = decoder == "dali" or device == "gpu"
    check_form_for_decoder(gpu_ready, dali)
    threads = num_threads or default_num_threads()
    # Wuffs on the feed's threads: the DALI path's raw PNG entries, GPU-ready fills.
    # On the TF path "wuffs" is the native core's op in the graph (`tf_png`).
    pixels = (KerasPixels(spec.channels, threads, max_pixels)
              if png is PngDecoder.WUFFS and (dali or gpu_ready is not None) else None)
    if gpu_ready is not None:
        fill = fill_png_decoder(png_decoder)
        filler = (pixels or KerasPixels(spec.channels, threads, max_pixels)
                  if fill is PngDecoder.WUFFS else None)
        ready = ready_cache(source, gpu_ready, spec.channels, filler, max_pixels)
    if png is PngDecoder.GPU:  # the decoder expands alpha itself: the byte checks only
        feed = Feed(index, CheckedBytes(source, max_pixels=max_pixels), chunk_size=batch_size,
                    **kw)
        stage = PngBatches(spec.channels, device=device, device_id=device_id)
        return DaliBatches(feed, spec, device=device, num_threads=num_threads,
                           device_id=device_id, input=Input.PIXELS, png=stage)
    if dali:
        # On a GPU, a folder with JPEGs keeps DALI's decoder for every file: nvJPEG
        # decodes them on the GPU, which the per-sample branch of Input.FILES_OR_RAW
        # (CPU operators only) would not.
        raw_pngs = pixels is not None and not (device == "gpu" and _has_jpeg(index))
        if gpu_ready:
            items = ReadyBytes(ready, index.paths)
        elif raw_pngs:
            items = RawOrCheckedItems(source, pixels)
        else:
            items = CheckedBytes(source, rgba=spec.channels == 4, max_pixels=max_pixels)
        feed = Feed(index, items, chunk_size=batch_size, **kw)
        input = {None: Input.FILES, ReadyForm.RAW: Input.READY_RAW,
                 ReadyForm.TIFF: Input.READY_TIFF}[gpu_ready]
        if input is Input.FILES and raw_pngs:
            input = Input.FILES_OR_RAW
        # PNGs by the native core on DALI's threads (png_decoder=None, where built).
        native = input is Input.FILES and dali_png.use_native(
            png_decoder, gpu_with_jpegs=device == "gpu" and _has_jpeg(index))
        return DaliBatches(feed, spec, device=device, num_threads=num_threads,
                           device_id=device_id, input=input, png_native=native,
                           max_pixels=max_pixels)
    if gpu_ready is not None:  # whole batches of entries, resized as one tensor
        return Feed(index, ReadyPinned(ready, index.paths), chunk_size=batch_size, **kw)
    items = {SourceKind.LOCAL_DISK: Paths, SourceKind.NETWORK_FS: RawBytes,
             SourceKind.REMOTE: PinnedOrBytes}[source.kind]
    if items is Paths:  # no reads to wait for: large chunks (after a first small one)
        feed = Feed(index, Paths(index.paths, max_pixels), chunk_size=TF_LOCAL_CHUNK, **kw)
    else:
        # TF batches again after decoding: small chunks let decoding start on the
        # first files of an epoch instead of waiting for a whole batch.
        feed = Feed(index, items(source, max_pixels), chunk_size=min(batch_size, TF_CHUNK),
                    **kw)
    feed.png_decoder = png  # WUFFS: the graph decodes PNGs with the native op
    return feed


def _has_jpeg(index: Index) -> bool:
    """Whether any file is named as a JPEG (what nvJPEG would decode on a GPU)."""
    return any(p.lower().endswith((".jpg", ".jpeg")) for p in index.paths)


def _has_png(index: Index) -> bool:
    """Whether any file is named as a PNG: what the native op in the TF path's graph
    is for. A folder with none gets a graph without it (issue 29): every file
    would pass the op and its `tf.cond` only to reach TF's decoder. A PNG named
    otherwise is still decoded, by TF's decoder, to the same pixels."""
    return any(p.lower().endswith(".png") for p in index.paths)


def ready_cache(source: Source, form: ReadyForm, channels: int,
                pixels: KerasPixels | None = None,
                max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ReadyCache:
    """The GPU-ready cache of `source` in `form`, filled by `pixels` (PNGs by
    Wuffs) or else TF's decoder."""
    decode = (functools.partial(_keras_pixels, channels, max_pixels) if pixels is None
              else pixels)
    return ReadyCache(source, form, channels, decode,
                      alloc=functools.partial(_pooled_empty, import_tf()))


def _keras_pixels(channels: int, max_pixels: int | None, data: bytes, path: str) -> np.ndarray:
    """The GPU-ready cache's decoder: TF's, eagerly, on a read-ahead thread
    (after the header's size check)."""
    problem = size_problem(data, max_pixels)
    if problem:
        raise CorruptImageError(path, problem)
    return pixels_like_keras(data, path, channels, import_tf())


def to_tf_dataset(loader: DaliBatches | Feed, spec: ImageSpec, batch_size: int | None,
                  label_mode: str | None, num_classes: int, *, num_threads: int | None = None,
                  epoch: int | None = None, start_step: int = 0,
                  handoff: Handoff | str | None = None):
    """Wraps a loader as a finite, batched tf.data.Dataset like Keras's.

    Args:
        loader: `DaliBatches` (DALI decodes) or a `Feed` (TF's kernels decode).
        spec: The output image spec.
        batch_size: Images per batch, or None for single images.
        label_mode: "int", "categorical", "binary" or None.
        num_classes: For "categorical".
        num_threads: TF's parallel decodes (default: cores available; on the TF path over
            files, `CALLS_PER_CORE` calls per core, see `_decode_calls`).
        epoch: None: each iteration is the next epoch. An int: every iteration
            is that epoch, from its batch `start_step` on (the rest of an
            interrupted epoch; see `ds.resume_at`).
        start_step: With `epoch`, the first batch.
        handoff: With `DaliBatches`, how batches reach TF (`dali_plugin.Handoff`;
            None: the plugin on the GPU with `on_error="raise"` or the GPU-ready
            cache, else the generator).

    `ds.seek(e)` numbers the next iteration `e`; `ds.resume_at(e, k)` is a
    dataset of epoch `e` from batch `k` on, over the same loader.
    The cardinality is asserted when `on_error="raise"` (no file is left out)
    and, when sharded, every input pipeline reads as many batches.
    The dataset keeps the loader in `ds._dali_loader`; `ds.close()` releases it.
    """
    tf = import_tf()
    which = (epoch, start_step)
    if isinstance(loader, DaliBatches):
        handoff = resolve_handoff(handoff, device=loader.device, on_error=loader.feed.on_error,
                                  batch_size=batch_size,
                                  gpu_ready=loader.input in (Input.READY_RAW, Input.READY_TIFF),
                                  png_gpu=loader.input is Input.PIXELS)
    if isinstance(loader, DaliBatches) and handoff.plugin:
        ds = plugin_dataset(tf, loader, spec, batch_size, label_mode, num_classes, which,
                            _cardinality(loader.feed, batch_size, epoch, start_step), handoff)
        ds._dali_loader = loader
        ds.close = loader.close
        ds.seek = loader.feed.seek
        ds.resume_at = functools.partial(_resume_at, loader, spec, batch_size, label_mode,
                                         num_classes, num_threads, handoff)
        return ds
    audits = None
    labelled = functools.partial(labels_like_keras, tf, label_mode, num_classes)
    if isinstance(loader, DaliBatches):
        ds = _dali_dataset(tf, loader, spec, batch_size, which)
        feed = loader.feed
    elif isinstance(loader.items, (ReadyPinned, PixelItems)):
        ds = _ready_dataset(tf, loader, spec, batch_size, num_threads, which)
        feed = loader
    else:  # Keras's labels made in the audit's own map: one function fewer per iterator
        ds, audits = _tf_kernel_dataset(tf, loader, spec, batch_size, num_threads, which,
                                        labelled)
        feed = loader
        labelled = None
    if labelled is not None and label_mode != "int":
        plain = tf.autograph.experimental.do_not_convert  # see _tf_kernel_dataset
        ds = ds.map(plain(labelled))
    size = _cardinality(feed, batch_size, epoch, start_step)
    if size is not None:
        ds = ds.apply(tf.data.experimental.assert_cardinality(size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds._dali_loader = loader
    if audits is not None:
        ds._dali_audits = audits  # live iterations of the TF path (tests read it)
    ds.close = loader.close
    ds.seek = feed.seek
    ds.resume_at = functools.partial(_resume_at, loader, spec, batch_size, label_mode,
                                     num_classes, num_threads, handoff)
    return ds


def _cardinality(feed: Feed, batch_size: int | None, epoch: int | None,
                 start_step: int) -> int | None:
    """The batches of an iteration, when every one of them is known to come (None if not).

    Known when `on_error="raise"` (no file is left out). Sharded with uneven batch
    counts, it stays unknown: each worker's tf.distribute would take its own
    pipeline's count as the steps per epoch, and workers running different step
    counts deadlock their collectives. Unknown, tf.distribute runs every replica
    until all are exhausted (an empty batch for a replica that has none).
    """
    if epoch is not None:  # validated now, not at the first batch
        feed.check_start_step(start_step)
    if feed.on_error != "raise" or not feed.shards_even:
        return None
    size = -(-feed.num_files // batch_size) if batch_size else feed.num_files
    return size - (start_step if batch_size else min(size, start_step * feed.batch_size))


def _resume_at(loader, spec, batch_size, label_mode, num_classes, num_threads, handoff,
               epoch: int, step: int):
    """The dataset of epoch `epoch` from batch `step` on (every iteration of it)."""
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"`epoch` must be a non-negative integer. Received: epoch={epoch!r}")
    return to_tf_dataset(loader, spec, batch_size, label_mode, num_classes,
                         num_threads=num_threads, epoch=epoch, start_step=step, handoff=handoff)


class _DaliEpochs:
    """What the DALI path's generator calls, once per iterator."""

    def __init__(self, batches: DaliBatches, which: tuple[int | None, int]):
        self.batches = batches
        self.which = which

    def epoch(self):
        for x, y in self.batches.epoch(*self.which):
            yield x, (np.zeros(len(x), np.int32) if y is None else y)


def _dali_dataset(tf, batches: DaliBatches, spec: ImageSpec, batch_size: int | None,
                  which: tuple[int | None, int]):
    img_dtype = tf.uint8 if spec.output_uint8 else tf.float32
    epochs = _DaliEpochs(batches, which)
    sig = (tf.TensorSpec((None, *spec.shape), img_dtype), tf.TensorSpec((None,), tf.int32))
    # TF calls the generator once per iterator: one independent epoch each.
    ds = tf.data.Dataset.from_generator(_weakly(epochs, "epoch", lambda: iter(())),
                                        output_signature=sig)
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    return ds.unbatch() if batch_size is None else ds


class _Reads(enum.Enum):
    """How the TF path's graph gets a file's bytes, by the feed's item reader
    (one graph per dataset: no per-element branch where there is one kind)."""

    PATHS = "paths"  # a local path (`Paths`): TF reads the file
    BYTES = "bytes"  # the bytes themselves (`RawBytes`)
    PINNED_OR_BYTES = "pinned_or_bytes"  # a pinned cache file from an offset, or bytes

    @classmethod
    def of(cls, items) -> _Reads:
        if isinstance(items, Paths) and os.path.isfile(END_MARKER_FILE):
            return cls.PATHS
        return cls.BYTES if type(items) is RawBytes else cls.PINNED_OR_BYTES


class _TFKernelEpochs:
    """What the TF path's generator and audit call: one `Auditor` per iterator.

    Each element is a file (its path, or bytes) and a key: the iteration's token
    times `KEY_STRIDE` plus the file's index position (`MARKER` for the end
    marker, a valid tiny PNG that rides through the decode). Labels are looked
    up per batch by the audit, not carried per element."""

    def __init__(self, tf, feed: Feed, spec: ImageSpec, which: tuple[int | None, int]):
        self.tf = tf
        self.feed = feed
        self.spec = spec
        self.which = which
        self.reads = _Reads.of(feed.items)
        self.registry = AuditRegistry()
        self.generators = _Generators(self.epoch)
        labels = feed.index.labels
        self.labels = None if labels is None else np.asarray(labels, np.int32)
        # Small chunks first, so that decoding starts on an epoch's first files;
        # then larger ones: fewer generator calls per file.
        self.sizes = list(itertools.takewhile(
            lambda n: n < feed.chunk_size,
            (TF_FIRST_CHUNK << (TF_CHUNK_RAMP * i) for i in range(16))))

    def diagnose(self, path: str) -> Exception:
        """Why TF dropped `path`: read it again, decode it eagerly."""
        tf = self.tf
        try:
            data = read_bytes(self.feed.source, path)
        except Exception as e:  # noqa: BLE001 - an UnreadableFileError or a bug: both reported
            return e
        try:
            pixels = pixels_like_keras(data, path, self.spec.channels, tf)
        except CorruptImageError as e:
            return e
        problem = resize_problem(pixels, self.spec, tf)
        if problem:  # it decodes, but Keras's resize of it fails (a zero dimension)
            return UnresizableImageError(path, problem)
        return RuntimeError(
            f"{path} dropped out of TensorFlow's decode, but reads and decodes now. "
            "It was not trained on in this epoch; please report this with the storage used."
        )

    def _files(self, items: list) -> tuple:
        """The element's file components for a chunk's items."""
        if self.reads is _Reads.PATHS:  # as the OS spells them: any name, UTF-8 or not
            return ([os.fsencode(p) for p in items],)
        if self.reads is _Reads.BYTES:
            return (items,)
        data, offsets = zip(*map(_as_string_and_offset, items))
        return list(data), np.asarray(offsets, np.int64)

    def _marker(self) -> tuple:
        if self.reads is _Reads.PATHS:
            return ([os.fsencode(END_MARKER_FILE)],)
        if self.reads is _Reads.BYTES:
            return ([END_MARKER],)
        return [END_MARKER], np.asarray([-1], np.int64)

    def epoch(self):
        keep_read_buffers()  # after TF's own setting for from_generator (dali_loader.malloc)
        registry = self.registry
        auditor = Auditor(lambda: self.feed.epoch(*self.which), self.diagnose)
        token = registry.open(auditor)
        base = np.int64(token) * KEY_STRIDE

        def element(epoch, chunk):
            return (*self._files(chunk.items), np.asarray(chunk.positions, np.int64) + base)

        fed_out = False
        try:
            # Nothing may raise here outside the auditor: `ignore_errors()`
            # downstream would turn an exception into a silently short epoch.
            yield from auditor.chunks(element, self.sizes)
            yield (*self._marker(), np.asarray([base + MARKER], np.int64))
            fed_out = True
        finally:
            if fed_out:
                registry.fed_out(token)
            else:  # abandoned: stop its reads, release what it holds
                registry.close(token)

    def check(self, keys: np.ndarray) -> tuple[np.ndarray, np.int64]:
        """One batch's keys (the survivors of the decode, in order): audits them
        against what the iteration emitted; returns the labels of its files and
        their count (the batch's size, less the end marker if it is last)."""
        token, slots = np.divmod(keys, KEY_STRIDE)
        end = bool(slots[-1] == MARKER)
        positions = slots.tolist()
        if end:
            positions[-1] = END
            slots = slots[:-1]
        self.registry.check(int(token[0]), positions)
        labels = (np.zeros(len(slots), np.int32) if self.labels is None
                  else self.labels[slots])
        return labels, np.int64(len(slots))


def _no_check(keys: np.ndarray) -> tuple[np.ndarray, np.int64]:
    """The audit's stand-in once the dataset is gone (nothing left to check)."""
    return np.zeros(len(keys), np.int32), np.int64(len(keys))


def _strings(values) -> np.ndarray:
    """A list of bytes as an object array: TF's string tensor, each value whole
    (a fixed-width `S` array would drop trailing NUL bytes)."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


class _Generators:
    """One Python generator per TF iterator, opened, stepped and closed by TF's
    `GeneratorDataset` op (`_per_iterator_dataset`)."""

    def __init__(self, make: Callable[[], Iterator[tuple]]):
        self._make = make
        self._ids = itertools.count()
        self._open: dict[int, Iterator[tuple]] = {}
        self._lock = threading.Lock()

    def open(self) -> np.int64:
        gen = stoppable(iter(self._make()))
        with self._lock:
            gid = next(self._ids)
            self._open[gid] = gen
        return np.int64(gid)

    def next(self, gid: np.int64) -> tuple:
        gen = self._open.get(int(gid))
        if gen is None:  # closed (at exit): the iteration ends
            raise StopIteration
        return tuple(_strings(v) if isinstance(v, list) else v for v in next(gen))

    def close(self, gid: np.int64) -> np.int64:
        with self._lock:
            gen = self._open.pop(int(gid), None)
        if gen is not None:
            gen.close()
        return np.int64(0)


def _end(*_) -> tuple:
    raise StopIteration


def _per_iterator_dataset(tf, generators: _Generators, signature: tuple):
    """A dataset whose every iterator runs its own `generators` generator.

    `from_generator` does the same through a `flat_map` and a per-element
    wrapper that checks and converts each value; this drives TF's
    `GeneratorDataset` op directly (one `numpy_function` to open, one per
    element, one to close, also when an iterator is abandoned). Measured on a
    16-file folder: an epoch's best 41.8 -> 29.3 ms, Keras's 14.5-16.7
    (docs/benchmarks.md, issue 29).
    Falls back to `from_generator` where the op's Python class is gone."""
    types = tuple(s.dtype for s in signature)
    open_ = _weakly(generators, "open", lambda: np.int64(-1))
    step = _weakly(generators, "next", _end)
    close = _weakly(generators, "close", lambda gid: np.int64(0))
    try:
        from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
    except ImportError:  # pragma: no cover - a future TF
        def gen():
            gid = open_()
            try:
                while True:
                    yield step(gid)
            except StopIteration:
                return
            finally:
                close(gid)
        return tf.data.Dataset.from_generator(gen, output_signature=signature)
    plain = tf.autograph.experimental.do_not_convert

    def init(_):
        return tf.numpy_function(open_, [], tf.int64, stateful=True)

    def next_(gid):
        out = tf.numpy_function(step, [gid], types, stateful=True)
        for t, s in zip(out, signature):
            t.set_shape(s.shape)
        return tuple(out)

    def finalize(gid):
        return tf.numpy_function(close, [gid], tf.int64, stateful=True)

    single = _single_device_class(tf)
    if single is not None:
        return single(plain(init), plain(next_), plain(finalize), signature)
    return _GeneratorDataset(tf.constant(0, tf.int64), plain(init), plain(next_),
                             plain(finalize), output_signature=signature)


# A tf.data function with this attribute is instantiated for each iterator as a
# single-device function, without grappler's pass over it: about 2.5 ms of CPU less
# per function and iterator here (issue 29; TF's multi-device iterator sets it on its
# own generator's functions). TF refuses it on a function with more than one output
# ("Expected only one fetch node"), so only the generator's `init` and `finalize`
# (one int64 each) get it.
_SINGLE_DEVICE = {"experimental_ints_on_device": True}
_single_device: dict[str, type | None] = {}  # the class, or None: probed once


def _single_device_class(tf) -> type | None:
    """TF's `_GeneratorDataset` with `init` and `finalize` as `_SINGLE_DEVICE`
    functions, or None where this TF lacks or refuses it (probed once per process
    on a two-element generator: the fallback is TF's own class)."""
    if "cls" in _single_device:
        return _single_device["cls"]
    plain = tf.autograph.experimental.do_not_convert
    items = [np.arange(2, dtype=np.int64)]

    def step(_gid):
        if not items:
            raise StopIteration
        return items.pop()

    def next_(gid):
        out = tf.numpy_function(step, [gid], tf.int64, stateful=True)
        out.set_shape((None,))
        return out

    try:
        cls = _make_single_device_class(tf)
        probe = cls(plain(lambda _: tf.constant(0, tf.int64)), plain(next_),
                    plain(lambda gid: gid), tf.TensorSpec((None,), tf.int64))
        if [int(v) for v in probe.unbatch()] != [0, 1]:
            cls = None
    except Exception:  # noqa: BLE001 - a TF that refuses it: its own class instead
        cls = None
    _single_device["cls"] = cls
    return cls


def _make_single_device_class(tf) -> type:
    from tensorflow.python.data.ops import structured_function
    from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
    from tensorflow.python.data.util import structure
    from tensorflow.python.ops import gen_dataset_ops

    class SingleDeviceEnds(_GeneratorDataset):
        """`_GeneratorDataset.__init__`, with `defun_kwargs` for `init` and `finalize`."""

        def __init__(self, init, next_, finalize, output_signature):
            self._init_args = tf.constant(0, tf.int64)
            self._init_structure = structure.type_spec_from_value(self._init_args)
            self._output_signature = output_signature
            self._name = None
            name = self._transformation_name()
            wrap = structured_function.StructuredFunctionWrapper
            self._init_func = wrap(init, name, input_structure=self._init_structure,
                                   defun_kwargs=dict(_SINGLE_DEVICE))
            state = self._init_func.output_structure
            self._next_func = wrap(next_, name, input_structure=state)
            self._finalize_func = wrap(finalize, name, input_structure=state,
                                       defun_kwargs=dict(_SINGLE_DEVICE))
            variant = gen_dataset_ops.generator_dataset(
                structure.to_tensor_list(self._init_structure, self._init_args)
                + self._init_func.function.captured_inputs,
                self._next_func.function.captured_inputs,
                self._finalize_func.function.captured_inputs,
                init_func=self._init_func.function, next_func=self._next_func.function,
                finalize_func=self._finalize_func.function, **self._common_args)
            super(_GeneratorDataset, self).__init__(variant)  # DatasetSource's

    return SingleDeviceEnds


CALLS_PER_CORE = 2


def _decode_calls(num_threads: int | None) -> int:
    """The TF path's decode map's parallel calls: `num_threads`, or by default
    `CALLS_PER_CORE` per core. TF's threads (one per core) run them; the calls
    beyond them wait, decoded results included, in the map's buffer, which holds
    as many as there are calls. With one call per core the map is deterministic
    (the audit reads positions in order): a core that finished a file while the
    one before it still decodes has nowhere to put the next one and waits, a wait
    Keras's map, fused with its batch (`map_and_batch_fusion`; here
    `ignore_errors` stands between them), does not have (issue 29: context
    switches per image 4.5 -> 3.6-3.9, Keras 3.4-3.5)."""
    return num_threads or CALLS_PER_CORE * default_num_threads()


def _tf_kernel_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
                       num_threads: int | None, which: tuple[int | None, int],
                       labelled: Callable = lambda x, y: (x, y)):
    """The TF path over files: `labelled(x, y)` makes each batch's labels Keras's.

    Each function in the pipeline is instantiated again for every iterator (about
    3 ms each here), so the audit, the marker's drop and the labels share one map,
    and an empty batch (the marker alone) is absorbed by `rebatch` (no function;
    full batches pass through without a copy) instead of a `filter`."""
    epochs = _TFKernelEpochs(tf, feed, spec, which)
    vec = tf.TensorSpec((None,), tf.int64)
    files = (tf.TensorSpec((None,), tf.string),)
    if epochs.reads is _Reads.PINNED_OR_BYTES:
        files += (vec,)
    # One generator per iterator: one independent epoch each.
    ds = _per_iterator_dataset(tf, epochs.generators, (*files, vec))
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    # PNGs by the native core's op where png_decoder resolved to it (others, and
    # the files it leaves, by TF's decoder in the same graph: tf_png), and where
    # a file is named as a PNG: a folder of JPEGs gets Keras's decode alone.
    native = getattr(feed, "png_decoder", None) is PngDecoder.WUFFS and _has_png(feed.index)
    if epochs.reads is _Reads.PINNED_OR_BYTES:
        def decode(data, offset, key):
            return decode_like_keras(read_item(tf, data, offset), spec, tf, native), key
    else:
        read = tf.io.read_file if epochs.reads is _Reads.PATHS else tf.identity

        def decode(data, key):
            return decode_like_keras(read(data), spec, tf, native), key

    # The graph functions are plain TF (no Python control flow on tensors): not
    # converted by AutoGraph, which cost about 0.5 s of every construction.
    plain = tf.autograph.experimental.do_not_convert
    ds = ds.unbatch().map(
        plain(decode),
        # Fixed from the first batch on: AUTOTUNE ramps up over a few batches,
        # which short epochs feel. `num_threads` decodes, or by default
        # `CALLS_PER_CORE` calls per core (`_decode_calls`).
        num_parallel_calls=_decode_calls(num_threads),
        # The audit checks positions in order; this overrides a user's
        # `Options.deterministic = False` for this map only (TF's documented rule).
        deterministic=True,
    ).ignore_errors()
    check = _weakly(epochs, "check", _no_check)

    def audit(x, keys):
        y, n = tf.numpy_function(check, [keys], (tf.int32, tf.int64))
        y.set_shape((None,))
        n.set_shape(())
        # The marker dropped; the whole batch is not copied (TF's identity slice).
        return labelled(x[:n], y)

    batch = batch_size or 32
    ds = ds.batch(batch).map(plain(audit)).rebatch(batch)
    return (ds.unbatch() if batch_size is None else ds), epochs.registry


ALIGN = 64  # TF shares an aligned numpy buffer's memory instead of copying it


def _aligned_empty(nbytes: int) -> np.ndarray:
    """A 1-D uint8 array of `nbytes` whose data is `ALIGN`-byte aligned, so that
    `from_generator` hands it to TF without a copy (TF keeps it alive while used)."""
    base = np.empty(nbytes + ALIGN, np.uint8)
    start = (-base.__array_interface__["data"][0]) % ALIGN
    return base[start:start + nbytes]


def _pooled_empty(tf, nbytes: int) -> np.ndarray:
    """`_aligned_empty(nbytes)`, but from TF's own CPU allocator where it can be
    viewed writable: that allocator pools what it frees (oneDNN's), so the buffer
    of a batch with a huge image reuses the memory TF freed after decoding it
    (when the entry was filled) instead of adding a second copy's worth."""
    try:
        out = tf.raw_ops.Empty(shape=[nbytes], dtype=tf.uint8, init=False)._numpy()
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - a future TF
        return _aligned_empty(nbytes)
    if out.flags.writeable and out.ctypes.data % ALIGN == 0:
        return out  # its base holds TF's buffer
    return _aligned_empty(nbytes)  # pragma: no cover - a future TF


class _OpenEntry:
    """A raw entry: its shape from the header, then its pixels read into a
    caller's buffer (an open entry, `OpenEntry`, read in place; the reader's
    release closes it), or copied from its bytes; or pixels decoded on the
    feed's threads (`png_stage.PixelItems`), copied."""

    def __init__(self, item):
        self.fd = None
        if isinstance(item, np.ndarray):
            self.pixels, self.shape = item, item.shape
            return
        if isinstance(item, OpenEntry):
            self.fd, self.at = item.fd, item.offset + RAW_HEADER
            head = os.pread(self.fd, RAW_HEADER, item.offset)
            self.pixels = None
        else:
            head, self.pixels = item[:RAW_HEADER], decode_raw(item)
        self.shape = raw_shape(head)

    def read_into(self, out: np.ndarray) -> None:
        if self.fd is None:
            out[:] = self.pixels.reshape(-1)
        elif os.preadv(self.fd, [memoryview(out)], self.at) != out.size:
            raise OSError(f"short read of a GPU-ready cache entry (descriptor {self.fd})")

    def close(self) -> None:
        pass


def _pad_to_zero(shape, spec: ImageSpec) -> bool:
    """Whether `tf.image.resize_with_pad` of an image of `shape` (HxWxC) to the spec's
    size scales a side to zero rows or columns (its float32 arithmetic)."""
    h, w = np.float32(shape[0]), np.float32(shape[1])
    ratio = max(w / np.float32(spec.width), h / np.float32(spec.height))
    return bool(np.floor(h / ratio) < 1 or np.floor(w / ratio) < 1)


def _ready_layout(sizes: np.ndarray) -> tuple[np.ndarray, int]:
    """Where each entry goes in a batch's buffer, and the buffer's size.

    Same-size entries lie back to back (the batch is one tensor). Otherwise the
    largest lies last, at an `ALIGN`ed offset: TF's slice of it (aligned, to the
    end) shares the buffer instead of copying it, so a huge image among small
    ones is held once."""
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    if len(sizes) < 2 or (sizes == sizes[0]).all():
        return offsets, int(sizes.sum())
    big = int(np.argmax(sizes))
    rest = [i for i in range(len(sizes)) if i != big]
    at = 0
    for i in rest:
        offsets[i] = at
        at += int(sizes[i])
    offsets[big] = -(-at // ALIGN) * ALIGN
    return offsets, int(offsets[big] + sizes[big])


class _ReadyEpochs:
    """What the generator calls on the TF path, once per iterator, when the feed's
    items are pixels (GPU-ready cache entries, or `png_stage.PixelItems`): whole
    batches of them, read or copied into one aligned buffer (shared with TF), with
    the images' shapes and offsets in it."""

    def __init__(self, tf, feed: Feed, which: tuple[int | None, int],
                 spec: ImageSpec | None = None):
        self.tf = tf
        self.feed = feed
        self.which = which
        self.spec = spec

    def _unresizable(self, epoch, entries: list, positions: list) -> tuple[list, list]:
        """The entries whose resize would fail (Keras's pad_to_aspect_ratio to a zero
        dimension) go to the epoch's on_error (raised, or skipped and recorded),
        named with TF's own reason: the batch's resize in the graph has no audit."""
        if self.spec is None or not self.spec.pad_to_aspect_ratio:
            return entries, positions
        keep_e, keep_p = [], []
        for entry, pos in zip(entries, positions):
            problem = (_pad_to_zero(entry.shape, self.spec)
                       and resize_problem(np.zeros(entry.shape, np.uint8), self.spec, self.tf))
            if problem:
                entry.close()
                epoch.release([pos])
                epoch.errors(UnresizableImageError(epoch.path(pos), problem))
                continue
            keep_e.append(entry)
            keep_p.append(pos)
        return keep_e, keep_p

    def epoch(self):
        epoch = self.feed.epoch(*self.which)
        try:
            while (chunk := epoch.next_chunk()) is not None:
                entries = []
                positions = chunk.positions
                try:
                    for item in chunk.items:
                        entries.append(_OpenEntry(item))
                    entries, positions = self._unresizable(epoch, entries, positions)
                    if not entries:
                        continue
                    shapes = np.asarray([e.shape for e in entries], np.int32)
                    sizes = np.prod(shapes, axis=1, dtype=np.int64)
                    offsets, total = _ready_layout(sizes)
                    flat = _pooled_empty(self.tf, total)
                    for entry, at, size in zip(entries, offsets, sizes):
                        entry.read_into(flat[at:at + size])
                finally:
                    for entry in entries:
                        entry.close()
                epoch.release(positions)
                labels = epoch.labels(positions)
                yield flat, shapes, offsets, (np.zeros(len(shapes), np.int32) if labels is None
                                              else labels.astype(np.int32))
        finally:
            epoch.close()


def _ready_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
                   num_threads: int | None, which: tuple[int | None, int]):
    """The TF path over pixels (the GPU-ready cache's raw entries, or files the
    feed decoded): nothing to decode in the graph, so no audit (a file that
    cannot be decoded was the feed's `on_error`); a batch of same-size images is
    resized as one tensor (one output allocation per batch instead of one per
    image and op)."""
    epochs = _ReadyEpochs(tf, feed, which, spec)
    sig = (tf.TensorSpec((None,), tf.uint8), tf.TensorSpec((None, 3), tf.int32),
           tf.TensorSpec((None,), tf.int64), tf.TensorSpec((None,), tf.int32))
    # TF calls the generator once per iterator: one independent epoch each.
    ds = tf.data.Dataset.from_generator(_weakly(epochs, "epoch", lambda: iter(())),
                                        output_signature=sig)
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    ds = ds.map(tf.autograph.experimental.do_not_convert(
                    lambda flat, shapes, offsets, y: (resize_ready_batch(flat, shapes, offsets,
                                                                         spec, tf), y)),
                num_parallel_calls=num_threads or default_num_threads(), deterministic=True)
    return ds.unbatch() if batch_size is None else ds
