"""The TF path over files (the CPU default): TF's own kernels decode and resize.

On a CPU-only machine DALI's PNG decoder is no faster than TF's and its resize
costs about twice as much (docs/benchmarks.md, "Why TF kernels on the CPU"), so
the feed does the I/O (index, read-ahead, gs:// cache) and TF decodes with the
ops of Keras's `_load_image_tf`: bit-identical to Keras, for every option.

Every element carries a key (its iteration's token and its position), and the
audit (`audit`) checks the keys that survive against what the iteration emitted:
a file TF drops is named, never lost. Two graphs, as the plan says (`plan.Graph`):
- FUSED, where its pads are at most a quarter of the files: the decode and the batch as one op, as in Keras's
  own pipeline (TF's `map_and_batch`). A batch holding a file TF rejects is
  dropped whole by `ignore_errors()`; the audit decodes that batch's files again
  eagerly, delivers those that decode, in order, and names the others. The end
  marker has a batch of its own (pads fill the last files' batch); neither is
  read or decoded.
- PER_FILE, elsewhere: the decode as a map, `ignore_errors()` per file, then the
  batch; the end marker, a valid tiny PNG, rides through the decode. No pads,
  which on a folder of a few batches cost more than the fusion saves.
Each iterator runs its own generator (`generators`): one independent epoch each.
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib
from collections.abc import Callable

import numpy as np

from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import (
    decode_like_keras,
    pixels_like_keras,
    read_item,
    resize_like_keras,
    resize_problem,
)
from dali_loader.errors import CorruptImageError, UnresizableImageError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import Pinned, read_bytes
from dali_loader.malloc import keep_read_buffers
from dali_loader.plan import Graph, ItemReader, Plan, PngWhere
from dali_loader.tf_internals import either
from dali_loader.tfdata.audit import END, AuditRegistry, Auditor
from dali_loader.tfdata.generators import Generators as _Generators
from dali_loader.tfdata.generators import per_iterator_dataset as _per_iterator_dataset
from dali_loader.tfdata.single_device import guarded, map_, map_and_batch
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
PAD = KEY_STRIDE - 2  # a pad's: fills the last files' batch, so that the marker's is its own


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG: the PER_FILE graph's end marker, which rides through decode."""
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


