"""The fast CPU PNG decoder: Wuffs, with exactly TensorFlow's outcome for every file it takes.

`decode_png(data, channels)` returns the HxWxC uint8 pixels that
`tf.io.decode_png(data, channels=C)` (libpng) returns, bit for bit, or a `Fallback`
saying why the file goes to TensorFlow's decoder instead. It never returns pixels
for a file TF rejects: every chunk's structure and every non-IDAT chunk's CRC is
checked here (IHDR first, IEND last, only chunks libpng reads the same way), and
Wuffs runs with its checksums on (IDAT CRC-32s and the zlib stream's Adler-32,
which Wuffs' PNG decoder ignores by default); a file Wuffs rejects goes to TF as
well, so a corrupt file is always TF's to name. The rules that make Wuffs' pixels
TF's (each checked in tests/test_png_cpu.py on PngSuite and a mutation corpus):

- RGB from a file with alpha drops the alpha (Wuffs' RGB output composites onto
  black): decode RGBA, keep three channels.
- RGBA from a 1/2/4-bit grey or palette file without tRNS: TF's alpha is
  `(1 << bitdepth) - 1`, not 255 (libpng adds the filler before scaling).
- Grey from colour: libpng's no-gamma weights, `(9797 R + 19234 G + 3737 B) >> 15`;
  a file whose gamma libpng would apply (gAMA more than 5% from 1.0, sRGB, iCCP)
  or a 16-bit colour file goes to TF.
- 16-bit samples keep their high byte (libpng's `png_set_strip_16`), as Wuffs does.
- tRNS: the cases Wuffs and libpng expand alike are taken (tests), the rest go to TF.

Wuffs (`pywuffs`, https://github.com/google/wuffs) releases the GIL while it
decodes, so the callers run it on as many threads as there are cores. Its decoder
objects are not thread-safe: one per thread and pixel format.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np

from dali_loader.formats import png
from dali_loader.formats.limits import CORE_MAX_PIXELS, WUFFS_SIDE_LIMIT
from dali_loader.formats.png import (  # noqa: F401 - re-exported: png_cpu.SIGNATURE, .Fallback
    GREY,
    GREY_ALPHA,
    PALETTE,
    RGB,
    RGBA,
    SIGNATURE,
    Fallback,
)

logger = logging.getLogger(__name__)

# Chunks libpng reads the same way whatever Wuffs does with them; any other
# chunk (an unknown one, APNG's acTL/fcTL/fdAT) sends the file to TF.
_ANCILLARY = frozenset((b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"sBIT", b"bKGD", b"hIST",
                        b"pHYs", b"sPLT", b"tIME", b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"oFFs",
                        b"pCAL", b"sCAL", b"sTER"))
# Bigger images go to TF (which decodes or refuses them as Keras would): the
# core's envelope (why: formats.limits).
MAX_PIXELS = CORE_MAX_PIXELS
_GREY_WEIGHTS = np.array([[9797], [19234], [3737]], np.float32)


@dataclasses.dataclass(frozen=True)
class PngHeader:
    """What the front end read from a PNG's chunks."""

    width: int
    height: int
    depth: int
    color_type: int
    trns: bool
    gamma_significant: bool


def read_header(data: bytes) -> PngHeader | Fallback:
    """Walks the chunks (`formats.png`): IHDR first, known chunks only, every
    non-IDAT CRC checked, IEND last with nothing but trailing bytes after it.
    IDAT CRCs are Wuffs' to check."""
    n = len(data)
    if n < 45 or not data.startswith(SIGNATURE):
        return Fallback("not a PNG, or too short")
    h = png.read_ihdr(data)
    if h is None:
        return Fallback("IHDR missing or damaged")
    width, height, depth, color, comp, filt, interlace = h
    if (depth not in png.DEPTHS.get(color, ()) or comp or filt or interlace > 1
            or not 0 < width < WUFFS_SIDE_LIMIT or not 0 < height < WUFFS_SIDE_LIMIT):
        return Fallback("IHDR out of range")
    if width * height > MAX_PIXELS:
        return Fallback(f"{width}x{height} is larger than the fast decoder takes")
    if interlace and height == 1:  # Wuffs stops reading the stream early: libpng decides
        return Fallback("an interlaced image one row high")
    trns = gamma = False
    seen_idat = idat_done = plte = False
    crc_ok = png.crc_ok
    try:
        for pos, length, kind, end in png.chunks(data, png.IHDR_END):
            if kind == b"IDAT":
                if idat_done:
                    return Fallback("IDAT chunks are not consecutive")
                seen_idat = True
                continue
            if seen_idat:
                idat_done = True
            if not crc_ok(data, pos, end):
                return Fallback(f"CRC mismatch in {kind!r}")
            if kind == b"IEND":
                return (PngHeader(width, height, depth, color, trns, gamma) if seen_idat
                        and length == 0 else Fallback("IEND misplaced"))
            if kind == b"PLTE":
                if plte or seen_idat or length % 3 or not 0 < length <= 768:
                    return Fallback("PLTE misplaced or malformed")
                plte = True
            elif kind in _ANCILLARY:
                if seen_idat:
                    return Fallback(f"{kind!r} after IDAT")
                if kind == b"tRNS":
                    trns = True
                else:
                    gamma = gamma or png.gamma_significant(data, pos, length, kind)
            else:
                return Fallback(f"chunk {kind!r} is left to libpng")
    except png.ChunkError as e:
        return Fallback("no IEND chunk" if e.pos + 12 > n else "a chunk runs past the end")
    return Fallback("no IEND chunk")


