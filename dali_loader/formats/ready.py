"""Lossless re-encodings of decoded pixels, for the GPU-ready cache.

The cache stores what Keras's decode gives (`tf.io.decode_image(...,
channels=C, expand_animations=False)`: HxWxC uint8, before any resize), in a
form that the decoder of the loader's path reads fastest:

- `ReadyForm.COMPACT` (`formats.compact`): the pixels row-delta filtered, in
  independent 64 KiB zstd frames, with the pixels' CRC-32. Decoded by the
  native core (a TF op on the TF path, a DALI operator on the DALI path):
  about the PNG's size, decoded in about a fifth of the PNG's native decode
  (docs/gpu_ready.md). The default form (`gpu_ready=True`).
- `ReadyForm.RAW`: a 16-byte header and the pixels, uncompressed. Nothing to
  decode: TF's kernels reshape it on the CPU path; on the DALI path DALI
  reshapes it, copies it to its device and resizes it there. Larger than the
  PNG (photos: about 1.7x). `gpu_ready="raw"`.

A TIFF form (Deflate strips, `gpu_ready="tiff"`) was retired in issue 38: 1.13x
the PNG's bytes against the compact form's 1.05x, and slower on an H200's GPU
than on its CPUs (docs/gpu_ready.md, "The TIFF form, retired").

Numpy (and the native core, through ctypes, for the compact form) only; no TF or
DALI here.
"""

from __future__ import annotations

import enum
import struct

import numpy as np


class ReadyForm(enum.Enum):
    """How a GPU-ready cache entry's pixels are encoded (a plan names it: `plan.Plan.cache_form`)."""

    RAW = "raw"
    COMPACT = "compact-up-zstd1"


RAW_MAGIC = b"DLRW"
RAW_HEADER = 16  # magic, then height, width, channels as little-endian uint32


def _as_hwc(pixels: np.ndarray) -> np.ndarray:
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4):
        raise ValueError(
            "Expected HxWxC uint8 pixels with C in (1, 3, 4). "
            f"Received: shape={pixels.shape}, dtype={pixels.dtype}"
        )
    return np.ascontiguousarray(pixels)


def encode_raw(pixels: np.ndarray) -> bytes:
    """`RAW_MAGIC`, height, width, channels (uint32 LE), then the pixels."""
    pixels = _as_hwc(pixels)
    return b"".join((raw_header(pixels.shape), pixels.data))  # one copy


def raw_header(shape: tuple[int, int, int]) -> bytes:
    """A raw entry's `RAW_HEADER` bytes for pixels of `shape` (height, width, channels)."""
    return RAW_MAGIC + struct.pack("<III", *shape)


def raw_shape(head) -> tuple[int, int, int]:
    """(height, width, channels) from a raw entry's first `RAW_HEADER` bytes."""
    if len(head) < RAW_HEADER or head[:4] != RAW_MAGIC:
        raise ValueError("Not a raw pixel entry (bad magic).")
    return struct.unpack_from("<III", head, 4)


def decode_raw(data: bytes) -> np.ndarray:
    """The pixels of `encode_raw`'s output (a view, no copy)."""
    h, w, c = raw_shape(data)
    if len(data) != RAW_HEADER + h * w * c:
        raise ValueError(f"Raw pixel entry of {len(data)} bytes does not hold {h}x{w}x{c} pixels.")
    return np.frombuffer(data, np.uint8, offset=RAW_HEADER).reshape(h, w, c)


def encode(pixels: np.ndarray, form: ReadyForm) -> bytes | memoryview:
    """`pixels` (HxWxC uint8) in `form`."""
    if form is ReadyForm.COMPACT:
        from dali_loader.formats import compact

        return compact.encode(_as_hwc(pixels))
    return encode_raw(pixels)


def encode_parts(pixels: np.ndarray, form: ReadyForm) -> list:
    """`encode(pixels, form)` as buffers to write one after the other: a raw
    entry's header and the pixels themselves (no copy of a large image)."""
    if form is not ReadyForm.RAW:
        return [encode(pixels, form)]
    pixels = _as_hwc(pixels)
    return [raw_header(pixels.shape), pixels]


def join_parts(parts: list) -> bytes | bytearray:
    """The entry `encode_parts` split, in one buffer (one copy)."""
    if len(parts) == 1:
        return parts[0]
    out = bytearray(sum(memoryview(p).nbytes for p in parts))
    at = 0
    for part in parts:
        view = memoryview(part).cast("B")
        out[at:at + len(view)] = view
        at += len(view)
    return out


def decode(data: bytes, form: ReadyForm) -> np.ndarray:
    """HxWxC uint8 pixels of an entry in `form` (numpy, or the native core for the
    compact form; for checks and tests)."""
    if form is ReadyForm.COMPACT:
        from dali_loader.formats import compact

        return compact.decode(data)
    return decode_raw(data)