class _TFKernelEpochs:
    """What the TF path's generator and audit call: one `Auditor` per iterator.

    Each element is a file (its path, or bytes) and a key: the iteration's token
    times `KEY_STRIDE` plus the file's index position, or `PAD` and `MARKER` for
    the pads and the end marker (`_tail`). Labels are looked up per batch by the
    audit, not carried per element."""

    def __init__(self, tf, feed: Feed, spec: ImageSpec, which: tuple[int | None, int],
                 batch: int, plan: Plan):
        self.tf = tf
        self.feed = feed
        self.spec = spec
        self.which = which
        self.batch = batch
        self.batching = plan.graph
        self.reads = _reads(plan.item_reader)
        self.registry = AuditRegistry()
        self.generators = _Generators(self.epoch)
        labels = feed.index.labels
        self.labels = None if labels is None else np.asarray(labels, np.int32)
        # Small chunks first, so that decoding starts on an epoch's first files;
        # then larger ones: fewer generator calls per file.
        self.sizes = list(itertools.takewhile(
            lambda n: n < feed.chunk_size,
            (TF_FIRST_CHUNK << (TF_CHUNK_RAMP * i) for i in range(16))))

    def recover(self, path: str) -> np.ndarray | Exception:
        """A file of a batch TF dropped: read it again and decode it eagerly, with
        the graph's ops (TF's decoder: the native PNG op gives the same pixels).
        Returns its pixels as the batch would have held them, or why it fails:
        unreadable, corrupt, or unresizable (Keras's resize of it fails on a zero
        dimension)."""
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
        if problem:
            return UnresizableImageError(path, problem)
        return resize_like_keras(tf.convert_to_tensor(pixels), self.spec, tf).numpy()

    def diagnose(self, path: str) -> Exception:
        """Why the PER_FILE graph dropped `path`, a file alone (its graph has no
        way to put one back): `recover`'s error, or one asking for a report."""
        out = self.recover(path)
        if isinstance(out, BaseException):
            return out
        return RuntimeError(
            f"{path} dropped out of TensorFlow's decode, but reads and decodes now. "
            "It was not trained on in this epoch; please report this with the storage used."
        )

    def _files(self, items: list) -> tuple:
        """The element's file components for a chunk's items."""
        if self.reads is ItemReader.PATHS:  # as the OS spells them: any name, UTF-8 or not
            return ([os.fsencode(p) for p in items],)
        if self.reads is ItemReader.RAW_BYTES:
            return (items,)
        data, offsets = zip(*map(_as_string_and_offset, items))
        return list(data), np.asarray(offsets, np.int64)

    def _withhold_known_bad(self, epoch, chunk, auditor: Auditor) -> tuple[list, list[int]]:
        """A chunk's items and positions less the files an earlier iteration skipped:
        each would drop its whole batch again, which the audit would decode again,
        file by file. The audit sees them missing and decodes them alone instead:
        one eager decode each, as before the decode was fused with the batch."""
        known = self.feed.skipped
        if not known or self.batching is Graph.PER_FILE:  # it drops a file alone
            return chunk.items, chunk.positions
        keep = [i for i, pos in enumerate(chunk.positions) if epoch.path(pos) not in known]
        if len(keep) == len(chunk.positions):
            return chunk.items, chunk.positions
        kept = set(keep)
        auditor.withheld.update(pos for i, pos in enumerate(chunk.positions) if i not in kept)
        return [chunk.items[i] for i in keep], [chunk.positions[i] for i in keep]

    def _tail(self, emitted: int, base: np.int64) -> tuple:
        """The epoch's last element. FUSED: pads up to the end of the last files'
        batch (a batch's bounds are fixed by the fused op), then the end marker,
        alone in its batch; neither is read or decoded (`tf_kernel_dataset`).
        PER_FILE: the end marker, a tiny PNG that its decode drops for nothing."""
        if self.batching is Graph.PER_FILE:
            key = np.asarray([base + MARKER], np.int64)
            if self.reads is ItemReader.PATHS:
                return [os.fsencode(END_MARKER_FILE)], key
            if self.reads is ItemReader.RAW_BYTES:
                return [END_MARKER], key
            return [END_MARKER], np.asarray([-1], np.int64), key
        pads = -emitted % self.batch
        keys = np.full(pads + 1, base + PAD, np.int64)
        keys[-1] = base + MARKER
        empty = [b""] * (pads + 1)
        if self.reads is ItemReader.PINNED_OR_BYTES:
            return empty, np.full(pads + 1, -1, np.int64), keys
        return empty, keys

    def epoch(self):
        keep_read_buffers()  # after TF's own setting for from_generator (dali_loader.malloc)
        registry = self.registry
        recover = self.recover if self.batching is Graph.FUSED else self.diagnose
        auditor = Auditor(lambda: self.feed.epoch(*self.which), recover)
        token = registry.open(auditor)
        base = np.int64(token) * KEY_STRIDE
        emitted = 0

        def element(epoch, chunk):
            nonlocal emitted
            items, positions = self._withhold_known_bad(epoch, chunk, auditor)
            emitted += len(positions)
            return (*self._files(items), np.asarray(positions, np.int64) + base)

        fed_out = False
        try:
            # Nothing may raise here outside the auditor: `ignore_errors()`
            # downstream would turn an exception into a silently short epoch.
            yield from auditor.chunks(element, self.sizes)
            yield self._tail(emitted, base)
            fed_out = True
        finally:
            if fed_out:
                registry.fed_out(token)
            else:  # abandoned: stop its reads, release what it holds
                registry.close(token)

    def check(self, keys: np.ndarray, empty: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.int64]:
        """One surviving batch's keys, in order: audits them against what the
        iteration emitted. Returns the pixels of the files recovered from dropped
        batches before it (`empty` when none), the labels of those files and then
        of the batch's, and the batch's count of files (less pads and marker)."""
        token, slots = np.divmod(keys, KEY_STRIDE)
        slots = slots[slots < PAD]  # the pads end the last files' batch
        positions = slots.tolist()
        if keys[-1] % KEY_STRIDE == MARKER:
            positions.append(END)
        recovered = self.registry.check(int(token[0]), positions)
        pixels = empty
        if recovered:
            pixels = np.stack([p for _, p in recovered]).astype(empty.dtype, copy=False)
            slots = np.concatenate([np.asarray([pos for pos, _ in recovered], slots.dtype),
                                    slots])
        labels = (np.zeros(len(slots), np.int32) if self.labels is None
                  else self.labels[slots])
        return pixels, labels, np.int64(len(positions) - (positions[-1:] == [END]))


def _no_check(keys: np.ndarray, empty: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.int64]:
    """The audit's stand-in once the dataset is gone (nothing left to check)."""
    n = int(np.count_nonzero(keys % KEY_STRIDE < PAD))
    return empty, np.zeros(n, np.int32), np.int64(n)


def _reads(reader: ItemReader) -> ItemReader:
    """How the graph gets a file's bytes: the plan's item reader (one graph per
    dataset: no per-element branch where there is one kind)."""
    if reader is ItemReader.PATHS and not os.path.isfile(END_MARKER_FILE):
        raise FileNotFoundError(
            f"The package file {END_MARKER_FILE} is missing (the graph's end marker for local "
            "paths): reinstall dali-loader (pip install --force-reinstall).")
    return reader


