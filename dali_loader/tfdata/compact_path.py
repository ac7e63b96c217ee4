"""The TF path over compact GPU-ready entries (`formats.compact`, the default form).

Each generator call reads a whole batch of entries into one buffer of TF's
pooled memory (the feed opened them, `feed.ready.ReadyPinned`), and the native
core's TF op (`tf_png.decode_entries`, on TF's CPU threads) decodes them into
the raw path's one-buffer layout; the same resize follows (`ready_path`). In a
filling epoch the same op decodes each new PNG and writes its compact entry,
which one call per batch keeps in the cache (`_CompactEpochs.store`). There is
no audit: what the op refuses (a damaged entry, a PNG the core leaves to
libpng, a corrupt file) is decoded again on the CPU in the batch's own call
(`_CompactEpochs.refill`), and a file that does not decode goes to `on_error`
there (raised, or skipped and taken out of the batch); every other bad file was
the feed's `on_error`. TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from dali_loader.decode.dali_graph import default_num_threads
from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import resize_ready_batch
from dali_loader.decode.tf_png import decode_entries
from dali_loader.errors import BadFileError, CorruptImageError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import OpenEntry
from dali_loader.feed.policy import EpochErrors
from dali_loader.feed.ready import PngFill
from dali_loader.formats import compact as compact_form
from dali_loader.formats.ready import RAW_HEADER, raw_header
from dali_loader.malloc import keep_read_buffers
from dali_loader.tfdata.generators import Generators
from dali_loader.tfdata.ready_path import (
    pixel_signature,
    pack_parts,
    ready_layout,
    ReadyEpochs,
    pipeline,
    pooled_empty,
)
from dali_loader.tfdata.weak import weakly as _weakly

logger = logging.getLogger(__name__)

KEEP_TALLIES = 8  # epochs whose tallies a late batch's store still counts into


class _CompactEntry:
    """An item of a compact batch: an entry open (`OpenEntry`: its size from the
    descriptor, read into the batch's buffer by `read_into`) or as bytes; the
    pixels of a file just filled (HxWxC, `ReadyCache.fill_pixels`), which go in as
    a raw entry (`formats.ready`'s header, then the pixels: the op copies them); or
    a PNG to fill from (`PngFill`: the op decodes it and writes its entry). `shape`
    once `check` found the header and chunk table sound."""

    def __init__(self, item, channels: int):
        self.fd = None
        self.data = None
        self.pixels = None
        self.version = b""  # a PNG to fill from: the file's version when read
        self.shape: tuple[int, int, int] = (0, 0, 0)
        self.png = isinstance(item, PngFill)
        if self.png:
            self.data = item.data
            self.nbytes = len(item.data)
            self.shape = (item.height, item.width, channels)
            # b"?": changed while read (decoded, not kept); b"": not a PNG to fill from
            self.version = (item.version or "?").encode()
        elif isinstance(item, OpenEntry):
            self.fd, self.at = item.fd, item.offset
            self.nbytes = os.fstat(self.fd).st_size - self.at
        elif isinstance(item, np.ndarray):
            self.pixels = item
            self.nbytes = RAW_HEADER + item.size
        else:
            self.data = item
            self.nbytes = memoryview(item).nbytes

    def read_into(self, out: np.ndarray) -> bool:
        """Copies or reads the item into `out`; False on a short read (an entry cut
        on disk after it was opened: refilled like a damaged one)."""
        if self.pixels is not None:
            out[:RAW_HEADER] = np.frombuffer(raw_header(self.pixels.shape), np.uint8)
            out[RAW_HEADER:] = self.pixels.reshape(-1)
        elif self.data is not None:
            out[:] = np.frombuffer(self.data, np.uint8)
        else:
            return os.preadv(self.fd, [memoryview(out)], self.at) == out.size
        return True

    def check(self, view: np.ndarray) -> bool:
        """Whether the entry's header, chunk table and frame headers hold (the core's
        checks, no decompression; the pixels' CRC-32 is the op's); sets `shape`. The
        pixels of a fill hold, and a PNG is the op's to decode (or refuse)."""
        if self.pixels is not None:
            self.shape = self.pixels.shape
            return True
        if self.png:
            return True
        try:
            self.shape = compact_form.info(view).shape
        except compact_form.EntryError:
            return False
        return True

    def close(self) -> None:
        pass


class _CompactEpochs(ReadyEpochs):
    """What the generator and the batches' calls use on the compact path: the raw
    path's epochs (`ReadyEpochs`) plus each epoch's token, its tally and its
    batches still to store."""

    def __init__(self, tf, feed: Feed, which: tuple[int | None, int],
                 spec: ImageSpec | None = None):
        super().__init__(tf, feed, which, spec)
        self._lock = threading.Lock()
        self._tokens = 0
        self._tallies: dict[int, Any] = {}  # token -> an epoch's tally
        self._pending: dict[int, int] = {}  # token -> its batches yielded, not yet stored
        self._closing: dict[int, Any] = {}  # token -> its epoch, finished, to close when stored
        self.calls = 1  # batches decoded at a time (`compact_dataset` sets it)

    def epoch(self):
        """Batches of compact entries (and of PNGs to fill from): read back to back
        into one buffer (TF's pooled memory, shared with TF: one copy from the page
        cache), with their byte bounds, the pixels' shapes and layout
        (`ready_layout`), paths, the versions of the PNGs to fill from, and the
        epoch's token. An epoch that ends with batches still to store closes when
        the last is stored (its tally then holds their failed writes); one
        abandoned closes at once."""
        # A fill reads each PNG's bytes on the feed's threads, as the TF path's reads do:
        # from the heap, not a fresh mapping per file (after TF's from_generator setting).
        keep_read_buffers()
        epoch = self.feed.epoch(*self.which)
        token = self._register(epoch.tally)
        finished = False
        try:
            while (chunk := epoch.next_chunk()) is not None:
                try:
                    entries, kept, flat, bounds = self._compact_batch(epoch, chunk)
                finally:
                    epoch.release(chunk.positions)
                if not entries:
                    continue
                shapes = np.asarray([e.shape for e in entries], np.int32)
                offsets, total = ready_layout(np.prod(shapes, axis=1, dtype=np.int64))
                paths = np.asarray([os.fsencode(epoch.path(p)) for p in kept], object)
                versions = np.asarray([e.version for e in entries], object)
                labels = epoch.labels(kept)
                if any(versions):  # the graph stores this batch's entries (`store`)
                    self._stores(token, +1)
                # The epoch's last batch runs alone: its op spreads it over the calls' cores.
                spread = np.int32(self.calls if epoch.remaining == 0 else 1)
                yield (flat, shapes, offsets, (np.zeros(len(shapes), np.int32) if labels is None
                                               else labels.astype(np.int32)),
                       bounds, np.int64(total), paths, versions, token, spread)
            finished = True
        finally:
            if not (finished and self._close_when_stored(token, epoch)):
                epoch.close()

    def _register(self, tally) -> np.int64:
        """A token for an epoch's tally, which the batches' `store` counts into (the
        latest `KEEP_TALLIES`). Finished epochs still waiting on stores close now: an
        iterator abandoned after its generator ended never stores its last batches
        (a late store still counts into the tally, after the epoch's line)."""
        with self._lock:
            self._tokens += 1
            self._tallies[self._tokens] = tally
            self._pending[self._tokens] = 0
            for old in [t for t in self._tallies if t <= self._tokens - KEEP_TALLIES]:
                del self._tallies[old]
                self._pending.pop(old, None)
            waiting, self._closing = list(self._closing.values()), {}
            token = np.int64(self._tokens)
        for epoch in waiting:
            epoch.close()
        return token

    def _stores(self, token, n: int) -> None:
        """Counts a batch of epoch `token` to store (+1) or stored (-1); the last one
        stored closes its finished epoch."""
        with self._lock:
            if int(token) not in self._pending:  # an epoch long gone (`KEEP_TALLIES`)
                return
            left = self._pending[int(token)] = self._pending[int(token)] + n
            epoch = self._closing.pop(int(token), None) if left <= 0 else None
        if epoch is not None:
            epoch.close()

    def _close_when_stored(self, token, epoch) -> bool:
        """Whether a finished epoch still has batches to store (it then closes when
        they are)."""
        with self._lock:
            if self._pending.get(int(token), 0) <= 0:
                return False
            self._closing[int(token)] = epoch
            return True

    def _compact_batch(self, epoch, chunk) -> tuple[list, list, np.ndarray, np.ndarray]:
        """A chunk's items read into one buffer and checked: an entry whose header or
        chunk table does not hold is decoded from its file again (and replaced); a
        file that no longer decodes, or that Keras's resize refuses, goes to the
        epoch's `on_error`. Returns the entries, their positions, the buffer, bounds."""
        channels = self.spec.channels if self.spec is not None else 3
        entries = [_CompactEntry(item, channels) for item in chunk.items]
        positions = list(chunk.positions)
        bounds = np.concatenate([[0], np.cumsum([e.nbytes for e in entries])]).astype(np.int64)
        flat = pooled_empty(self.tf, int(bounds[-1]))
        parts: list[np.ndarray | None] = []
        changed = False
        for i, entry in enumerate(entries):
            view = flat[bounds[i]:bounds[i + 1]]
            parts.append(view)
            if not (entry.read_into(view) and entry.check(view)):
                entries[i], parts[i] = self._refilled(epoch, positions[i], channels)
                changed = True
        live = [(e, p, part) for e, p, part in zip(entries, positions, parts) if e is not None]
        entries, kept = self._unresizable(epoch, [e for e, _, _ in live], [p for _, p, _ in live])
        if changed or len(kept) != len(positions):
            part_of = {p: part for _, p, part in live}
            flat, bounds = pack_parts([part_of[p] for p in kept], self.tf)
        return entries, kept, flat, bounds

    def _refilled(self, epoch, pos: int, channels: int):
        """A damaged entry's file decoded again (its entry replaced): the new item and
        its bytes, or (None, None) where the file no longer decodes (skipped)."""
        path = epoch.path(pos)
        logger.warning("The GPU-ready cache entry of %s is damaged; decoding the file again.",
                       path)
        self.feed.items.table.forget(pos)
        epoch.tally.add("cache_bad_entries")
        try:
            entry = _CompactEntry(self.feed.items.ready.fill_pixels(path, epoch.tally), channels)
        except BadFileError as e:
            epoch.errors(e)  # raises with on_error="raise"
            return None, None
        part = np.empty(entry.nbytes, np.uint8)
        entry.read_into(part)
        entry.check(part)
        return entry, part

    def store(self, filled, at, sizes, paths, versions, token) -> np.int64:
        """Keeps the entries the op wrote for a batch's PNGs (`ReadyCache.store`; entry
        i is `filled[at[i]:at[i] + sizes[i]]`, a view of TF's buffer, written without a
        copy), counting the fills (once the op ran: a PNG read ahead by an abandoned
        epoch is not one) and failed writes into the batch's epoch."""
        ready = self.feed.items.ready
        tally = self._tallies.get(int(token))
        n = 0
        try:
            for start, size, path, version in zip(at, sizes, paths, versions):
                if not version:
                    continue
                ready.count("fills", tally)
                if size > 0 and version != b"?":
                    entry = filled[int(start):int(start) + int(size)]
                    n += ready.store(os.fsdecode(path), version.decode(), [entry], tally)
        finally:
            self._stores(token, -1)
        return np.int64(n)

    def refill(self, pixels, ok, offsets, shapes, paths) -> tuple[np.ndarray, np.ndarray]:
        """`pixels` with the images of the items the op refused (not `ok`: a damaged
        entry, a PNG the core leaves to libpng, a corrupt file) decoded again from
        their files on the CPU (their entries written), and which to keep: a file
        that does not decode goes to `on_error` (raised, or skipped: not kept)."""
        out = np.array(pixels)
        keep = np.ones(len(ok), bool)
        ready = self.feed.items.ready
        for i in np.flatnonzero(~np.asarray(ok)):
            path = os.fsdecode(paths[i])
            self.feed.items.refused.add(path)
            shape = tuple(int(v) for v in shapes[i])
            try:
                px = ready.fill_pixels(path)
                if px.shape != shape:
                    raise CorruptImageError(path, f"its GPU-ready cache entry was damaged (it "
                                                  f"said {shape}, the file decodes to "
                                                  f"{px.shape}); it was replaced, run the "
                                                  "epoch again")
            except BadFileError as e:
                EpochErrors(self.feed.on_error, self.feed.report)(e)  # raises, or records
                keep[i] = False
                continue
            at = int(offsets[i])
            out[at:at + px.size] = px.reshape(-1)
        return out, keep


def compact_dataset(tf, feed: Feed, spec: ImageSpec, batch_size: int | None,
                    num_threads: int | None, which: tuple[int | None, int]):
    """The TF path over compact entries (and PNGs to fill from): the native op decodes
    each batch (the module's docstring), then the raw path's resize."""
    epochs = _CompactEpochs(tf, feed, which, spec)
    epochs.calls = num_threads or default_num_threads()
    sig = (*pixel_signature(tf), tf.TensorSpec((None,), tf.int64),
           tf.TensorSpec((), tf.int64),
           tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.string),
           tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.int32))
    refill = _weakly(epochs, "refill", _loader_gone)
    store = _weakly(epochs, "store", lambda *_: np.int64(0))

    def batch(entries, shapes, offsets, y, bounds, total, paths, versions, token, spread):
        out, ok, filled, filled_at, filled_size = decode_entries(
            entries, bounds, offsets, shapes, total, channels=spec.channels, spread=spread)
        # The entries the op wrote for the batch's PNGs, kept before the batch leaves.
        stored = tf.cond(
            tf.reduce_any(tf.strings.length(versions) > 0),
            lambda: tf.numpy_function(store, [filled, filled_at, filled_size, paths,
                                              versions, token], tf.int64, stateful=True),
            lambda: tf.constant(0, tf.int64))

        def refilled():
            px, keep = tf.numpy_function(refill, [out, ok, offsets, shapes, paths],
                                         (tf.uint8, tf.bool), stateful=True)
            return px, keep

        px, keep = tf.cond(tf.reduce_all(ok), lambda: (out, ok), refilled)
        px.set_shape((None,))
        keep.set_shape((None,))
        with tf.control_dependencies([stored]):
            px = tf.identity(px)
        images = resize_ready_batch(px, shapes, offsets, spec, tf)
        # A file that does not decode, skipped (on_error="skip"): out of the batch.
        return tf.cond(tf.reduce_all(keep), lambda: (images, y),
                       lambda: (tf.boolean_mask(images, keep), tf.boolean_mask(y, keep)))

    epochs.generators = Generators(epochs.epoch)
    return pipeline(tf, epochs, sig, batch, batch_size, num_threads)


def _loader_gone(*args):
    """The refill's stand-in once the loader is gone: never the refused entries' zeros."""
    raise RuntimeError("A compact GPU-ready cache entry was refused after its loader was "
                       "closed: nothing can decode its file again. Iterate a dataset whose "
                       f"loader is open. Received: {len(args)} arguments")
