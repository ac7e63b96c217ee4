"""tf.data output: a `BatchLoader` as a finite, Keras-shaped `tf.data.Dataset`.

Two decode paths behind one dataset:
- DALI (`BatchLoader(decode=True)`, the GPU path): DALI decodes and resizes;
  batches cross into TF through `from_generator`, one Python call per batch.
- TensorFlow's own kernels (the CPU default): on a CPU-only machine DALI's PNG
  decoder is no faster than TF's and its resize costs about twice as much
  (README, "Why TF kernels on the CPU"), so the loader keeps its I/O (index,
  read-ahead, gs:// cache) and TF decodes with the ops of Keras's
  `_load_image_tf`: bit-identical to Keras, for every option. Files TF's
  decoder rejects are dropped by `ignore_errors()` and named by an audit.
TensorFlow is imported lazily; `dali_loader` stays usable without it.
"""

from __future__ import annotations

import collections
import struct
import zlib

import numpy as np

from dali_loader.loader import BatchLoader
from dali_loader.pipeline import default_num_threads
from dali_loader.sources import Listing, on_network_fs


def import_tf():
    """Imports TensorFlow, with an error that says what to install."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(
            "tf.data output needs TensorFlow: pip install tensorflow (or run `make install`)."
        ) from e
    return tf


TF_CHUNK = 16  # files per generator call on the TF path


def make_loader(listing: Listing, index, spec, *, batch_size: int, shuffle: bool, seed: int,
                device: str, decoder: str | None = None, num_threads: int | None = None,
                on_error: str = "raise", max_in_flight: int = 64) -> BatchLoader:
    """The `BatchLoader` for a dataset: DALI on the GPU (or `decoder="dali"`),
    else TF's kernels; on a local disk TF reads the files too, while FUSE/NFS
    mounts and URLs keep the loader's read-ahead with `max_in_flight` reads."""
    use_dali = decoder == "dali" or device == "gpu"
    tf_reads = not use_dali and listing.remote is None and not on_network_fs(listing.root)
    return BatchLoader(
        index, spec, batch_size=batch_size, shuffle=shuffle, seed=seed,
        read_fn=listing.read, device=device, num_threads=num_threads, on_error=on_error,
        max_in_flight=max_in_flight, decode=use_dali, read=not tf_reads,
        locate_fn=listing.locate,
        # TF batches again after decoding: small chunks let decoding start on
        # the first files of an epoch instead of waiting for a whole batch.
        chunk_size=None if use_dali else min(batch_size, TF_CHUNK),
    )


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG: the end-of-epoch marker that rides through decode."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


END_MARKER = _tiny_png()


def _as_string_and_offset(item) -> tuple[bytes, int]:
    """A loader item as (string, offset): a file to read from `offset` on
    (a local path: 0; a cache entry: its payload offset), or bytes (-1)."""
    if isinstance(item, str):
        return item.encode(), 0
    if isinstance(item, tuple):
        return item[0].encode(), int(item[1])
    return item, -1


def read_item(tf, data, offset):
    """Bytes of an item: `data` itself (offset < 0), or the file it names from
    `offset` on, read by TF (no Python copy)."""
    def from_file():
        content = tf.io.read_file(data)
        start = tf.cast(offset, tf.int32)
        return tf.cond(
            start > 0,
            lambda: tf.strings.substr(content, start, tf.strings.length(content) - start),
            lambda: content,
        )

    return tf.cond(offset >= 0, from_file, lambda: data)


class DecodeAuditor:
    """Names the files TF's decoder rejected, so none is lost silently.

    Decoding runs under `ignore_errors()`; every batch's surviving index
    positions are checked, in order, against what the loader emitted. A gap is
    a file the decoder failed on: `loader.report_bad` raises an error naming it
    (`on_error="raise"`) or logs and records it (`"skip"`). Each epoch ends with
    a marker image (position -1) so a bad file at the very end is caught too.
    """

    def __init__(self, loader):
        self.loader = loader
        self.emitted: collections.deque[int] = collections.deque()
        self.error: Exception | None = None

    def epoch(self):
        """Yields the loader's encoded batches, the last one with the marker.

        A read-stage error (`on_error="raise"`), or any other exception of the
        loader, is held and raised by `check` at the marker: raised here,
        `ignore_errors()` would swallow it and end the epoch short.
        """
        self.emitted.clear()
        self.error = None
        try:
            for items, labels, positions in self.loader:
                self.emitted.extend(positions)
                labels = np.zeros(len(items), np.int32) if labels is None else labels
                data, offsets = zip(*map(_as_string_and_offset, items))
                yield (list(data), np.asarray(offsets, np.int64), labels,
                       np.asarray(positions, np.int64))
        except Exception as e:  # noqa: BLE001 - re-raised by check()
            self.error = e
        self.emitted.append(-1)
        yield ([END_MARKER], np.asarray([-1], np.int64), np.zeros(1, np.int32),
               np.asarray([-1], np.int64))

    def check(self, positions) -> bool:
        """Reports every emitted position missing before each survivor."""
        for pos in positions.numpy().tolist():
            while self.emitted and self.emitted[0] != pos:
                self.loader.report_bad(self.emitted.popleft(), "TensorFlow's decoder failed on it")
            if self.emitted:
                self.emitted.popleft()
            if pos == -1 and self.error is not None:
                err, self.error = self.error, None
                raise err
        return True


