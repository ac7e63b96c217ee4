"""Host-side PNG parse: what the batched decoder needs from one file, or why it cannot take it.

The decoder covers 8-bit, non-interlaced PNGs of every colour type. `parse_png`
reads the chunks (every chunk's CRC checked, as libpng does), and returns a
`PngLayout` (IHDR, palette with tRNS alpha, tRNS key, the IDAT payload as raw
Deflate without the zlib wrapper, the stream's Adler-32 and the inflated size
IHDR implies) or a `Fallback` that says why the file goes to the CPU decoder.

A `Fallback` is not an error: the CPU decoder (libpng, as Keras) decides whether
the file is sound. Everything here is numpy-free and cheap (one pass over the
chunks, `zlib.crc32` per chunk).
"""

from __future__ import annotations

import dataclasses
import struct

from dali_loader.formats import png
from dali_loader.formats.png import GREY, PALETTE, RGB, SIGNATURE, Fallback

# Bytes per pixel in the filtered stream, per PNG colour type (8-bit samples).
SAMPLES = png.SAMPLES
# libpng's RGB -> grey conversion goes through gamma tables when the file's gamma
# is significant (`formats.png.gamma_significant`); such files go to the CPU in
# grayscale mode. (cHRM would set the grey weights, but TF sets them itself.)


@dataclasses.dataclass(frozen=True)
class PngLayout:
    """One covered PNG, as the batched decoder uses it.

    Attributes:
        width, height: IHDR's size.
        color_type: PNG colour type (0, 2, 3, 4 or 6).
        palette: RGBA palette, 256 x 4 bytes (alpha from tRNS, else 255), for
            colour type 3; else None.
        num_palette: PLTE's entries (indices at or above it are out of range).
        trns_key: the tRNS colour key (grey: one value; RGB: three), or None.
        deflate: the IDAT payload without the zlib header and Adler-32.
        adler32: the Adler-32 stored at the end of the zlib stream.
        gamma_significant: whether an sRGB or iCCP chunk, or a gAMA chunk more
            than 5% from 1.0, is present.
    """

    width: int
    height: int
    color_type: int
    palette: bytes | None
    num_palette: int
    trns_key: tuple[int, ...] | None
    deflate: memoryview
    adler32: int
    gamma_significant: bool

    @property
    def bpp(self) -> int:
        """Bytes per pixel of the filtered stream."""
        return SAMPLES[self.color_type]

    @property
    def stride(self) -> int:
        """Bytes per filtered row: the filter-type byte, then the pixels."""
        return 1 + self.width * self.bpp

    @property
    def inflated_size(self) -> int:
        """The size the zlib stream must inflate to (IHDR's rows)."""
        return self.height * self.stride


def _chunks(data: bytes):
    """(type, payload, position) of every chunk, each CRC checked; raises
    ValueError on a broken chunk."""
    n = len(data)
    try:
        for pos, length, ctype, end in png.chunks(data):
            if not png.crc_ok(data, pos, end):
                raise ValueError(f"CRC error in chunk {ctype!r}")
            yield ctype, png.body(data, pos, end), pos
            if ctype == b"IEND":
                return
    except png.ChunkError as e:
        if e.pos + 12 > n:
            raise ValueError("truncated chunk") from None
        raise ValueError(f"chunk {e.type!r} runs past the end of the file") from None
    raise ValueError("no IEND chunk")


def _zlib_payload(idat: bytes) -> tuple[memoryview, int] | str:
    """The raw Deflate data and stored Adler-32 of a zlib stream, or why not."""
    if len(idat) < 7:
        return "IDAT data too short for a zlib stream"
    cmf, flg = idat[0], idat[1]
    if cmf & 0x0F != 8 or cmf >> 4 > 7 or (cmf * 256 + flg) % 31 or flg & 0x20:
        return "unusual zlib header"
    return memoryview(idat)[2:-4], struct.unpack_from(">I", idat, len(idat) - 4)[0]


def parse_png(data: bytes) -> PngLayout | Fallback:
    """The layout of a PNG the batched decoder covers, or a `Fallback` naming why not."""
    if not data.startswith(SIGNATURE):
        return Fallback("not a PNG signature")
    ihdr = plte = trns = None
    idat: list[memoryview] = []
    gamma_significant = False
    idat_done = False
    try:
        for ctype, body, pos in _chunks(data):
            if ihdr is None and ctype != b"IHDR":
                return Fallback("first chunk is not IHDR")
            if ctype == b"IHDR":
                if ihdr is not None or len(body) != 13:
                    return Fallback("bad IHDR")
                ihdr = png.unpack_ihdr(body)
            elif ctype == b"IDAT":
                if idat_done:
                    return Fallback("IDAT chunks not consecutive")
                idat.append(body)
            elif idat:
                idat_done = True
            if ctype in (b"PLTE", b"tRNS") and idat:
                return Fallback(f"{ctype.decode()} after IDAT")
            if ctype == b"PLTE":
                if plte is not None or not ihdr[3] & 2:
                    return Fallback("two PLTE chunks, or PLTE in a grey PNG")
                plte = bytes(body)
            elif ctype == b"tRNS":
                if trns is not None:
                    return Fallback("two tRNS chunks")
                trns = bytes(body)
            elif png.gamma_significant(data, pos, len(body), ctype):
                gamma_significant = True
            elif ctype[0] < 97 and ctype not in png.CRITICAL:  # upper case: critical
                return Fallback(f"unknown critical chunk {ctype!r}")
    except ValueError as e:
        return Fallback(str(e))
    width, height, depth, ctype_, comp, filt, interlace = ihdr
    if ctype_ not in SAMPLES:
        return Fallback(f"colour type {ctype_}")
    if depth != 8:
        return Fallback(f"bit depth {depth}")
    if interlace:
        return Fallback("interlaced (Adam7)")
    if comp or filt or not 0 < width < 2**31 or not 0 < height < 2**31:
        return Fallback("unusual IHDR")
    if not idat:
        return Fallback("no IDAT chunk")
    payload = _zlib_payload(b"".join(idat))
    if isinstance(payload, str):
        return Fallback(payload)
    deflate, adler = payload
    palette, num_palette, key = None, 0, None
    if ctype_ == PALETTE:
        if plte is None or not plte or len(plte) % 3 or len(plte) > 768:
            return Fallback("missing or bad PLTE")
        num_palette = len(plte) // 3
        if trns is not None and len(trns) > num_palette:
            return Fallback("tRNS longer than PLTE")
        rgba = bytearray(b"\x00\x00\x00\xff" * 256)
        for i in range(num_palette):
            rgba[4 * i:4 * i + 3] = plte[3 * i:3 * i + 3]
        for i, a in enumerate(trns or b""):
            rgba[4 * i + 3] = a
        palette = bytes(rgba)
    elif trns is not None:
        want = {GREY: 2, RGB: 6}.get(ctype_)
        if want is None or len(trns) != want:
            return Fallback("tRNS with an alpha channel or of a bad length")
        key = struct.unpack(f">{want // 2}H", trns)
        if max(key) > 255:
            return Fallback("tRNS key out of 8-bit range")
    return PngLayout(width, height, ctype_, palette, num_palette, key, deflate, adler,
                     gamma_significant)
