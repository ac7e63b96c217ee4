"""Decode + resize with TensorFlow's own kernels, exactly as Keras does.

The CPU path of `image_dataset_from_directory`. On a CPU-only machine DALI's
CPU PNG decoder is no faster than TensorFlow's and its CPU resize costs about
twice as much (see README, "Why TF kernels on the CPU"), so there the loader
keeps its own I/O (read-ahead, gs:// cache, byte checks) and decodes with the
ops of Keras's `_load_image_tf`: bit-identical to Keras, for every option.
"""

from __future__ import annotations

import collections
import struct
import zlib

import numpy as np

from dali_loader.validate import CorruptImageError


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG: the end-of-epoch marker that rides through decode."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


END_MARKER = _tiny_png()


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

        A read-stage error (`on_error="raise"`) is held and raised by `check`
        at the marker: raised here, `ignore_errors()` would swallow it.
        """
        self.emitted.clear()
        self.error = None
        try:
            for data, labels, positions in self.loader:
                self.emitted.extend(positions)
                labels = np.zeros(len(data), np.int32) if labels is None else labels
                yield data, labels, np.asarray(positions, np.int64)
        except CorruptImageError as e:
            self.error = e
        self.emitted.append(-1)
        yield [END_MARKER], np.zeros(1, np.int32), np.asarray([-1], np.int64)

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