def plan(h: PngHeader, channels: int) -> tuple[str, int] | Fallback:
    """How to make TF's `channels` from this file: (Wuffs pixel format, post-step),
    or a Fallback. Post-steps: 0 as decoded, 1 keep RGB of RGBA, 2 grey from RGB(A),
    3 keep the first channel, 4 RGBA with TF's low-depth alpha."""
    colour = h.color_type in (RGB, RGBA, PALETTE)
    alpha = h.color_type in (GREY_ALPHA, RGBA) or h.trns
    if h.trns and h.color_type in (GREY, RGB):
        return Fallback("a tRNS colour key")
    if channels == 4:
        if h.depth < 8 and not h.trns:
            return ("RGB", 4)
        return ("RGBA_NONPREMUL", 0)
    if channels == 3:
        return ("RGBA_NONPREMUL", 1) if alpha else ("RGB", 0)
    if channels == 1:
        if not colour:
            return ("RGBA_NONPREMUL", 3) if alpha else ("RGB", 3)
        if h.gamma_significant or h.depth == 16:
            return Fallback("libpng converts this file to grey through gamma")
        return ("RGBA_NONPREMUL", 2) if alpha else ("RGB", 2)
    raise ValueError(f"`channels` must be 1, 3 or 4. Received: channels={channels}")


class _Decoders(threading.local):
    """One Wuffs decoder per thread and pixel format (they are not thread-safe)."""

    def __init__(self):
        self.by_format: dict[str, object] = {}


_local = _Decoders()


def _decoder(fmt: str):
    dec = _local.by_format.get(fmt)
    if dec is None:
        import pywuffs
        from pywuffs.aux import ImageDecoder, ImageDecoderConfig

        config = ImageDecoderConfig()
        config.enabled_decoders = [pywuffs.ImageDecoderType.PNG]
        # The aux API turns the PNG checksums off; TF's libpng checks them.
        config.quirks = {pywuffs.ImageDecoderQuirks.IGNORE_CHECKSUM: 0}
        config.pixel_format = getattr(pywuffs.PixelFormat, fmt)
        dec = _local.by_format[fmt] = ImageDecoder(config)
    return dec


def available() -> bool:
    """Whether Wuffs (`pywuffs`) can be imported."""
    try:
        import pywuffs.aux  # noqa: F401
    except ImportError:
        return False
    return True


def decode_png(data: bytes, channels: int) -> np.ndarray | Fallback:
    """TF's `decode_png(data, channels)` pixels (HxWxC uint8), or a `Fallback`."""
    h = read_header(data)
    if isinstance(h, Fallback):
        return h
    how = plan(h, channels)
    if isinstance(how, Fallback):
        return how
    fmt, step = how
    result = _decoder(fmt).decode(data)
    if result.error_message:
        return Fallback(f"Wuffs: {result.error_message}")
    px = result.pixbuf
    if px.shape[:2] != (h.height, h.width):
        return Fallback("Wuffs decoded another size")
    if step == 0:
        return px
    if step == 1:
        return np.ascontiguousarray(px[:, :, :3])
    if step == 3:
        return np.ascontiguousarray(px[:, :, :1])
    if step == 4:
        out = np.empty((h.height, h.width, 4), np.uint8)
        out[:, :, :3] = px
        out[:, :, 3] = (1 << h.depth) - 1
        return out
    return grey_from_rgb(px)


def grey_from_rgb(px: np.ndarray) -> np.ndarray:
    """libpng's `(9797 R + 19234 G + 3737 B) >> 15` of HxWx3(+) pixels, as HxWx1, in
    float32: every product and sum is an integer below 2**24, so exact; scaling by
    2**-15 and truncating is the shift."""
    grey = px[:, :, :3].astype(np.float32) @ _GREY_WEIGHTS
    grey *= 1 / 32768
    return grey.astype(np.uint8)