def tf_kernel_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
                       which: tuple[int | None, int],
                       labelled: Callable = lambda x, y: (x, y)):
    """The TF path over files: `labelled(x, y)` makes each batch's labels Keras's.

    The generator's elements, unbatched; the decode and the batch (the plan's `Graph`:
    FUSED, as one op, `single_device.map_and_batch`, then `ignore_errors()`, which
    drops a batch holding a failing file; PER_FILE, the decode's map,
    `ignore_errors()`, which drops the file, then the batch); the audit's map,
    which checks each batch, drops the pads and the marker, makes the labels, and
    with FUSED puts back before the batch the files it recovered from a dropped
    one; `rebatch`, which evens the sizes out again (no function; full batches
    pass through without a copy). Each function in the pipeline is instantiated
    again for every iterator, so the audit, the recovery and the labels share one
    map, and every function is single-device (`single_device`: about 0.2 ms each
    instead of 3-4 ms).

    Measured (issue 29, docs/benchmarks.md): `iter()` 1.4 ms of CPU, Keras's 4.3;
    on 512 JPEGs FUSED against the per-file map of before: context switches per
    image 4.50-4.55 -> 3.79-3.80, below Keras's 4.0."""
    batch = batch_size or 32
    plan: Plan = feed.plan  # the graph, the reads, the decode calls, the PNG decoder
    epochs = _TFKernelEpochs(tf, feed, spec, which, batch, plan)
    vec = tf.TensorSpec((None,), tf.int64)
    files = (tf.TensorSpec((None,), tf.string),)
    if epochs.reads is ItemReader.PINNED_OR_BYTES:
        files += (vec,)
    # One generator per iterator: one independent epoch each.
    ds = _per_iterator_dataset(tf, epochs.generators, (*files, vec))
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    # PNGs by the native core's op where the plan put it (others, and the files it
    # leaves, by TF's decoder in the same graph: tf_png); a folder with no file
    # named .png gets Keras's decode alone (plan.has_pngs).
    native = plan.png_where is PngWhere.TF_OP
    dtype = tf.uint8 if spec.output_uint8 else tf.float32
    fused = plan.graph is Graph.FUSED

    def zeros(data, *_):  # for a pad or the marker: nothing read or decoded
        return tf.fill(spec.shape, tf.cast(tf.strings.length(data) * 0, dtype))

    def unless_pad(key, image: Callable, *args):
        if not fused:  # no pads; the marker decodes
            return image(*args)
        img = either(tf, tf.math.floormod(key, KEY_STRIDE) >= PAD, zeros, image, *args)
        img.set_shape(spec.shape)
        return img

    if epochs.reads is ItemReader.PINNED_OR_BYTES:
        def decode(data, offset, key):
            return unless_pad(key, lambda d, o: decode_like_keras(
                read_item(tf, d, o), spec, tf, native), data, offset), key
    else:
        read = tf.io.read_file if epochs.reads is ItemReader.PATHS else tf.identity

        def decode(data, key):
            return unless_pad(key, lambda d: decode_like_keras(read(d), spec, tf, native),
                              data), key

    # The graph functions are plain TF (no Python control flow on tensors): not
    # converted by AutoGraph, which cost about 0.5 s of every construction.
    plain = tf.autograph.experimental.do_not_convert
    # Fixed from the first batch on: AUTOTUNE ramps up over a few batches, which
    # short epochs feel: the plan's `decode_calls` (`num_threads`, or by default 2
    # calls per core). Every map single-device (`single_device`): about 3-4 ms less
    # per function and `iter()`; in order (the audit checks positions in order).
    calls = plan.decode_calls
    if fused:
        ds = map_and_batch(tf, ds.unbatch(), plain(decode), batch, calls).ignore_errors()
    else:
        ds = map_(tf, ds.unbatch(), plain(decode), calls).ignore_errors().batch(batch)
    empty = np.zeros((0, *spec.shape), np.uint8 if spec.output_uint8 else np.float32)
    weak_check = _weakly(epochs, "check", _no_check)

    def check(keys):
        return weak_check(keys, empty)

    def audit(x, keys):
        extra, y, n = tf.numpy_function(check, [keys], (dtype, tf.int32, tf.int64))
        y.set_shape((None,))
        n.set_shape(())
        if not fused:  # nothing recovered (`diagnose`); the marker dropped, no copy
            return labelled(x[:n], y)
        extra.set_shape(x.shape)
        # The files recovered first, then the batch's, less the pads and the marker:
        # a new tensor where anything changes (a slice alone is a sub-buffer, which
        # TF's later ops log errors about), the batch itself, no copy, where not.
        changed = tf.logical_or(tf.shape(extra)[0] > 0, n < tf.shape(x, tf.int64)[0])
        shape = x.shape
        x = either(tf, changed, lambda x, e, n: tf.concat([e, x[:n]], 0), lambda x, e, n: x,
                    x, extra, n)
        x.set_shape(shape)
        return labelled(x, y)

    ds = guarded(tf, map_(tf, ds, plain(audit)).rebatch(batch))
    return (ds.unbatch() if batch_size is None else ds), epochs.registry
