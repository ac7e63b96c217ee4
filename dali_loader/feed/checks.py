"""Cheap checks on encoded image bytes, before they reach the decoder.

One corrupt image kills a whole DALI pipeline, so the read stage looks at each
file first: a content sniff (like `tf.io.decode_image`, the extension does not
matter), and for PNG a walk over every chunk with its CRC. This catches empty,
truncated, non-image and bit-flipped files at the cost of a crc32 pass, and,
from the header alone, images over a pixel limit (`max_pixels`) before any
decoder allocates them. Damaged ancillary PNG chunks are dropped, as libpng
(TF's decoder) drops them; a damaged critical chunk refuses the file. GIFs,
which DALI cannot decode, are converted to an uncompressed PNG of their first
frame (what `tf.io.decode_image(..., expand_animations=False)` returns).
"""

from __future__ import annotations

import io
import struct
import zlib

from dali_loader.errors import CorruptImageError
from dali_loader.formats import png
from dali_loader.formats.limits import DEFAULT_MAX_PIXELS
from dali_loader.formats.limits import physical_memory as _physical_memory
from dali_loader.formats.sniff import image_size, read_head, sniff


def over_limit(size: tuple[int, int] | None, max_pixels: int | None) -> str | None:
    """Why an image of `size` (width, height; None: unknown) is refused (over
    `max_pixels`), or None."""
    if max_pixels is None or size is None or size[0] * size[1] <= max_pixels:
        return None
    w, h = size
    return (f"its header claims {w}x{h} = {w * h} pixels, over the limit of {max_pixels} "
            "(max_pixels=; pass a larger max_pixels to load it)")


def size_problem(data: bytes, max_pixels: int | None) -> str | None:
    """Why the header's image size is refused (over `max_pixels`), or None."""
    if max_pixels is None:
        return None
    return over_limit(image_size(data), max_pixels)


def peek_size_problem(path: str, max_pixels: int | None, offset: int = 0) -> str | None:
    """`size_problem` of a local file (its image from `offset` on), from its first
    bytes (`formats.sniff.read_head`)."""
    if max_pixels is None:
        return None
    return size_problem(read_head(path, offset), max_pixels)


def check_png(data: bytes) -> str | None:
    """Walks the PNG chunks; returns what is wrong, or None if it looks sound."""
    return walk_png(data)[0]


def walk_png(data: bytes) -> tuple[str | None, list[tuple[int, int]]]:
    """Walks the PNG chunks (`formats.png`) with libpng's rules: (what is wrong or
    None, the byte ranges of ancillary chunks whose CRC is wrong, which libpng
    drops with a warning)."""
    return _walk_png(data)[:2]


def _walk_png(data: bytes) -> tuple[str | None, list[tuple[int, int]], png.Ihdr | None]:
    """`walk_png`, and the IHDR it read (None before one passed)."""
    h, seen_idat, seen_plte = None, False, False
    damaged: list[tuple[int, int]] = []
    try:
        for pos, length, ctype, end in png.chunks(data):
            if not ctype.isalpha():  # libpng: "invalid chunk type"
                return f"invalid chunk type {ctype!r}", damaged, h
            if not png.crc_ok(data, pos, end):
                if h is None or png.critical(ctype):  # critical: libpng refuses the file
                    return f"CRC mismatch in the {ctype.decode('latin-1')!r} chunk", damaged, h
                damaged.append((pos, end))
                continue
            if h is None:
                if ctype != b"IHDR" or length != 13:
                    return "the first chunk is not IHDR", damaged, h
                h = png.unpack_ihdr(png.body(data, pos, end))
                problem = png.ihdr_problem(h)
                if problem:
                    return problem, damaged, h
            elif ctype == b"PLTE":
                seen_plte = True
            elif ctype == b"IDAT":
                if h.color_type == png.PALETTE and not seen_plte:
                    return "a palette image without a PLTE chunk before its IDAT", damaged, h
                seen_idat = True
            elif ctype == b"IEND":
                return (None if seen_idat else "no IDAT chunk"), damaged, h
            elif png.critical(ctype) and ctype not in png.CRITICAL:
                return f"unknown critical chunk {ctype.decode('latin-1')!r}", damaged, h
    except png.ChunkError as e:
        if e.type is None:
            return "truncated (no IEND chunk)", damaged, h
        return f"truncated inside the {e.type!r} chunk", damaged, h
    if damaged:  # the data ended after a damaged chunk: it was what should have ended it
        at = damaged[-1][0]
        return f"CRC mismatch in the {data[at + 4:at + 8].decode('latin-1')!r} chunk", damaged, h
    return "truncated (no IEND chunk)", damaged, h


