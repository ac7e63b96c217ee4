"""A generated PNG corpus: every colour type x bit depth x interlace x ancillary-chunk
variant, plus corrupt files, as {name: bytes}. Needs numpy and zlib only.

It stands in for PngSuite (which the tests use as an extra when it is there): the
exactness tests of the PNG decoders and the trees of the dataset tests are built from it,
so a clone without `../shared` runs them. Names follow PngSuite's habit: a corrupt file's
name starts with "x", a valid one's never does.

- Colour types and depths: grey 1/2/4/8/16, RGB 8/16, palette 1/2/4/8, grey+alpha 8/16,
  RGBA 8/16 (every combination the PNG specification allows).
- Interlace: none and Adam7, at sizes that leave some of Adam7's passes empty (1x1, 3x2)
  and ones that fill them all, with partial bytes at the low depths (13x11).
- Variants: plain; tRNS (a colour key for grey and RGB, per-entry alpha for a palette);
  gAMA at 1/2.2 and at 1.0; sRGB; iCCP (a minimal profile for the colour space);
  bKGD + pHYs + tEXt + tIME (chunks decoders read and ignore); a file split over several
  IDAT chunks; 16-bit files with sBIT.
- Row filters: each row uses the next of None, Sub, Up, Average, Paeth.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from support.pngs import chunk

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (colour type, depths, samples per pixel)
COLOUR_TYPES = ((0, (1, 2, 4, 8, 16), 1), (2, (8, 16), 3), (3, (1, 2, 4, 8), 1),
                (4, (8, 16), 2), (6, (8, 16), 4))
SIZES = ((13, 11), (1, 1), (3, 2))  # (width, height)
# Adam7's passes: (x start, y start, x step, y step).
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))
_CODES = {0: "g", 2: "c", 3: "p", 4: "a", 6: "r"}  # PngSuite's letters, roughly


def _paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def _filtered(rows: list[bytes], bpp: int, first_filter: int) -> bytes:
    """Scanlines with a filter byte each, filter types in turn from `first_filter`."""
    out = bytearray()
    prior = None
    for r, row in enumerate(rows):
        cur = np.frombuffer(row, np.uint8).astype(np.int32)
        up = np.zeros_like(cur) if prior is None else prior
        left = np.concatenate([np.zeros(bpp, np.int32), cur[:-bpp]])[:len(cur)]
        diag = np.concatenate([np.zeros(bpp, np.int32), up[:-bpp]])[:len(cur)]
        ft = (first_filter + r) % 5
        pred = (np.zeros_like(cur), left, up, (left + up) >> 1, _paeth(left, up, diag))[ft]
        out.append(ft)
        out += ((cur - pred) & 0xFF).astype(np.uint8).tobytes()
        prior = cur
    return bytes(out)


def _row_bytes(samples: np.ndarray, depth: int) -> bytes:
    """One row of samples (W x spp, ints) packed at `depth` bits, MSB first."""
    flat = samples.reshape(-1)
    if depth == 16:
        return flat.astype(">u2").tobytes()
    if depth == 8:
        return flat.astype(np.uint8).tobytes()
    bits = np.unpackbits(flat.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
    return np.packbits(bits.reshape(-1)).tobytes()


def _image_data(samples: np.ndarray, depth: int, interlace: int) -> bytes:
    """The filtered, uncompressed image data of HxWxS `samples`."""
    spp = samples.shape[2]
    bpp = max(1, spp * depth // 8)
    if not interlace:
        return _filtered([_row_bytes(r, depth) for r in samples], bpp, 0)
    out = b""
    for k, (xs, ys, dx, dy) in enumerate(ADAM7):
        sub = samples[ys::dy, xs::dx]
        if sub.shape[0] and sub.shape[1]:  # an empty pass has no bytes at all
            out += _filtered([_row_bytes(r, depth) for r in sub], bpp, k)
    return out


def _icc_profile(space: bytes) -> bytes:
    """A small ICC profile: a 128-byte header and one tag (the media white point).
    TF's libpng reads its header, warns "iCCP: too short" and ignores it, as it
    ignores the chunk's colour management anyway; what matters to the decoders'
    front ends is that the chunk is there."""
    wtpt = b"XYZ " + bytes(4) + struct.pack(">iii", 63190, 65536, 54061)
    size = 128 + 4 + 12 + len(wtpt)
    head = bytearray(128)
    struct.pack_into(">I", head, 0, size)
    head[8:12] = b"\x04\x40\x00\x00"  # version 4.4
    head[12:16] = b"mntr"
    head[16:20] = space  # b"GRAY" or b"RGB "
    head[20:24] = b"XYZ "
    head[36:40] = b"acsp"
    struct.pack_into(">iii", head, 68, 63190, 65536, 54061)  # D50 illuminant
    return bytes(head) + struct.pack(">I4sII", 1, b"wtpt", 144, len(wtpt)) + wtpt


def encode(samples: np.ndarray, color_type: int, depth: int, *, interlace: int = 0,
           palette: np.ndarray | None = None, before_plte: bytes = b"",
           after_plte: bytes = b"", idat_parts: int = 1) -> bytes:
    """A PNG of HxWxS integer `samples` at `depth` bits (palette: indices)."""
    h, w = samples.shape[:2]
    z = zlib.compress(_image_data(samples, depth, interlace), 9)
    out = SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0,
                                                 interlace))
    out += before_plte
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    out += after_plte
    cut = np.linspace(0, len(z), idat_parts + 1).astype(int)
    for a, b in zip(cut[:-1], cut[1:]):
        out += chunk(b"IDAT", z[a:b])
    return out + chunk(b"IEND", b"")


def _variants(color_type: int, depth: int, samples: np.ndarray,
              rng: np.random.Generator) -> dict[str, tuple[bytes, bytes, int]]:
    """name -> (chunks before PLTE, chunks after PLTE, IDAT parts)."""
    colour = color_type in (2, 3, 6)
    out = {"plain": (b"", b"", 1),
           "gamma45": (chunk(b"gAMA", struct.pack(">I", 45455)), b"", 1),
           "gamma100": (chunk(b"gAMA", struct.pack(">I", 100000)), b"", 1),
           "srgb": (chunk(b"sRGB", b"\x00"), b"", 1),
           "iccp": (chunk(b"iCCP", b"profile\x00\x00" + zlib.compress(
               _icc_profile(b"RGB " if colour else b"GRAY"))), b"", 1),
           "idats": (b"", b"", 3)}
    top = (1 << depth) - 1
    if color_type == 0:
        key = int(samples.reshape(-1)[0])  # a key that occurs in the image
        out["trns"] = (b"", chunk(b"tRNS", struct.pack(">H", key)), 1)
    elif color_type == 2:
        key = samples.reshape(-1, 3)[0]
        out["trns"] = (b"", chunk(b"tRNS", struct.pack(">HHH", *map(int, key))), 1)
    elif color_type == 3:
        n = min(1 << depth, 256)
        alphas = rng.integers(0, 256, max(1, n // 2), dtype=np.uint8)
        out["trns"] = (b"", chunk(b"tRNS", alphas.tobytes()), 1)
    extra = chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1))
    extra += chunk(b"tEXt", b"Comment\x00generated by support.png_corpus")
    extra += chunk(b"tIME", struct.pack(">HBBBBB", 2026, 12, 4, 7, 0, 0))
    bkgd = (b"\x00" if color_type == 3 else
            struct.pack(">HHH", top, 0, top) if colour else struct.pack(">H", top))
    out["ancillary"] = (extra, chunk(b"bKGD", bkgd), 1)
    if depth == 16:
        spp = samples.shape[2] if color_type != 3 else 3
        out["sbit"] = (chunk(b"sBIT", bytes([12] * spp)), b"", 1)
    return out


def valid_corpus(seed: int = 0) -> dict[str, bytes]:
    """Every colour type x depth x interlace x variant x size, random pixels, as
    {name: bytes}; names like `g04_i1_trns_13x11.png`."""
    rng = np.random.default_rng(seed)
    out = {}
    for color_type, depths, spp in COLOUR_TYPES:
        for depth in depths:
            for w, h in SIZES:
                palette = None
                if color_type == 3:
                    n = min(1 << depth, 256) - (1 if depth > 1 else 0)  # not always full
                    palette = rng.integers(0, 256, (n, 3), dtype=np.uint8)
                    samples = rng.integers(0, n, (h, w, 1))
                else:
                    samples = rng.integers(0, 1 << depth, (h, w, spp))
                for name, (before, after, parts) in _variants(color_type, depth, samples,
                                                              rng).items():
                    for interlace in (0, 1):
                        key = f"{_CODES[color_type]}{depth:02d}_i{interlace}_{name}_{w}x{h}.png"
                        out[key] = encode(samples, color_type, depth, interlace=interlace,
                                          palette=palette, before_plte=before,
                                          after_plte=after, idat_parts=parts)
    return out


def _edit_ihdr(png: bytes, **fields) -> bytes:
    """`png` with IHDR fields replaced (the CRC made valid)."""
    names = ("width", "height", "depth", "color_type", "compression", "filter", "interlace")
    values = dict(zip(names, struct.unpack_from(">IIBBBBB", png, 16)))
    values.update(fields)
    return (png[:8] + chunk(b"IHDR", struct.pack(">IIBBBBB", *(values[n] for n in names)))
            + png[33:])


def corrupt_corpus(seed: int = 0) -> dict[str, bytes]:
    """Files every PNG decoder must reject (TF's libpng rejects each), as {name: bytes};
    each name starts with "x" and says what is wrong."""
    rng = np.random.default_rng(seed)
    good = encode(rng.integers(0, 256, (11, 13, 3)), 2, 8)
    grey = encode(rng.integers(0, 2, (11, 13, 1)), 0, 1)
    z_end = len(good) - 12  # IEND starts here
    idat_at = good.index(b"IDAT") - 4
    n_idat = struct.unpack_from(">I", good, idat_at)[0]
    raw = zlib.decompress(good[idat_at + 8:idat_at + 8 + n_idat])
    bad_filter = bytearray(raw)
    bad_filter[0] = 7

    def with_idat(data: bytes) -> bytes:
        return good[:idat_at] + chunk(b"IDAT", data) + good[z_end:]

    z = zlib.compress(raw)
    return {
        "xs_bad_signature.png": b"\x89PNG\r\n\x1a\x0b" + good[8:],
        "xs_crlf_signature.png": b"\x89PNG\r\r\n\x1a\n" + good[8:],
        "xs_lf_signature.png": b"\x89PNG\n\x1a\n" + good[8:],
        "xh_bad_ihdr_crc.png": good[:29] + bytes([good[29] ^ 1]) + good[30:],
        "xc_colour_type_1.png": _edit_ihdr(good, color_type=1),
        "xc_colour_type_9.png": _edit_ihdr(good, color_type=9),
        "xd_depth_0.png": _edit_ihdr(good, depth=0),
        "xd_depth_3.png": _edit_ihdr(grey, depth=3),
        "xd_depth_99.png": _edit_ihdr(good, depth=99),
        "xi_interlace_2.png": _edit_ihdr(good, interlace=2),
        "xz_zero_width.png": _edit_ihdr(good, width=0),
        "xt_no_idat.png": good[:idat_at] + good[z_end:],
        "xt_truncated.png": good[:idat_at + 8 + n_idat // 2],
        "xk_bad_idat_crc.png": good[:z_end - 1] + bytes([good[z_end - 1] ^ 0xFF]) + good[z_end:],
        "xk_bad_adler.png": with_idat(z[:-4] + struct.pack(">I", (zlib.adler32(raw) + 1)
                                                            & 0xFFFFFFFF)),
        "xk_short_stream.png": with_idat(zlib.compress(raw[:-11])),
        "xf_bad_filter_type.png": with_idat(zlib.compress(bytes(bad_filter))),
        "xe_empty.png": b"",
        "xe_signature_only.png": SIGNATURE,
    }


def corpus(seed: int = 0) -> dict[str, bytes]:
    """`valid_corpus()` and `corrupt_corpus()` together."""
    return {**valid_corpus(seed), **corrupt_corpus(seed)}


def write(folder, files: dict[str, bytes] | None = None) -> list[str]:
    """Writes `files` (default: `corpus()`) into `folder`; returns the paths."""
    import os

    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, data in (corpus() if files is None else files).items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths
