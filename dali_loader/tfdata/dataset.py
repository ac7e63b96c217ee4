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

import functools
import os
from typing import Any

import numpy as np

from dali_loader import probes
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.dali_graph import Input, default_num_threads
from dali_loader.decode.png_batches import PngBatches
from dali_loader.decode.png_stage import KerasPixels, RawOrCheckedItems
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.ready_forms import RAW_HEADER, ReadyForm, decode_raw, raw_shape
from dali_loader.decode.tf_kernels import (
    labels_like_keras,
    pixels_like_keras,
    resize_problem,
    resize_ready_batch,
)
from dali_loader.errors import CorruptImageError, UnresizableImageError
from dali_loader.feed.checks import size_problem
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import CheckedBytes, OpenEntry, Paths, PinnedOrBytes, RawBytes
from dali_loader.feed.ready import ReadyBytes, ReadyCache, ReadyPinned
from dali_loader.index import Index
from dali_loader.lazy import import_tf
from dali_loader.plan import (
    DEFAULT_MAX_PIXELS,
    Engine,
    ItemReader,
    Options,
    Plan,
    PngWhere,
    resolve,
)
from dali_loader.storage.source import Source
from dali_loader.tfdata.dali_plugin import plugin_dataset
from dali_loader.tfdata.handle import LoaderHandle
from dali_loader.tfdata.tf_path import TF_CHUNK, TF_LOCAL_CHUNK, _tf_kernel_dataset
from dali_loader.tfdata.weak import weakly as _weakly