def _drop(data: bytes, ranges: list[tuple[int, int]]) -> bytes:
    """`data` without the byte `ranges` (sorted, disjoint)."""
    out, at = [], 0
    for start, end in ranges:
        out.append(data[at:start])
        at = end
    out.append(data[at:])
    return b"".join(out)


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
    """True for PNGs whose RGBA DALI's any-channel decode does not give like TF.

    Grey, grey+alpha and palette images, any image with a tRNS chunk (DALI drops
    or rejects that alpha) and 16-bit images (DALI rounds to 8 bits, libpng as TF
    calls it keeps the high byte).
    """
    h = png.ihdr(data)
    return h.color_type in (0, 3, 4) or h.depth == 16 or png.first(data, b"tRNS") is not None


def _rgb16_low_bytes(data: bytes):
    """The low bytes of a 16-bit RGB PNG's samples (Pillow keeps only the high ones)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        # An older Pillow's tiles are plain tuples.
        im.tile = [t._replace(args="RGB;16L") if hasattr(t, "_replace")  # type: ignore[misc]
                   else (*t[:3], "RGB;16L") for t in im.tile]
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

    h = png.ihdr(data)
    depth, color = h.depth, h.color_type
    trns = png.first(data, b"tRNS")
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
            grey: np.ndarray
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
                rgb_key = struct.unpack(">3H", trns[:6])
                if depth == 16:
                    low = np.asarray(_rgb16_low_bytes(data)).astype(np.uint32)
                    full = (rgb.astype(np.uint32) << 8) | low
                else:
                    full = rgb.astype(np.uint32)
                    rgb_key = tuple(k & 0xFF for k in rgb_key)
                alpha = np.where((full == np.array(rgb_key, np.uint32)).all(-1), 0, 255)
            else:
                alpha = np.full(rgb.shape[:2], 255)
            out = np.concatenate([rgb, alpha[..., None].astype(np.uint8)], -1)
        else:  # palette (alpha from tRNS), grey+alpha, RGBA; 16-bit: the high byte
            out = np.array(im.convert("RGBA"))
            if color == 3 and trns is None:
                out[..., 3] = filler
    return np.ascontiguousarray(out, dtype=np.uint8)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def _scanlines(w: int, h: int, bits: int, interlaced: bool) -> list[tuple[int, int]]:
    """(rows, bytes per row with its filter byte) of each pass of an image."""
    def rowbytes(width: int) -> int:
        return 1 + (width * bits + 7) // 8

    if not interlaced:
        return [(h, rowbytes(w))]
    passes = []
    for x0, y0, dx, dy in _ADAM7:
        pw, ph = max(0, -(-(w - x0) // dx)), max(0, -(-(h - y0) // dy))
        if pw and ph:
            passes.append((ph, rowbytes(pw)))
    return passes


def png_data_problem(data: bytes) -> str | None:
    """What libpng (TF's decoder) refuses in a sound-looking PNG's image data and
    Pillow lets through: a stream that ends before the last row, or a row filter
    type over 4. For PNGs decoded by Pillow (the rgba path's conversions)."""
    h = png.ihdr(data)
    lines = _scanlines(h.width, h.height, h.depth * png.SAMPLES[h.color_type], h.interlace == 1)
    need = sum(rows * size for rows, size in lines)
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(b"".join(png.idat(data)), need)
    except zlib.error as e:
        return f"bad image data ({e})"
    if len(raw) < need:
        return "not enough image data"
    try:  # after the last row libpng only warns on bad data, but wants the stream's end
        while not inflate.eof and inflate.unconsumed_tail:
            inflate.decompress(inflate.unconsumed_tail, 1 << 20)
    except zlib.error:
        pass
    else:
        if not inflate.eof:
            return "the image data stream ends early"
    at = 0
    for rows, size in lines:
        if max(raw[at:at + rows * size:size], default=0) > 4:
            return "bad adaptive filter value"
        at += rows * size
    return None


def to_rgba_png(data: bytes) -> bytes:
    """Re-encodes a PNG as an uncompressed 8-bit RGBA PNG of `decode_rgba_like_tf`."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(decode_rgba_like_tf(data), "RGBA").save(out, format="PNG", compress_level=0)
    return out.getvalue()


def _conversion_error(path: str, what: str, e: BaseException) -> CorruptImageError:
    """A Pillow conversion's failure (any: a bomb, a broken stream, no memory) as
    the file's error."""
    if isinstance(e, MemoryError):
        return CorruptImageError(path, f"out of memory while converting the {what}")
    return CorruptImageError(path, f"bad {what} ({type(e).__name__}: {e})")


def _nvimgcodec():
    """nvImageCodec's Python module, or None (DALI 2.4 depends on it)."""
    try:
        import nvidia.nvimgcodec as nvimgcodec
    except ImportError:
        return None
    return nvimgcodec


def decoder_header_problem(data: bytes) -> str | None:
    """Why DALI's image decoder must not get `data` (or None): nvImageCodec, the
    parser DALI 2.4's decoder runs on every sample first, cannot read its header,
    or the image it claims would not fit in this machine's memory.

    Why before DALI: for a batch of 32 or more samples, DALI 2.4's `ImageDecoder`
    shares that parse (and the output's allocation) between its executor thread
    and its thread pool, and an exception on the executor's share leaves without
    waiting for the pool, whose workers go on through the freed stack frame: a
    segmentation fault (`RunImplImpl` in include/dali/operators/imgcodec/
    image_decoder.h of the DALI 2.4.0 wheel; reproduced here with one corrupt
    JPEG or BMP among 63 PNGs, batch 32: docs/architecture.md)."""
    nvimgcodec = _nvimgcodec()
    if nvimgcodec is None:
        return None
    try:
        stream = nvimgcodec.CodeStream(data)
        w, h, c, dtype = stream.width, stream.height, stream.num_channels, stream.dtype
    except Exception as e:  # noqa: BLE001 - nvImageCodec raises RuntimeError; any is the file's
        return f"DALI's image decoder cannot read its header (nvImageCodec: {e})"
    itemsize = getattr(dtype, "itemsize", 0)
    if w <= 0 or h <= 0 or c <= 0 or not itemsize:
        return (f"DALI's image decoder cannot read its header (nvImageCodec: {w}x{h}, "
                f"{c} channels of {dtype})")
    need, memory = w * h * max(c, 4) * itemsize, _physical_memory()
    if memory and need > memory:
        return (f"its header claims {w}x{h} pixels of {c}x{dtype}: {need} bytes to decode, more "
                f"than this machine's memory ({memory} bytes)")
    return None


def prepare(data: bytes, path: str, rgba: bool = False,
            max_pixels: int | None = DEFAULT_MAX_PIXELS) -> bytes:
    """Checks encoded bytes and returns what the decoder (DALI's) should get.

    Args:
        data: The file's bytes.
        path: The file's name, for error messages.
        rgba: The caller wants 4 channels (alpha expanded like libpng does).
        max_pixels: Refuse images whose header claims more pixels (None: no limit).

    Raises:
        CorruptImageError: naming `path`, when the bytes are not a sound image
            (or not one DALI's decoder can take: `decoder_header_problem`).
    """
    data = _prepared(data, path, rgba, max_pixels)
    problem = decoder_header_problem(data)
    if problem:
        raise CorruptImageError(path, problem)
    return data


def _prepared(data: bytes, path: str, rgba: bool, max_pixels: int | None) -> bytes:
    if not data:
        raise CorruptImageError(path, "the file is empty")
    kind = sniff(data)
    if kind is None:
        raise CorruptImageError(
            path, "not a JPEG, PNG, GIF or BMP image (unknown file signature)"
        )
    if kind == "png":  # the walk reads the header: its size, once
        problem, damaged, h = _walk_png(data)
        if problem:
            raise CorruptImageError(path, problem)
        if damaged:  # what libpng does: drop them, decode the rest
            data = _drop(data, damaged)
        assert h is not None  # a walk with no problem read the IHDR
        size: tuple[int, int] | None = (h.width, h.height)
    else:
        size = image_size(data, kind)
    problem = over_limit(size, max_pixels)
    if problem:
        raise CorruptImageError(path, problem)
    if kind == "png":
        if rgba and _png_needs_rgba_help(data):
            problem = png_data_problem(data)  # what Pillow would let through
            if problem:
                raise CorruptImageError(path, problem)
            try:
                return to_rgba_png(data)
            except Exception as e:  # noqa: BLE001 - Pillow's bomb error is no OSError
                raise _conversion_error(path, "PNG", e) from None
    elif kind == "jpeg" and len(data) < 128:
        raise CorruptImageError(path, "truncated JPEG")
    elif kind == "gif":
        try:
            return gif_to_png(data)
        except Exception as e:  # noqa: BLE001 - as above
            raise _conversion_error(path, "GIF", e) from None
    return data
