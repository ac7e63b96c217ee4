"""The one PNG chunk reader: signature, constants, IHDR, chunk iteration and CRC.

Reading only: what a walker accepts, which chunks it trusts and what it says
about a bad file is its own (`feed.checks.walk_png`: libpng's rules;
`decode.png_cpu.read_header`: the Wuffs front end's; `experimental/png_gpu/parse.py`,
outside the package: the GPU decoder's). `chunks` yields each whole chunk and raises `ChunkError`
where one is cut short; `crc_ok` checks one chunk's CRC (a large chunk is not copied).
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

SIGNATURE = b"\x89PNG\r\n\x1a\n"
GREY, RGB, PALETTE, GREY_ALPHA, RGBA = 0, 2, 3, 4, 6
# The bit depths each colour type allows (PNG spec, table 11.1).
DEPTHS = {GREY: (1, 2, 4, 8, 16), RGB: (8, 16), PALETTE: (1, 2, 4, 8),
          GREY_ALPHA: (8, 16), RGBA: (8, 16)}
SAMPLES = {GREY: 1, RGB: 3, PALETTE: 1, GREY_ALPHA: 2, RGBA: 4}  # samples per pixel
CRITICAL = (b"IHDR", b"PLTE", b"IDAT", b"IEND")  # the critical chunks the spec defines
MAX_LENGTH = 0x7FFFFFFF  # a chunk's length and an image's side: 31 bits (PNG spec)
IHDR_END = 33  # the signature (8) and the IHDR chunk (12 + 13): where the next chunk starts
# libpng applies a file's gamma when it is significant (png_gamma_significant: more
# than 5% from 1.0, gAMA in units of 1/100000); sRGB implies 1/2.2, iCCP may carry one.
GAMMA_ONE, GAMMA_SLACK = 100000, 5000
GAMMA_CHUNKS = (b"sRGB", b"iCCP")
_HEAD = struct.Struct(">I4s")  # a chunk's length and type
_U32 = struct.Struct(">I")


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A file a decoder leaves to another (TF's, or the CPU's), and why: not an error."""

    reason: str


class Ihdr(NamedTuple):
    """The fields of a PNG's IHDR chunk, as stored (unchecked)."""

    width: int
    height: int
    depth: int
    color_type: int
    compression: int
    filter: int
    interlace: int


class ChunkError(ValueError):
    """The chunk at `pos` is cut short: fewer than 8 bytes of it (`type` None),
    or its length runs past the end of the data."""

    def __init__(self, pos: int, ctype: bytes | None, length: int | None = None):
        super().__init__(f"A PNG chunk is cut short at byte {pos}. "
                         f"Received: type={ctype!r}, length={length}")
        self.pos = pos
        self.type = ctype


def unpack_ihdr(body) -> Ihdr:
    """The fields of an IHDR chunk's 13 bytes of data."""
    return Ihdr._make(_IHDR.unpack(body))


def ihdr(data) -> Ihdr:
    """The IHDR fields at their place in a PNG whose first chunk is an IHDR
    (`read_ihdr` checks that; a file a walker passed has it)."""
    return Ihdr._make(_IHDR.unpack_from(data, 16))


_IHDR_HEAD = b"\x00\x00\x00\x0dIHDR"  # the first chunk's length (13) and type
_IHDR = struct.Struct(">IIBBBBB")


def read_ihdr(data) -> Ihdr | None:
    """The IHDR of `data` when it starts with the signature and a 13-byte IHDR
    whose CRC holds; else None."""
    if (len(data) < IHDR_END or data[:8] != SIGNATURE or data[8:16] != _IHDR_HEAD
            or zlib.crc32(data[12:29]) != _U32.unpack_from(data, 29)[0]):
        return None
    return Ihdr._make(_IHDR.unpack_from(data, 16))


def size(data) -> tuple[int, int] | None:
    """(width, height) claimed by the IHDR of a PNG's first bytes, or None when
    they hold no IHDR (the signature is the caller's to check)."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return struct.unpack_from(">II", data, 16)


def ihdr_problem(h: Ihdr) -> str | None:
    """What libpng refuses in an IHDR (sizes, colour type, bit depth, methods), or None."""
    if h.width == 0 or h.height == 0:
        return f"zero image size {h.width}x{h.height}"
    if h.width > MAX_LENGTH or h.height > MAX_LENGTH:
        return f"invalid image size {h.width}x{h.height}"
    if h.color_type not in DEPTHS:
        return f"invalid colour type {h.color_type}"
    if h.depth not in DEPTHS[h.color_type]:
        return f"invalid bit depth {h.depth} for colour type {h.color_type}"
    if h.compression or h.filter or h.interlace > 1:
        return "invalid compression, filter or interlace method"
    return None


def chunks(data, pos: int = 8) -> Iterator[tuple[int, int, bytes, int]]:
    """Each whole chunk from `pos` on (after the signature by default), in order,
    until the data ends; past IEND too (stopping is the walker's). Checks no CRC.
    Yields (pos, length, type, end): the chunk's length field at `pos`, its CRC
    ending at `end`.

    Raises:
        ChunkError: where a chunk is cut short (fewer than 8 bytes left, or a
            length past the end of `data`).
    """
    n = len(data)
    unpack = _HEAD.unpack_from
    while pos < n:
        if pos + 8 > n:
            raise ChunkError(pos, None)
        length, ctype = unpack(data, pos)
        end = pos + 12 + length
        if length > MAX_LENGTH or end > n:
            raise ChunkError(pos, ctype, length)
        yield pos, length, ctype, end
        pos = end


def critical(ctype: bytes) -> bool:
    """Whether a chunk type is critical (its first letter is upper case)."""
    return not ctype[0] & 0x20


def body(data, pos: int, end: int) -> memoryview:
    """The data of the chunk at `pos` to `end`, without a copy."""
    return memoryview(data)[pos + 8:end - 4]


def crc_ok(data, pos: int, end: int) -> bool:
    """Whether the stored CRC of the chunk at `pos` to `end` is that of its type
    and data (no copy)."""
    # A small chunk's bytes are copied (cheaper than a view); a large one's are not.
    covered = data[pos + 4:end - 4] if end - pos <= 4096 else memoryview(data)[pos + 4:end - 4]
    return zlib.crc32(covered) == _U32.unpack_from(data, end - 4)[0]


def gamma_significant(data, pos: int, length: int, ctype: bytes) -> bool:
    """Whether the chunk makes libpng apply a gamma: sRGB, iCCP, or a gAMA more
    than 5% from 1.0 (or not 4 bytes long)."""
    if ctype in GAMMA_CHUNKS:
        return True
    if ctype != b"gAMA":
        return False
    return length != 4 or abs(_U32.unpack_from(data, pos + 8)[0] - GAMMA_ONE) > GAMMA_SLACK


def first(data, ctype: bytes) -> memoryview | None:
    """The data of the first `ctype` chunk before IDAT, or None (for a file a walker passed)."""
    try:
        for pos, _, kind, end in chunks(data):
            if kind == ctype:
                return body(data, pos, end)
            if kind in (b"IDAT", b"IEND"):
                return None
    except ChunkError:
        pass
    return None


def idat(data) -> list[memoryview]:
    """The data of every IDAT chunk before IEND, in order (for a file a walker passed)."""
    out = []
    try:
        for pos, _, kind, end in chunks(data):
            if kind == b"IDAT":
                out.append(body(data, pos, end))
            elif kind == b"IEND":
                break
    except ChunkError:
        pass
    return out
