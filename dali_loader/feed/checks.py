"""Cheap checks on encoded image bytes, before they reach the decoder.

One corrupt image kills a whole DALI pipeline, so the read stage looks at each
file first: a content sniff (like `tf.io.decode_image`, the extension does not
matter), and for PNG a walk over every chunk with its CRC. This catches empty,
truncated, non-image and bit-flipped files at the cost of a crc32 pass. GIFs,
which DALI cannot decode, are converted to an uncompressed PNG of their first
frame (what `tf.io.decode_image(..., expand_animations=False)` returns).
"""

from __future__ import annotations

import io
import struct
import zlib

from dali_loader.errors import CorruptImageError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}


def sniff(data: bytes) -> str | None:
    """Returns "png", "jpeg", "gif", "bmp", or None for unknown content."""
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    return None


def check_png(data: bytes) -> str | None:
    """Walks the PNG chunks; returns what is wrong, or None if it looks sound."""
    pos, seen_idat, n = len(PNG_SIGNATURE), False, len(data)
    first = True
    while True:
        if pos + 8 > n:
            return "truncated (no IEND chunk)"
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 12 + length
        if length > 0x7FFFFFFF or end > n:
            return f"truncated inside the {ctype!r} chunk"
        crc = struct.unpack(">I", data[end - 4 : end])[0]
        if zlib.crc32(data[pos + 4 : end - 4]) != crc:
            return f"CRC mismatch in the {ctype.decode('latin-1')!r} chunk"
        if first:
            if ctype != b"IHDR" or length != 13:
                return "the first chunk is not IHDR"
            w, h, depth, color, comp, filt, inter = struct.unpack(
                ">IIBBBBB", data[pos + 8 : pos + 21]
            )
            if w == 0 or h == 0:
                return f"zero image size {w}x{h}"
            if color not in _PNG_DEPTHS:
                return f"invalid colour type {color}"
            if depth not in _PNG_DEPTHS[color]:
                return f"invalid bit depth {depth} for colour type {color}"
            if comp or filt or inter > 1:
                return "invalid compression, filter or interlace method"
            first = False
        elif ctype == b"IDAT":
            seen_idat = True
        elif ctype == b"IEND":
            return None if seen_idat else "no IDAT chunk"
        pos = end


def gif_to_png(data: bytes) -> bytes:
    """Re-encodes the first frame of a GIF as an uncompressed RGB PNG."""
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow ships with the project
        raise ImportError(
            "Decoding GIF files needs Pillow: pip install pillow"
        ) from e
    with Image.open(io.BytesIO(data)) as im:
        im.seek(0)
        out = io.BytesIO()
        im.convert("RGB").save(out, format="PNG", compress_level=0)
    return out.getvalue()


def _png_needs_rgba_help(data: bytes) -> bool:
    """True for PNGs whose alpha DALI's any-channel decode drops or rejects.

    Grey+alpha (colour type 4), palette and grey images, and any image with a
    tRNS chunk: their alpha comes from libpng's expansion, which Pillow repeats.
    """
    color = data[25]
    return color in (0, 3, 4) or b"tRNS" in data[: data.find(b"IDAT")]


def to_rgba_png(data: bytes) -> bytes:
    """Re-encodes an image as an uncompressed 8-bit RGBA PNG with Pillow."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        out = io.BytesIO()
        im.convert("RGBA").save(out, format="PNG", compress_level=0)
    return out.getvalue()


def prepare(data: bytes, path: str, rgba: bool = False) -> bytes:
    """Checks encoded bytes and returns what the decoder should get.

    Args:
        data: The file's bytes.
        path: The file's name, for error messages.
        rgba: The caller wants 4 channels (alpha expanded like libpng does).

    Raises:
        CorruptImageError: naming `path`, when the bytes are not a sound image.
    """
    if not data:
        raise CorruptImageError(path, "the file is empty")
    kind = sniff(data)
    if kind is None:
        raise CorruptImageError(
            path, "not a JPEG, PNG, GIF or BMP image (unknown file signature)"
        )
    if kind == "png":
        problem = check_png(data)
        if problem:
            raise CorruptImageError(path, problem)
        if rgba and _png_needs_rgba_help(data):
            return to_rgba_png(data)
    elif kind == "jpeg" and len(data) < 128:
        raise CorruptImageError(path, "truncated JPEG")
    elif kind == "gif":
        try:
            return gif_to_png(data)
        except (OSError, ValueError, SyntaxError) as e:
            raise CorruptImageError(path, f"bad GIF ({e})") from None
    return data
