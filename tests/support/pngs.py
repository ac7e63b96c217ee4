"""A small PNG encoder with a chosen filter type per row (numpy + zlib), for tests and
the PNG device check: 8-bit, non-interlaced, every colour type, optional tRNS.

Pillow and libpng pick filters themselves; this one lets a test cover None, Sub,
Up, Average and Paeth rows in one image, and lets the device check write
thousands of photo PNGs deterministically where only numpy is installed.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

COLOR_TYPES = {1: 0, 3: 2, 2: 4, 4: 6}  # channels -> PNG colour type (palette: see `encode_png`)


def chunk(ctype: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body, CRC."""
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def _paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def filter_rows(raw: np.ndarray, bpp: int, filters) -> bytes:
    """The filtered scanlines (filter byte + bytes) of `raw` (H x rowbytes uint8)."""
    h, n = raw.shape
    x = raw.astype(np.int32)
    out = np.empty((h, n + 1), np.uint8)
    zero = np.zeros(n, np.int32)
    for r in range(h):
        ft = int(filters[r % len(filters)])
        cur = x[r]
        up = x[r - 1] if r else zero
        left = np.concatenate([np.zeros(bpp, np.int32), cur[:-bpp]])
        diag = np.concatenate([np.zeros(bpp, np.int32), up[:-bpp]])
        pred = {0: zero, 1: left, 2: up, 3: (left + up) >> 1, 4: _paeth(left, up, diag)}[ft]
        out[r, 0] = ft
        out[r, 1:] = (cur - pred) & 0xFF
    return out.tobytes()


def encode_png(pixels: np.ndarray, filters=(0, 1, 2, 3, 4), *, palette: np.ndarray | None = None,
               trns: bytes | None = None, extra_chunks: bytes = b"", level: int = 6) -> bytes:
    """A PNG of `pixels` (HxWxC uint8, C in 1-4; with `palette` (N x 3), HxW indices),
    rows filtered with `filters` in turn."""
    if palette is not None:
        idx = np.asarray(pixels, np.uint8).reshape(pixels.shape[0], pixels.shape[1], 1)
        ct, raw, bpp = 3, idx, 1
    else:
        ct, raw, bpp = COLOR_TYPES[pixels.shape[2]], pixels, pixels.shape[2]
    h, w = raw.shape[:2]
    data = zlib.compress(filter_rows(raw.reshape(h, w * bpp), bpp, filters), level)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ct, 0, 0, 0))
    out += extra_chunks
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth, noisy, photo-like RGB image (compresses like a photo PNG)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([127 + 100 * np.sin(x / rng.uniform(5, 30) + rng.uniform(0, 6)),
                     127 + 100 * np.cos(y / rng.uniform(5, 30) + rng.uniform(0, 6)),
                     127 + 100 * np.sin((x + y) / rng.uniform(5, 30))], -1)
    base += rng.normal(0, 6, base.shape).astype(np.float32)
    return np.clip(base, 0, 255).astype(np.uint8)


def photo_png(filters, channels: int, h: int = 375, w: int = 500) -> bytes:
    """A photo-like PNG of `channels` (1-4: grey, grey+alpha, RGB, RGBA; alpha is noise)
    whose rows use `filters`, seeded by both: the exactness tests' "every filter type"."""
    rng = np.random.default_rng(len(filters) * 10 + channels)
    px = photo(rng, h, w)
    if channels == 4:
        px = np.concatenate([px, rng.integers(0, 256, (h, w, 1), dtype=np.uint8)], -1)
    elif channels in (1, 2):
        px = px[:, :, :channels]
    return encode_png(px, filters)


def replace_idat(png: bytes, idat: bytes) -> bytes:
    """`png` with its IDAT chunks replaced by one holding `idat` (CRC made valid)."""
    pos, head, tail, seen = 8, b"", b"", False
    while pos < len(png):
        n, ctype = struct.unpack_from(">I4s", png, pos)
        whole = png[pos:pos + 12 + n]
        if ctype == b"IDAT":
            seen = True
        elif seen:
            tail += whole
        else:
            head += whole
        pos += 12 + n
    return png[:8] + head + chunk(b"IDAT", idat) + tail


def idat_data(png: bytes) -> bytes:
    """The concatenated IDAT payload (the zlib stream) of `png`."""
    pos, data = 8, b""
    while pos < len(png):
        n, ctype = struct.unpack_from(">I4s", png, pos)
        if ctype == b"IDAT":
            data += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    return data


def broken_streams(rgb: np.ndarray) -> dict[str, bytes]:
    """CRC-valid PNGs of `rgb` whose zlib stream is wrong in ways only the checks after
    inflating can see: scrambled Deflate data, a wrong Adler-32, too few rows, a filter
    type of 7."""
    good = encode_png(rgb, (1, 4))
    z = idat_data(good)
    raw = zlib.decompress(z)
    scrambled = bytearray(z)
    mid = slice(4, len(z) - 6)
    scrambled[mid] = np.random.default_rng(0).permutation(
        np.frombuffer(z[mid], np.uint8)).tobytes()
    bad_filter = bytearray(raw)
    bad_filter[0] = 7
    return {
        "scrambled.png": replace_idat(good, bytes(scrambled)),
        "bad_adler.png": replace_idat(good, z[:-4] + struct.pack(">I", (zlib.adler32(raw) + 1)
                                                                   & 0xFFFFFFFF)),
        "short.png": replace_idat(good, zlib.compress(raw[:-11])),
        "bad_filter.png": replace_idat(good, zlib.compress(bytes(bad_filter))),
    }
