"""The CPU side of the batched PNG decoder: every `Fallback` decoded by TensorFlow
(libpng, as Keras), a corrupt file named under the caller's `on_error` policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from experimental.png_gpu.parse import Fallback
from dali_loader.decode.tf_kernels import pixels_like_keras
from dali_loader.errors import BadFileError
from dali_loader.lazy import import_tf


def finish(results: list, blobs: Sequence[bytes], paths: Sequence[str], channels: int,
           on_bad: Callable[[BadFileError], None]) -> list:
    """`results` with each `Fallback` replaced by TF's pixels (numpy), or by None
    for a file TF rejects after `on_bad(CorruptImageError)` returned (on_error="skip";
    with "raise", `on_bad` raises). Drop the Nones to leave those files out."""
    tf = None
    done = []
    for r, data, path in zip(results, blobs, paths):
        if isinstance(r, Fallback):
            tf = tf or import_tf()
            try:
                r = pixels_like_keras(data, path, channels, tf)
            except BadFileError as err:
                on_bad(err)
                r = None
        done.append(r)
    return done