def make_loader(source: Source, index: Index, spec: ImageSpec, plan: Plan | None = None, *,
                batch_size: int, shuffle: bool, seed: int, **options) -> DaliBatches | Feed:
    """What a dataset iterates, built as `plan` says (`dali_loader.plan`): a
    `DaliBatches` for the DALI engine, else a `Feed` for TF's kernels, reading
    with the plan's item reader (on a local disk TF reads the files; FUSE/NFS
    mounts and URLs keep the feed's read-ahead), the GPU-ready cache in the
    plan's form (filled by Wuffs on the feed's threads or by TF's decoder), and
    the plan's PNG decoder. The result carries the plan (`.plan`).

    Without a `plan`, `options` (`plan.Options` fields, e.g. `device="cpu"`,
    `png_decoder="wuffs"`) are resolved here against this machine
    (`probes.environment`) and `source`."""
    if plan is None:
        plan = resolve(Options(batch_size=batch_size, **options),
                       probes.environment(source.kind, index.paths))
    elif options:
        raise TypeError(f"make_loader takes a plan or options, not both. Received: {sorted(options)}")
    o = plan.options
    kw = dict(shuffle=shuffle, seed=seed, on_error=o.on_error, max_in_flight=o.max_in_flight,
              source=source, batch_size=batch_size, shard=plan.shard)
    # Wuffs on the feed's threads: the DALI path's raw PNG entries, GPU-ready fills.
    pixels = (KerasPixels(spec.channels, o.num_threads or default_num_threads(), o.max_pixels)
              if plan.feed_pixels else None)
    if plan.cache_form is not None:
        ready = ready_cache(source, plan.cache_form, spec.channels, pixels, o.max_pixels)
    reader = plan.item_reader
    if plan.engine is Engine.DALI:
        dali = dict(device=plan.device.value, num_threads=o.num_threads,
                    device_id=plan.device_id, input=plan.dali_input)
        if reader is ItemReader.READY_BYTES:
            items = ReadyBytes(ready, index.paths)
        elif reader is ItemReader.RAW_OR_CHECKED:
            items = RawOrCheckedItems(source, pixels)
        elif plan.dali_input is Input.PIXELS:  # the decoder expands alpha itself
            items = CheckedBytes(source, max_pixels=o.max_pixels)
        else:
            items = CheckedBytes(source, rgba=spec.channels == 4, max_pixels=o.max_pixels)
        feed = Feed(index, items, chunk_size=batch_size, **kw)
        if plan.dali_input is Input.PIXELS:
            stage = PngBatches(spec.channels, device=plan.device.value, device_id=plan.device_id)
            loader = DaliBatches(feed, spec, png=stage, **dali)
        else:
            loader = DaliBatches(feed, spec, png_native=plan.png_where is PngWhere.DALI_OP,
                                 max_pixels=o.max_pixels, **dali)
    elif reader is ItemReader.READY_PINNED:  # whole batches of entries, resized as one tensor
        loader = Feed(index, ReadyPinned(ready, index.paths), chunk_size=batch_size, **kw)
    elif reader is ItemReader.PATHS:  # no reads to wait for: large chunks (after a small one)
        loader = Feed(index, Paths(index.paths, o.max_pixels), chunk_size=TF_LOCAL_CHUNK, **kw)
    else:
        # TF batches again after decoding: small chunks let decoding start on the
        # first files of an epoch instead of waiting for a whole batch.
        items = {ItemReader.RAW_BYTES: RawBytes, ItemReader.PINNED_OR_BYTES: PinnedOrBytes}[reader]
        loader = Feed(index, items(source, o.max_pixels), chunk_size=min(batch_size, TF_CHUNK),
                      **kw)
    if plan.engine is Engine.TF_KERNELS:
        loader.png_decoder = plan.png_epoch  # WUFFS: the graph decodes PNGs with the native op
    loader.plan = plan
    return loader


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
                  label_mode: str | None, num_classes: int, *, epoch: int | None = None,
                  start_step: int = 0, attributes: dict[str, Any] | None = None):
    """Wraps a loader (`make_loader`'s) as a finite, batched tf.data.Dataset like Keras's.

    Args:
        loader: `DaliBatches` (DALI decodes) or a `Feed` (TF's kernels decode),
            with its plan (`loader.plan`: the handoff, TF's parallel decodes).
        spec: The output image spec.
        batch_size: Images per batch, or None for single images.
        label_mode: "int", "categorical", "binary" or None.
        num_classes: For "categorical".
        epoch: None: each iteration is the next epoch. An int: every iteration
            is that epoch, from its batch `start_step` on (the rest of an
            interrupted epoch; see `ds.loader.resume_at`).
        start_step: With `epoch`, the first batch.
        attributes: Set on the dataset, and on every one `resume_at` returns
            (e.g. Keras's `class_names` and `file_paths`).

    The dataset's public handle is `ds.loader` (`tfdata.handle.LoaderHandle`:
    the plan, stats, seek/resume, close); `ds.close()`, `ds.seek(e)` and
    `ds.resume_at(e, k)` are its methods. The cardinality is asserted when
    `on_error="raise"` (no file is left out) and, when sharded, every input
    pipeline reads as many batches.
    """
    tf = import_tf()
    plan: Plan = loader.plan
    num_threads = plan.options.num_threads
    which = (epoch, start_step)
    audits = None
    if plan.handoff is not None and plan.handoff.plugin:
        ds = plugin_dataset(tf, loader, spec, batch_size, label_mode, num_classes, which,
                            _cardinality(loader.feed, batch_size, epoch, start_step), plan.handoff)
    else:
        labelled = functools.partial(labels_like_keras, tf, label_mode, num_classes)
        if plan.engine is Engine.DALI:
            ds = _dali_dataset(tf, loader, spec, batch_size, which)
            feed = loader.feed
        elif plan.item_reader is ItemReader.READY_PINNED:
            ds = _ready_dataset(tf, loader, spec, batch_size, num_threads, which)
            feed = loader
        else:  # Keras's labels made in the audit's own map: one function fewer per iterator
            ds, audits = _tf_kernel_dataset(tf, loader, spec, batch_size, num_threads, which,
                                            labelled)
            feed = loader
            labelled = None
        if labelled is not None and label_mode != "int":
            plain = tf.autograph.experimental.do_not_convert  # see tf_path._tf_kernel_dataset
            ds = ds.map(plain(labelled))
        size = _cardinality(feed, batch_size, epoch, start_step)
        if size is not None:
            ds = ds.apply(tf.data.experimental.assert_cardinality(size))
        ds = ds.prefetch(tf.data.AUTOTUNE)
    handle = LoaderHandle(loader, plan, functools.partial(
        _resume_at, loader, spec, batch_size, label_mode, num_classes, attributes), audits)
    ds.loader = handle
    ds.close, ds.seek, ds.resume_at = handle.close, handle.seek, handle.resume_at
    for name, value in (attributes or {}).items():
        setattr(ds, name, value)
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


def _resume_at(loader, spec, batch_size, label_mode, num_classes, attributes,
               epoch: int, step: int):
    """The dataset of epoch `epoch` from batch `step` on (every iteration of it)."""
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"`epoch` must be a non-negative integer. Received: epoch={epoch!r}")
    return to_tf_dataset(loader, spec, batch_size, label_mode, num_classes, epoch=epoch,
                         start_step=step, attributes=attributes)


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
