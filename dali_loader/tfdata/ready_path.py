"""The TF path over raw pixels: GPU-ready cache raw entries, or files the feed decoded.

Each generator call reads or copies a whole batch into one aligned buffer that
TF shares without a copy (`pooled_empty`, also the cache fills' allocator), and
a batch of same-size images is resized as one tensor. No image file is decoded
in the graph, so there is no audit (a file that cannot be decoded was the
feed's `on_error`). The helpers here (the buffers, the layout, the epochs'
shared parts, the pipeline) serve the compact entries' path too
(`compact_path`). TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import os

import numpy as np

from dali_loader import tf_internals
from dali_loader.decode.dali_graph import default_num_threads
from dali_loader.formats.ready import RAW_HEADER, decode_raw, raw_shape
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import resize_problem, resize_ready_batch
from dali_loader.errors import UnresizableImageError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import OpenEntry
from dali_loader.tfdata.generators import Generators, per_iterator_dataset
from dali_loader.tfdata.single_device import guarded, map_


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


def pack_parts(parts: list, tf) -> tuple[np.ndarray, np.ndarray]:
    """Byte buffers back to back in one (TF's pooled memory), and their bounds."""
    bounds = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    flat = pooled_empty(tf, int(bounds[-1]))
    for part, at in zip(parts, bounds):
        flat[at:at + part.size] = part
    return flat, bounds


def _pad_to_zero(shape, spec: ImageSpec) -> bool:
    """Whether `tf.image.resize_with_pad` of an image of `shape` (HxWxC) to the spec's
    size scales a side to zero rows or columns (its float32 arithmetic)."""
    h, w = np.float32(shape[0]), np.float32(shape[1])
    ratio = max(w / np.float32(spec.width), h / np.float32(spec.height))
    return bool(np.floor(h / ratio) < 1 or np.floor(w / ratio) < 1)


def ready_layout(sizes: np.ndarray) -> tuple[np.ndarray, int]:
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


class ReadyEpochs:
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
                    offsets, total = ready_layout(sizes)
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
                  num_threads: int | None, which: tuple[int | None, int]):
    """The TF path over raw pixels (the GPU-ready cache's raw entries, or files the
    feed decoded): a batch of same-size images is resized as one tensor (one output
    allocation per batch instead of one per image and op). Each iterator runs its
    own generator on TF's `GeneratorDataset` op, and the map is single-device, as
    on the TF path over files (`generators`, `single_device`)."""
    epochs = ReadyEpochs(tf, feed, which, spec)

    def batch(flat, shapes, offsets, y):
        return resize_ready_batch(flat, shapes, offsets, spec, tf), y

    epochs.generators = Generators(epochs.epoch)
    return pipeline(tf, epochs, pixel_signature(tf), batch, batch_size, num_threads)


def pixel_signature(tf) -> tuple:
    """What a raw batch's generator call gives: the pixels, shapes, offsets, labels."""
    return (tf.TensorSpec((None,), tf.uint8), tf.TensorSpec((None, 3), tf.int32),
            tf.TensorSpec((None,), tf.int64), tf.TensorSpec((None,), tf.int32))


def pipeline(tf, epochs, signature: tuple, batch, batch_size: int | None,
             num_threads: int | None):
    """`epochs.generators` on TF's generator op, then `batch` as a single-device map,
    `num_threads` batches at a time (one per core by default), in order."""
    ds = per_iterator_dataset(tf, epochs.generators, signature)
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    ds = guarded(tf, map_(tf, ds, tf.autograph.experimental.do_not_convert(batch),
                          num_threads or default_num_threads()))
    return ds.unbatch() if batch_size is None else ds
