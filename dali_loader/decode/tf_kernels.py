"""TensorFlow's own kernels, as Keras's loader uses them: bit-identical decode and resize.

On a CPU-only machine these beat DALI's CPU decode and resize (README, "Why TF
kernels on the CPU"). TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import re

from dali_loader.decode.ready_forms import RAW_HEADER
from dali_loader.errors import CorruptImageError


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


def decode_like_keras(data, spec, tf):
    """Decodes one encoded image tensor the way Keras's loader decodes a file.

    Args:
        data: A scalar tf.string with the file's bytes.
        spec: The `dali_loader.decode.spec.ImageSpec` to produce.
        tf: The tensorflow module.

    Returns:
        The image tensor, shaped like Keras's (HWC, or CHW for channels_first).
    """
    img = tf.image.decode_image(data, channels=spec.channels, expand_animations=False)
    return resize_like_keras(img, spec, tf)


def raw_pixels(data, tf):
    """The HxWxC uint8 pixels of a `ready_forms.ReadyForm.RAW` entry (a scalar
    tf.string): the header's shape, the rest reshaped (no decode)."""
    flat = tf.io.decode_raw(data, tf.uint8)
    shape = tf.bitcast(tf.reshape(flat[4:RAW_HEADER], (3, 4)), tf.uint32)
    return tf.reshape(flat[RAW_HEADER:], tf.cast(shape, tf.int32))


def decode_ready_like_keras(data, spec, tf):
    """`decode_like_keras` for a `RAW` entry of the GPU-ready cache: the same
    resize on the same pixels, so the same output."""
    img = raw_pixels(data, tf)
    img.set_shape((None, None, spec.channels))
    return resize_like_keras(img, spec, tf)


def pixels_like_keras(data: bytes, path: str, channels: int, tf):
    """Decodes one file eagerly to the HxWxC uint8 pixels Keras's loader decodes
    (before resizing), as numpy.

    Raises:
        CorruptImageError: naming `path`, when TensorFlow's decoder rejects it.
    """
    try:
        img = tf.image.decode_image(data, channels=channels, expand_animations=False)
    except (tf.errors.OpError, ValueError) as e:
        detail = str(getattr(e, "message", e)).strip().splitlines()[0]
        detail = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]", "", detail)[:200]
        raise CorruptImageError(path, f"TensorFlow's decoder failed on it ({detail})") from None
    return img.numpy()


def resize_like_keras(img, spec, tf):
    """Keras's resize (stretch, `crop_to_aspect_ratio` or `pad_to_aspect_ratio`)
    and layout of decoded HxWxC pixels."""
    size = (spec.height, spec.width)
    data_format = "channels_first" if spec.channels_first else "channels_last"
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
