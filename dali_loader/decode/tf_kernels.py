"""TensorFlow's own kernels, as Keras's loader uses them: bit-identical decode and resize.

On a CPU-only machine these beat DALI's CPU decode and resize (docs/benchmarks.md, "Why TF
kernels on the CPU"). TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import re

import numpy as np

from dali_loader.formats.ready import RAW_HEADER
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


def decode_like_keras(data, spec, tf, native_png: bool = False):
    """Decodes one encoded image tensor the way Keras's loader decodes a file.

    Args:
        data: A scalar tf.string with the file's bytes.
        spec: The `dali_loader.decode.spec.ImageSpec` to produce.
        tf: The tensorflow module.
        native_png: Decode PNGs with the native core's TF op (`tf_png`; the same
            pixels, TF's decoder for every file it leaves). It must be loaded.

    Returns:
        The image tensor, shaped like Keras's (HWC, or CHW for channels_first).
    """
    if native_png:
        from dali_loader.decode.tf_png import decode_image_like_keras

        img = decode_image_like_keras(data, spec.channels, tf)
    else:
        img = tf.image.decode_image(data, channels=spec.channels, expand_animations=False)
    return resize_like_keras(img, spec, tf)


def labels_like_keras(tf, label_mode: str | None, num_classes: int, x, y):
    """`(x, y)` with int labels `y` as Keras's `label_mode` gives them (x alone for None)."""
    if label_mode is None:
        return x
    if label_mode == "categorical":
        return x, tf.one_hot(y, num_classes)
    if label_mode == "binary":
        return x, tf.expand_dims(tf.cast(y, "float32"), -1)
    return x, y


def raw_pixels(data, tf):
    """The HxWxC uint8 pixels of a `formats.ready.ReadyForm.RAW` entry (a scalar
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
        raise CorruptImageError(path, f"TensorFlow's decoder failed on it ({_op_detail(e)})") from None
    return np.asarray(img)  # a read-only view: `.numpy()` would copy the pixels


def _op_detail(e: Exception) -> str:
    """An op error's first line, without TF's node and op decorations."""
    detail = str(getattr(e, "message", e)).strip().splitlines()[0]
    return re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]|\s*name:\s*$", "", detail)[:200]


def resize_problem(pixels: np.ndarray, spec, tf) -> str | None:
    """Why Keras's resize (`resize_like_keras`) of decoded HxWxC `pixels` to
    `spec` fails, run eagerly, or None when it does not."""
    try:
        resize_like_keras(tf.constant(pixels), spec, tf)
    except (tf.errors.OpError, ValueError) as e:
        how = ("crop_to_aspect_ratio" if spec.crop_to_aspect_ratio else
               "pad_to_aspect_ratio" if spec.pad_to_aspect_ratio else "stretch")
        h, w = pixels.shape[:2]
        return (f"TensorFlow's resize of its {h}x{w} pixels to {spec.height}x{spec.width} "
                f"({how}, {spec.interpolation}) failed ({_op_detail(e)})")
    return None


def resize_like_keras(img, spec, tf):
    """Keras's resize (stretch, `crop_to_aspect_ratio` or `pad_to_aspect_ratio`)
    and layout of decoded HxWxC pixels, or of a batch of same-size ones
    (BxHxWxC: the same ops on a 4-D tensor, image by image the same output)."""
    size = (spec.height, spec.width)
    data_format = "channels_first" if spec.channels_first else "channels_last"
    batched = img.shape.rank == 4
    to_chw = (0, 3, 1, 2) if batched else (2, 0, 1)
    if spec.crop_to_aspect_ratio:
        if spec.channels_first:
            img = tf.transpose(img, to_chw)
        img = _smart_resize(img, size, spec.interpolation, data_format)
    elif spec.pad_to_aspect_ratio:
        img = tf.image.resize_with_pad(img, size[0], size[1], method=spec.interpolation)
        if spec.channels_first:
            img = tf.transpose(img, to_chw)
    else:
        img = tf.image.resize(img, size, method=spec.interpolation)
        if spec.channels_first:
            img = tf.transpose(img, to_chw)
    img.set_shape(((None,) if batched else ()) + tuple(spec.shape))
    return img


def resize_ready_batch(flat, shapes, offsets, spec, tf):
    """A batch of raw pixels resized like Keras: `flat` (1-D uint8) holds each
    image's HxWxC pixels from its `offsets` entry on (N int64), `shapes` (Nx3
    int32) their shapes. Same-size images (the common case), back to back, are
    resized as one BxHxWxC tensor; otherwise image by image. Nothing is decoded."""
    n = tf.shape(shapes)[0]
    dtype = tf.uint8 if spec.output_uint8 else tf.float32

    def uniform():
        img = tf.reshape(flat, tf.concat([[n], shapes[0]], 0))
        img.set_shape((None, None, None, spec.channels))
        return tf.cast(resize_like_keras(img, spec, tf), dtype)

    def ragged():
        starts = offsets
        ends = offsets + tf.reduce_prod(tf.cast(shapes, tf.int64), axis=1)

        def one(i):
            img = tf.reshape(flat[starts[i]:ends[i]], shapes[i])
            img.set_shape((None, None, spec.channels))
            return tf.cast(resize_like_keras(img, spec, tf), dtype)

        return tf.map_fn(one, tf.range(n), fn_output_signature=tf.TensorSpec(spec.shape, dtype))

    same = tf.reduce_all(tf.equal(shapes, shapes[:1]))
    out = tf.cond(same, uniform, ragged)
    out.set_shape((None, *spec.shape))
    return out


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
