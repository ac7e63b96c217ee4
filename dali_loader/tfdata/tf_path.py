"""The TF path over files (the CPU default): TF's own kernels decode and resize.

On a CPU-only machine DALI's PNG decoder is no faster than TF's and its resize
costs about twice as much (docs/benchmarks.md, "Why TF kernels on the CPU"), so
the feed does the I/O (index, read-ahead, gs:// cache) and TF decodes with the
ops of Keras's `_load_image_tf`: bit-identical to Keras, for every option. Files
TF's decoder rejects are dropped by `ignore_errors()` and named by the audit
(`audit`): every element carries a key (its iteration's token and its position),
and an end marker, a valid tiny PNG, closes every epoch. Each iterator runs its
own generator (`generators`): one independent epoch each.
"""

from __future__ import annotations

import enum
import itertools
import os
import struct
import zlib
from collections.abc import Callable

import numpy as np

from dali_loader.decode.dali_graph import default_num_threads
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import (
    decode_like_keras,
    pixels_like_keras,
    read_item,
    resize_problem,
)
from dali_loader.errors import CorruptImageError, UnresizableImageError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import Paths, Pinned, RawBytes, read_bytes
from dali_loader.malloc import keep_read_buffers
from dali_loader.plan import PngDecoder
from dali_loader.tfdata.audit import END, AuditRegistry, Auditor
from dali_loader.tfdata.generators import Generators as _Generators
from dali_loader.tfdata.generators import per_iterator_dataset as _per_iterator_dataset
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


def tf_kernel_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
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
    # PNGs by the native core's op where the plan put it (others, and the files it
    # leaves, by TF's decoder in the same graph: tf_png); a folder with no file
    # named .png gets Keras's decode alone (plan.has_pngs).
    native = getattr(feed, "png_decoder", None) is PngDecoder.WUFFS
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