def decode_like_keras(data, spec, tf):
    """Decodes one encoded image tensor the way Keras's loader decodes a file.

    Args:
        data: A scalar tf.string with the file's bytes.
        spec: The `dali_loader.pipeline.ImageSpec` to produce.
        tf: The tensorflow module.

    Returns:
        The image tensor, shaped like Keras's (HWC, or CHW for channels_first).
    """
    size = (spec.height, spec.width)
    data_format = "channels_first" if spec.channels_first else "channels_last"
    img = tf.image.decode_image(data, channels=spec.channels, expand_animations=False)
    if spec.crop_to_aspect_ratio:
        if spec.channels_first:
            img = tf.transpose(img, (2, 0, 1))
        img = _smart_resize(img, size, spec.interpolation, data_format)
    elif spec.pad_to_aspect_ratio:
        img = tf.image.resize_with_pad(img, size[0], size[1], method=spec.interpolation)
        if spec.channels_first:
            img = tf.transpose(img, (2, 0, 1))
    else:
        img = tf.image.resize(img, size, method=spec.interpolation)
        if spec.channels_first:
            img = tf.transpose(img, (2, 0, 1))
    img.set_shape(spec.shape)
    return img


def _smart_resize(img, size, interpolation, data_format):
    """Keras's `smart_resize` with its TensorFlow backend, as Keras calls it."""
    from keras.preprocessing.image import smart_resize

    try:
        from keras.src.backend import tensorflow as tf_backend
    except ImportError:  # pragma: no cover - a future Keras layout
        return smart_resize(img, size, interpolation=interpolation, data_format=data_format)
    return smart_resize(
        img, size, interpolation=interpolation, data_format=data_format,
        backend_module=tf_backend,
    )


def to_tf_dataset(loader: BatchLoader, batch_size, label_mode, num_classes, known_size):
    """Wraps a loader as a finite, batched tf.data.Dataset like Keras's.

    Args:
        loader: The `BatchLoader` (`decode=True`: DALI decodes; else TF does).
        batch_size: Images per batch, or None for single images.
        label_mode: "int", "categorical", "binary" or None.
        num_classes: For "categorical".
        known_size: Assert the cardinality (`on_error="raise"`).
    """
    tf = import_tf()
    spec = loader.spec
    img_dtype = tf.uint8 if spec.output_uint8 else tf.float32
    label_sig = tf.TensorSpec((None,), tf.int32)

    def batches():
        for x, y in loader:  # unlabelled: placeholder labels, dropped below
            yield x, (np.zeros(len(x), np.int32) if y is None else y)

    if loader.decode:  # DALI decodes and resizes (the GPU path)
        sig = (tf.TensorSpec((None, *spec.shape), img_dtype), label_sig)
        ds = tf.data.Dataset.from_generator(batches, output_signature=sig)
        if batch_size is None:
            ds = ds.unbatch()
    else:  # the loader reads; TF's kernels decode, as in Keras
        auditor = DecodeAuditor(loader)
        vec = tf.TensorSpec((None,), tf.int64)
        sig = (tf.TensorSpec((None,), tf.string), vec, label_sig, vec)
        ds = tf.data.Dataset.from_generator(auditor.epoch, output_signature=sig)
        ds = ds.unbatch().map(
            lambda data, off, y, pos: (decode_like_keras(read_item(tf, data, off), spec, tf),
                                       y, pos),
            # One decode per core (or per `num_threads`) from the first batch
            # on: AUTOTUNE ramps up over a few batches, which short epochs feel.
            num_parallel_calls=loader.num_threads or default_num_threads(),
        ).ignore_errors()

        def audit(x, y, pos):
            ok = tf.py_function(auditor.check, [pos], tf.bool)
            with tf.control_dependencies([ok]):
                return tf.cond(  # drop the marker; no copy for the other batches
                    pos[-1] < 0,
                    lambda: (x[:-1], y[:-1]),
                    lambda: (tf.identity(x), tf.identity(y)),
                )

        ds = ds.batch(batch_size or 32).map(audit).filter(lambda x, y: tf.shape(x)[0] > 0)
        if batch_size is None:
            ds = ds.unbatch()
    if label_mode is None:
        ds = ds.map(lambda x, y: x)
    elif label_mode == "categorical":
        ds = ds.map(lambda x, y: (x, tf.one_hot(y, num_classes)))
    elif label_mode == "binary":
        ds = ds.map(lambda x, y: (x, tf.expand_dims(tf.cast(y, "float32"), -1)))
    if known_size:
        size = len(loader) if batch_size else loader.num_files
        ds = ds.apply(tf.data.experimental.assert_cardinality(size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds._dali_loader = loader  # keeps the pipeline alive with the dataset
    return ds
