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
- `ReadyForm.TIFF`: TIFF, Adobe Deflate, horizontal predictor 2, strips of
  about 64 KB. DALI's decoder parses it on the CPU bit-exactly; on a GPU
  nvImageCodec's nvTIFF extension may inflate the strips with nvCOMP
  (unverified: nvTIFF documents predictor 2 for encoding only, and
  nvImageCodec falls back to libtiff on the CPU for a file nvTIFF refuses;
  see docs/gpu_ready.md). About the PNG's size. `gpu_ready="tiff"`, DALI only.

Numpy and tifffile (and the native core, through ctypes, for the compact form)
only; no TF or DALI here.
"""

from __future__ import annotations

import enum
import io
import struct
from typing import Any

import numpy as np


class ReadyForm(enum.Enum):
    """How a GPU-ready cache entry's pixels are encoded (a plan names it: `plan.Plan.cache_form`)."""

    TIFF = "tiff-deflate-pred2"
    RAW = "raw"
    COMPACT = "compact-up-zstd1"


RAW_MAGIC = b"DLRW"
RAW_HEADER = 16  # magic, then height, width, channels as little-endian uint32
STRIP_BYTES = 64 * 1024  # TIFF strip size: one independent Deflate stream each
TIFF_LEVEL = 1  # zlib level of the TIFF strips: 1.13x the PNG, fills ~40% faster than 6 (docs/gpu_ready.md)


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


def encode_tiff(pixels: np.ndarray, level: int = TIFF_LEVEL,
                strip_bytes: int = STRIP_BYTES) -> bytes:
    """TIFF with Adobe Deflate (`level`), predictor 2 and strips of about `strip_bytes`.

    Grey is MinIsBlack; RGBA is RGB with one unassociated alpha sample.
    """
    import tifffile

    pixels = _as_hwc(pixels)
    h, w, c = pixels.shape
    kw: dict[str, Any] = {}  # tifffile.imwrite's keyword arguments
    if c == 1:
        pixels, photometric = pixels[:, :, 0], "minisblack"
    else:
        photometric = "rgb"
        if c == 4:
            kw["extrasamples"] = ["unassalpha"]
    out = io.BytesIO()
    tifffile.imwrite(
        out, pixels, photometric=photometric, compression="adobe_deflate",
        compressionargs={"level": level}, predictor=True,
        rowsperstrip=max(1, strip_bytes // (w * c)), metadata=None, **kw,
    )
    return out.getvalue()


def decode_tiff(data: bytes) -> np.ndarray:
    """HxWxC pixels of a TIFF (tifffile; the reference the tests compare DALI with)."""
    import tifffile

    arr = tifffile.imread(io.BytesIO(data))
    return arr[:, :, None] if arr.ndim == 2 else arr


def encode(pixels: np.ndarray, form: ReadyForm) -> bytes | memoryview:
    """`pixels` (HxWxC uint8) in `form`."""
    if form is ReadyForm.COMPACT:
        from dali_loader.formats import compact

        return compact.encode(_as_hwc(pixels))
    return encode_tiff(pixels) if form is ReadyForm.TIFF else encode_raw(pixels)


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
    return decode_tiff(data) if form is ReadyForm.TIFF else decode_raw(data)
