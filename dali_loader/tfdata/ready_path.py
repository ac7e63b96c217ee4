"""The TF path over pixels: GPU-ready cache entries, or files the feed decoded.

No image file is decoded in the graph, so there is no audit (a file that cannot
be decoded was the feed's `on_error`): each generator call reads or copies a
whole batch of raw entries into one aligned buffer that TF shares without a copy
(`pooled_empty`, also the cache fills' allocator), and a batch of same-size
images is resized as one tensor. Compact entries (`formats.compact`, the
default) are copied into one buffer as they are and decoded in the graph by
the native core's TF op (`tf_png.decode_entries`, on TF's CPU threads) into
the same one-buffer layout; an entry the op refuses (its pixels' CRC-32) is
filled again from its file, in place. TensorFlow is passed in (imported lazily
by the caller).
"""

from __future__ import annotations

import os

import numpy as np

from dali_loader import tf_internals
from dali_loader.decode.dali_graph import default_num_threads
from dali_loader.formats import compact as compact_form
from dali_loader.formats.ready import RAW_HEADER, decode, decode_raw, raw_shape
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import resize_problem, resize_ready_batch
from dali_loader.errors import UnresizableImageError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import OpenEntry
from dali_loader.tfdata.weak import weakly as _weakly

ALIGN = 64  # TF shares an aligned numpy buffer's memory instead of copying it


def _aligned_empty(nbytes: int) -> np.ndarray:
    """A 1-D uint8 array of `nbytes` whose data is `ALIGN`-byte aligned, so that
    `from_generator` hands it to TF without a copy (TF keeps it alive while used)."""
    base = np.empty(nbytes + ALIGN, np.uint8)
    start = (-base.__array_interface__["data"][0]) % ALIGN
    return base[start:start + nbytes]


def pooled_empty(tf, nbytes: int) -> np.ndarray:
    """`_aligned_empty(nbytes)`, but from TF's own CPU allocator where it can be
    viewed writable (`tf_internals.pooled_empty`): that allocator pools what it frees
    (oneDNN's), so the buffer of a batch with a huge image reuses the memory TF freed
    after decoding it (when the entry was filled) instead of adding a second copy's worth."""
    out = tf_internals.pooled_empty(tf, nbytes, ALIGN)
    return _aligned_empty(nbytes) if out is None else out


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


class _CompactEntry:
    """A compact entry's bytes and the shape its header says (checked by the item
    reader, `feed.ready.ReadyBytes`)."""

    def __init__(self, item):
        self.data = item
        self.shape = compact_form.read_header(item).shape
        self.nbytes = memoryview(item).nbytes

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

    def compact_epoch(self):
        """Batches of compact entries: their bytes back to back in one buffer, with
        their byte bounds, the pixels' shapes and layout (`_ready_layout`), and paths."""
        epoch = self.feed.epoch(*self.which)
        try:
            while (chunk := epoch.next_chunk()) is not None:
                entries = [_CompactEntry(item) for item in chunk.items]
                entries, positions = self._unresizable(epoch, entries, chunk.positions)
                if not entries:
                    continue
                shapes = np.asarray([e.shape for e in entries], np.int32)
                offsets, total = _ready_layout(np.prod(shapes, axis=1, dtype=np.int64))
                bounds = np.concatenate([[0], np.cumsum([e.nbytes for e in entries])]).astype(np.int64)
                flat = _aligned_empty(int(bounds[-1]))
                for entry, at in zip(entries, bounds):
                    flat[at:at + entry.nbytes] = np.frombuffer(entry.data, np.uint8)
                paths = np.asarray([os.fsencode(epoch.path(p)) for p in positions], object)
                epoch.release(positions)
                labels = epoch.labels(positions)
                yield (flat, shapes, offsets, (np.zeros(len(shapes), np.int32) if labels is None
                                               else labels.astype(np.int32)),
                       bounds, np.int64(total), paths)
        finally:
            epoch.close()

    def refill(self, pixels, ok, offsets, shapes, paths) -> np.ndarray:
        """`pixels` with the images of the entries the op refused (not `ok`) decoded
        again from their files (and their entries replaced in the cache)."""
        from dali_loader.errors import CorruptImageError

        out = np.array(pixels)
        ready = self.feed.items.ready
        for i in np.flatnonzero(~np.asarray(ok)):
            path = os.fsdecode(paths[i])
            shape = tuple(int(v) for v in shapes[i])
            px = decode(ready.fill(path), ready.form)
            if px.shape != shape:
                raise CorruptImageError(path, f"its GPU-ready cache entry was damaged (it said "
                                              f"{shape}, the file decodes to {px.shape}); it "
                                              "was replaced, run the epoch again")
            at = int(offsets[i])
            out[at:at + px.size] = px.reshape(-1)
        return out

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
                    flat = pooled_empty(self.tf, total)
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


def ready_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
                  num_threads: int | None, which: tuple[int | None, int],
                  compact: bool = False):
    """The TF path over pixels (the GPU-ready cache's raw entries, or files the
    feed decoded): nothing to decode in the graph, so no audit (a file that
    cannot be decoded was the feed's `on_error`); a batch of same-size images is
    resized as one tensor (one output allocation per batch instead of one per
    image and op). `compact`: the feed's items are compact entries, decoded in
    the graph by the native core's TF op."""
    epochs = _ReadyEpochs(tf, feed, which, spec)
    if compact:
        return _compact_dataset(tf, epochs, spec, batch_size, num_threads)
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


def _loader_gone(*args):
    """The refill's stand-in once the loader is gone: never the refused entries' zeros."""
    raise RuntimeError("A compact GPU-ready cache entry was refused after its loader was "
                       "closed: nothing can decode its file again. Iterate a dataset whose "
                       f"loader is open. Received: {len(args)} arguments")


def _compact_dataset(tf, epochs: _ReadyEpochs, spec: ImageSpec, batch_size: int | None,
                     num_threads: int | None):
    """`ready_dataset` for compact entries: the op decodes each batch's entries into
    the raw layout, then the same resize."""
    from dali_loader.decode.tf_png import decode_entries

    sig = (tf.TensorSpec((None,), tf.uint8), tf.TensorSpec((None, 3), tf.int32),
           tf.TensorSpec((None,), tf.int64), tf.TensorSpec((None,), tf.int32),
           tf.TensorSpec((None,), tf.int64), tf.TensorSpec((), tf.int64),
           tf.TensorSpec((None,), tf.string))
    ds = tf.data.Dataset.from_generator(_weakly(epochs, "compact_epoch", lambda: iter(())),
                                        output_signature=sig)
    ds._dali_epochs = epochs
    refill = _weakly(epochs, "refill", _loader_gone)

    def decoded(entries, shapes, offsets, y, bounds, total, paths):
        pixels, ok = decode_entries(entries, bounds, offsets, shapes, total)
        pixels = tf.cond(tf.reduce_all(ok), lambda: pixels, lambda: tf.numpy_function(
            refill, [pixels, ok, offsets, shapes, paths], tf.uint8, stateful=True))
        pixels.set_shape((None,))
        return resize_ready_batch(pixels, shapes, offsets, spec, tf), y

    ds = ds.map(tf.autograph.experimental.do_not_convert(decoded),
                num_parallel_calls=num_threads or default_num_threads(), deterministic=True)
    return ds.unbatch() if batch_size is None else ds
