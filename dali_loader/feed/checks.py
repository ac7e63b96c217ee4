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


def _png_chunk(data: bytes, ctype: bytes) -> bytes | None:
    """The payload of the first `ctype` chunk before IDAT (chunks already CRC-checked)."""
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == ctype:
            return data[pos + 8 : pos + 8 + length]
        if kind in (b"IDAT", b"IEND"):
            return None
        pos += 12 + length
    return None


def _png_needs_rgba_help(data: bytes) -> bool:
    """True for PNGs whose RGBA DALI's any-channel decode does not give like TF.

    Grey, grey+alpha and palette images, any image with a tRNS chunk (DALI drops
    or rejects that alpha) and 16-bit images (DALI rounds to 8 bits, libpng as TF
    calls it keeps the high byte).
    """
    depth, color = data[24], data[25]
    return color in (0, 3, 4) or depth == 16 or _png_chunk(data, b"tRNS") is not None


def _rgb16_low_bytes(data: bytes):
    """The low bytes of a 16-bit RGB PNG's samples (Pillow keeps only the high ones)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.tile = [
            t._replace(args="RGB;16L") if hasattr(t, "_replace") else (*t[:3], "RGB;16L")
            for t in im.tile
        ]
        im.load()
        return im.copy()


def decode_rgba_like_tf(data: bytes):
    """Decodes a PNG to what `tf.io.decode_png(data, channels=4)` returns (HxWx4 uint8).

    TF asks libpng for: palette -> RGB, grey bit depths 1/2/4 expanded to 8 by bit
    replication, grey -> RGB without gamma, 16-bit samples stripped to their high
    byte, tRNS -> alpha (0 for the transparent colour, else full), and where the
    image has no alpha, a filler of `(1 << bit_depth) - 1` after the colour. For
    bit depths below 8 that filler is not expanded: alpha is 1, 3 or 15.
    """
    import numpy as np
    from PIL import Image

    depth, color = data[24], data[25]
    trns = _png_chunk(data, b"tRNS")
    filler = ((1 << depth) - 1) & 0xFF
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        if color == 0:  # grey 1/2/4/8/16: raw samples, then libpng's expansion
            if im.mode == "1":
                raw = np.asarray(im).astype(np.uint32)
            elif depth < 8:  # Pillow replicates bits like libpng: raw = L / (255 / max)
                raw = np.asarray(im).astype(np.uint32) // (255 // ((1 << depth) - 1))
            else:
                raw = np.asarray(im).astype(np.uint32)
            if depth == 16:
                grey = raw >> 8
            else:
                grey = raw * (255 // ((1 << depth) - 1))
            if trns is not None and len(trns) >= 2:
                key = int.from_bytes(trns[:2], "big") & ((1 << depth) - 1)
                alpha = np.where(raw == key, 0, 255)
            else:
                alpha = np.full_like(raw, filler)
            out = np.stack([grey, grey, grey, alpha], -1).astype(np.uint8)
        elif color == 2:  # RGB 8/16 (Pillow keeps the high byte of 16-bit samples)
            rgb = np.asarray(im.convert("RGB"))
            if trns is not None and len(trns) >= 6:
                key = struct.unpack(">3H", trns[:6])
                if depth == 16:
                    low = np.asarray(_rgb16_low_bytes(data)).astype(np.uint32)
                    full = (rgb.astype(np.uint32) << 8) | low
                else:
                    full = rgb.astype(np.uint32)
                    key = tuple(k & 0xFF for k in key)
                alpha = np.where((full == np.array(key, np.uint32)).all(-1), 0, 255)
            else:
                alpha = np.full(rgb.shape[:2], 255)
            out = np.concatenate([rgb, alpha[..., None].astype(np.uint8)], -1)
        else:  # palette (alpha from tRNS), grey+alpha, RGBA; 16-bit: the high byte
            out = np.array(im.convert("RGBA"))
            if color == 3 and trns is None:
                out[..., 3] = filler
    return np.ascontiguousarray(out, dtype=np.uint8)


def to_rgba_png(data: bytes) -> bytes:
    """Re-encodes a PNG as an uncompressed 8-bit RGBA PNG of `decode_rgba_like_tf`."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(decode_rgba_like_tf(data), "RGBA").save(out, format="PNG", compress_level=0)
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
            try:
                return to_rgba_png(data)
            except (OSError, ValueError, SyntaxError) as e:
                raise CorruptImageError(path, f"bad PNG ({e})") from None
    elif kind == "jpeg" and len(data) < 128:
        raise CorruptImageError(path, "truncated JPEG")
    elif kind == "gif":
        try:
            return gif_to_png(data)
        except (OSError, ValueError, SyntaxError) as e:
            raise CorruptImageError(path, f"bad GIF ({e})") from None
    return data
