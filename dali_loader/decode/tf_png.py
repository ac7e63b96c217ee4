"""The native PNG core as a TF op (`native/tf_png_op.cc`), in TF's graph.

`decode_image_like_keras(data, channels, tf)` stands where Keras's loader calls
`tf.image.decode_image`: the op decodes the PNGs the core takes (exactly
`tf.io.decode_png`'s pixels), on whichever thread runs it (tf.data's), with no
Python per image; every other file (not a PNG, a PNG the core leaves to libpng,
a corrupt one) goes to `tf.image.decode_image` in the same graph, behind a
branch (`tf_internals.either`: TF's Switch and Merge, no function per branch to
instantiate for every iterator), so it gets TF's own outcome and TF's own error.

The op library (`native/_build/dl_tf_png.so`, built against the installed TF by
`pip install --no-build-isolation`, or in a checkout by
`python -m dali_loader.native.build_tf`, part of `make install`) is loaded on
first use; a build for the running TF's version (`_build/tf-<version>/dl_tf_png.so`,
`build_tf --per-version`) first where there is one. `available()` says whether it loads
here.
"""

from __future__ import annotations

import logging
import threading

from dali_loader.formats import compact
from dali_loader.formats.limits import CORE_MAX_PIXELS, ENTRY_MAX_PIXELS
from dali_loader.tf_internals import either
from dali_loader.native import BUILD_DIR, build_hint

logger = logging.getLogger(__name__)

OP_LIBRARY = BUILD_DIR / "dl_tf_png.so"
BUILD_STEP = build_hint("build_tf")
# Above this many pixels the op leaves a PNG to TF's decoder before sizing any
# allocation from its header (TF decodes it, or refuses it as Keras would): the
# core's envelope (why: formats.limits; the op's attribute default is the same).
OP_MAX_PIXELS = CORE_MAX_PIXELS

_lock = threading.Lock()
_ops = None
_error: str | None = None


def op_library(tf_version: str):
    """The op library for TF `tf_version`: its own build where there is one (a second TF
    beside the main build: `make test-tf-floor`), else `OP_LIBRARY`."""
    versioned = OP_LIBRARY.parent / f"tf-{tf_version}" / OP_LIBRARY.name
    return versioned if versioned.exists() else OP_LIBRARY


def _load():
    """The loaded op module, or None (the reason in `_error`)."""
    global _ops, _error
    with _lock:
        if _ops is None and _error is None:
            from dali_loader.lazy import import_tf

            tf = import_tf()
            library = op_library(tf.__version__)
            if not library.exists():
                _error = f"{library} is not built"
            else:
                try:
                    _ops = tf.load_op_library(str(library))
                except (tf.errors.NotFoundError, OSError) as e:  # a stale build, a missing core
                    _error = f"{library} does not load ({str(e).strip()[:300]})"
            if _error is not None:
                logger.debug("The native PNG decoder's TF op: %s", _error)
    return _ops


def available() -> bool:
    """Whether the op is built and loads in this process (loads TF and the op)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why `available()` is False (None when it is True)."""
    return None if _load() is not None else _error


def require():
    """The op module; ImportError naming the build step when it is not built."""
    ops = _load()
    if ops is None:
        raise ImportError(f"The native PNG decoder's TF op is not available: {_error}. "
                          f"Build it with: {BUILD_STEP}.")
    return ops


def decode_png(data, channels: int, max_pixels: int = OP_MAX_PIXELS):
    """The raw op: `(image uint8 [H, W, channels], ok bool)`; not ok: an empty
    [0, 0, channels] image, the file left to TF's decoder."""
    return require().dali_loader_decode_png(data, channels=channels, max_pixels=max_pixels)


def decode_image_like_keras(data, channels: int, tf):
    """`tf.image.decode_image(data, channels=channels, expand_animations=False)`,
    PNGs by the native core: the same pixels, shape [H, W, channels] uint8, and
    for every file the core leaves, TF's own decoder (its outcome, its error).

    Args:
        data: A scalar tf.string with the file's bytes.
        channels: 1, 3 or 4.
        tf: The tensorflow module.
    """
    img, ok = decode_png(data, channels)

    def libpng(_, d):
        return tf.image.decode_image(d, channels=channels, expand_animations=False)

    if tf.executing_eagerly():  # Switch and Merge are graph ops
        return img if bool(ok) else libpng(img, data)
    out = either(tf, ok, lambda i, _: i, libpng, img, data)
    out.set_shape((None, None, channels))
    return out


def decode_entries(entries, bounds, offsets, shapes, total, channels: int = 3,
                   max_pixels: int = ENTRY_MAX_PIXELS, spread=1):
    """The op library's `DaliLoaderDecodeEntries`: a batch of GPU-ready cache items,
    item i being `entries[bounds[i]:bounds[i+1]]`, decoded by the native core into one
    flat uint8 [total] tensor, image i at `offsets[i]` with shape `shapes[i]`: a
    compact entry (`formats.compact`) decoded, a raw one (`formats.ready`) copied, a
    PNG (a fill) decoded to `channels` exactly as `tf.io.decode_png` and written as a
    compact entry in the form `formats.compact` writes (filter, level, chunk size).
    Returns `(pixels, ok, filled, filled_at, filled_size)`: ok[i] False where the core
    refused item i (its pixels then zeros, for the caller to replace); the new entry of
    a PNG is `filled[filled_at[i]:filled_at[i] + filled_size[i]]` (size 0 for every
    other item): one flat buffer in TF's pooled memory, viewed without a copy; the
    bytes between entries are never written (read only the entries).
    `spread` > 1: the batch's items are split over that many of TF's intra-op threads
    whatever tf.data's per-thread limit (one, by default): for a batch that runs alone,
    an epoch's last."""
    return require().dali_loader_decode_entries(
        entries, bounds, offsets, shapes, total, spread, max_pixels=max_pixels, channels=channels,
        filter=compact.FILTER, level=compact.LEVEL, chunk_bytes=compact.CHUNK_BYTES)
