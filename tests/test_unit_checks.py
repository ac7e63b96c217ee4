"""Byte checks before the decoder: sniff, the PNG chunk/CRC walk, prepare()."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

from dali_loader.errors import BadFileError, CorruptImageError
from dali_loader.feed.checks import check_png, prepare
from dali_loader.formats.png import SIGNATURE as PNG_SIGNATURE
from dali_loader.formats.sniff import image_size, sniff
from dali_loader.plan import check_max_pixels

Image = pytest.importorskip("PIL.Image")


def chunk(ctype: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(ctype + body) if crc is None else crc
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", crc)


def ihdr(w=3, h=2, depth=8, color=2, comp=0, filt=0, inter=0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, comp, filt, inter))


def idat(w=3, h=2) -> bytes:
    raw = b"".join(b"\x00" + bytes(3 * w) for _ in range(h))
    return chunk(b"IDAT", zlib.compress(raw))


IEND = chunk(b"IEND", b"")


def png(*chunks: bytes) -> bytes:
    return PNG_SIGNATURE + b"".join(chunks)


GOOD = png(ihdr(), idat(), IEND)


def encode(arr: np.ndarray, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format=fmt, **kw)
    return out.getvalue()


RGB = (np.arange(8 * 10 * 3) % 251).astype(np.uint8).reshape(8, 10, 3)


# --- sniff ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, kind",
    [
        (GOOD, "png"),
        (encode(RGB, "JPEG"), "jpeg"),
        (b"\xff\xd8\xff\xdb" + bytes(10), "jpeg"),
        (encode(RGB, "GIF"), "gif"),
        (b"GIF87a" + bytes(10), "gif"),
        (b"GIF89a" + bytes(10), "gif"),
        (encode(RGB, "BMP"), "bmp"),
        (b"", None),
        (b"hello world", None),
        (b"\x89PNG\r\n\x1a", None),  # signature cut short
        (b"\x89PNG\n\r\x1a\n", None),
        (b"\xff\xd8", None),
        (b"GIF90a", None),
        (b"<html>", None),
    ],
)
def test_sniff(data, kind):
    assert sniff(data) == kind


# --- check_png on the generated corpus (and PngSuite) -------------------------------------


def test_check_png_accepts_every_valid_png(pngs):
    from support.helpers import valid_pngs

    valid = valid_pngs(pngs)
    assert len(valid) >= 300
    problems = {p.name: check_png(p.read_bytes()) for p in valid}
    assert {k: v for k, v in problems.items() if v is not None} == {}


# What the chunk walk says about each generated corrupt file (support.png_corpus).
EXPECTED_GENERATED = {
    "xc_colour_type_1.png": "invalid colour type 1",
    "xc_colour_type_9.png": "invalid colour type 9",
    "xd_depth_0.png": "invalid bit depth 0 for colour type 2",
    "xd_depth_3.png": "invalid bit depth 3 for colour type 0",
    "xd_depth_99.png": "invalid bit depth 99 for colour type 2",
    "xe_empty.png": "truncated (no IEND chunk)",
    "xe_signature_only.png": "truncated (no IEND chunk)",
    "xh_bad_ihdr_crc.png": "CRC mismatch in the 'IHDR' chunk",
    "xi_interlace_2.png": "invalid compression, filter or interlace method",
    "xk_bad_idat_crc.png": "CRC mismatch in the 'IDAT' chunk",
    "xs_crlf_signature.png": "truncated inside the b'\\rIHD' chunk",
    "xs_lf_signature.png": "truncated inside the b'HDR\\x00' chunk",
    "xt_no_idat.png": "no IDAT chunk",
    "xt_truncated.png": "truncated inside the b'IDAT' chunk",
    "xz_zero_width.png": "zero image size 0x11",
}
# Sound chunks, damage inside the zlib stream: only inflating sees it (png_data_problem,
# and every decoder).
DATA_ONLY_GENERATED = {"xf_bad_filter_type.png": "bad adaptive filter value",
                       "xk_bad_adler.png": "incorrect data check",
                       "xk_short_stream.png": "not enough image data"}


def test_check_png_on_every_generated_corrupt_file():
    from dali_loader.feed.checks import png_data_problem
    from support.png_corpus import corrupt_corpus

    files = corrupt_corpus()
    assert set(files) == set(EXPECTED_GENERATED) | set(DATA_ONLY_GENERATED) | {
        "xs_bad_signature.png"}
    got = {name: check_png(data) for name, data in files.items()}
    assert {n: r for n, r in got.items() if r is not None} == EXPECTED_GENERATED
    assert sniff(files["xs_bad_signature.png"]) is None  # sniff() rejects it first
    for name, words in DATA_ONLY_GENERATED.items():
        assert got[name] is None
        assert words in png_data_problem(files[name]), name


# What the chunk walk says about each corrupt PngSuite file. The signature
# corruptions (xs*, xcr) are not its job: sniff() rejects them first.
EXPECTED_X = {
    "xc1n0g08.png": "invalid colour type 1",
    "xc9n2c08.png": "invalid colour type 9",
    "xcsn0g01.png": "CRC mismatch in the 'IDAT' chunk",
    "xd0n2c08.png": "invalid bit depth 0 for colour type 2",
    "xd3n2c08.png": "invalid bit depth 3 for colour type 2",
    "xd9n2c08.png": "invalid bit depth 99 for colour type 2",
    "xdtn0g01.png": "no IDAT chunk",
    "xhdn0g08.png": "CRC mismatch in the 'IHDR' chunk",
    "xlfn0g04.png": "CRC mismatch in the 'IHDR' chunk",
}
CHECK_PNG_BLIND = {"xcrn0g04.png", "xs1n0g01.png", "xs2n0g01.png", "xs4n0g01.png",
                   "xs7n0g01.png"}


def test_check_png_on_every_corrupt_pngsuite_file(pngsuite):
    corrupt = sorted(p.name for p in pngsuite.glob("x*.png"))
    assert len(corrupt) == 14
    assert set(corrupt) == set(EXPECTED_X) | CHECK_PNG_BLIND
    got = {name: check_png((pngsuite / name).read_bytes()) for name in corrupt}
    assert {n: r for n, r in got.items() if r is not None} == EXPECTED_X
    assert {n for n, r in got.items() if r is None} == CHECK_PNG_BLIND
    # ... and those are exactly the files with a broken signature.
    assert all(sniff((pngsuite / n).read_bytes()) is None for n in CHECK_PNG_BLIND)


def test_prepare_rejects_every_corrupt_file_but_those_only_inflating_sees(pngs):
    from support.helpers import corrupt_pngs

    for p in corrupt_pngs(pngs):
        if p.name in DATA_ONLY_GENERATED:
            assert prepare(p.read_bytes(), str(p)) is not None  # a decoder rejects it
            continue
        with pytest.raises(CorruptImageError) as ei:
            prepare(p.read_bytes(), str(p))
        assert ei.value.path == str(p)
        assert str(p) in str(ei.value)


def test_prepare_passes_valid_png_bytes_through(pngs):
    from support.helpers import valid_pngs

    for p in valid_pngs(pngs):
        data = p.read_bytes()
        assert prepare(data, str(p)) is data


# --- check_png on synthetic damage ----------------------------------------------------


def test_synthetic_good_png_is_sound():
    assert check_png(GOOD) is None
    with Image.open(io.BytesIO(GOOD)) as im:  # Pillow agrees it is a PNG
        assert im.size == (3, 2)
    assert check_png(encode(RGB, "PNG")) is None


@pytest.mark.parametrize(
    "data, reason",
    [
        (PNG_SIGNATURE, "truncated (no IEND chunk)"),
        (png(ihdr(), idat()), "truncated (no IEND chunk)"),  # cut at a chunk boundary
        (png(ihdr(), idat())[:-3], "truncated inside the b'IDAT' chunk"),
        (GOOD[:-1], "truncated inside the b'IEND' chunk"),
        (GOOD[:20], "truncated inside the b'IHDR' chunk"),
        (png(ihdr(), idat(), IEND)[: len(PNG_SIGNATURE) + 5], "truncated (no IEND chunk)"),
        (PNG_SIGNATURE + struct.pack(">I", 0x80000000) + b"IDAT" + bytes(64),
         "truncated inside the b'IDAT' chunk"),
    ],
)
def test_check_png_truncated(data, reason):
    assert check_png(data) == reason


def test_check_png_crc_flips():
    body = bytearray(GOOD)
    # Flip one bit inside the IDAT payload: its CRC no longer matches.
    at = GOOD.index(b"IDAT") + 6
    body[at] ^= 0x01
    assert check_png(bytes(body)) == "CRC mismatch in the 'IDAT' chunk"
    # A wrong stored CRC.
    bad_ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0), crc=1234)
    assert check_png(png(bad_ihdr, idat(), IEND)) == "CRC mismatch in the 'IHDR' chunk"
    bad_iend = chunk(b"IEND", b"", crc=0)
    assert check_png(png(ihdr(), idat(), bad_iend)) == "CRC mismatch in the 'IEND' chunk"
    # Flipped chunk type: the CRC covers it too.
    body = bytearray(GOOD)
    body[GOOD.index(b"IEND")] ^= 0x20
    assert check_png(bytes(body)) == "CRC mismatch in the 'iEND' chunk"


@pytest.mark.parametrize(
    "hdr, reason",
    [
        (ihdr(w=0), "zero image size 0x2"),
        (ihdr(h=0), "zero image size 3x0"),
        (ihdr(w=0, h=0), "zero image size 0x0"),
        (ihdr(color=1), "invalid colour type 1"),
        (ihdr(color=5), "invalid colour type 5"),
        (ihdr(color=7), "invalid colour type 7"),
        (ihdr(color=3, depth=16), "invalid bit depth 16 for colour type 3"),
        (ihdr(color=2, depth=4), "invalid bit depth 4 for colour type 2"),
        (ihdr(color=6, depth=1), "invalid bit depth 1 for colour type 6"),
        (ihdr(color=0, depth=3), "invalid bit depth 3 for colour type 0"),
        (ihdr(comp=1), "invalid compression, filter or interlace method"),
        (ihdr(filt=1), "invalid compression, filter or interlace method"),
        (ihdr(inter=2), "invalid compression, filter or interlace method"),
        (chunk(b"IHDR", bytes(12)), "the first chunk is not IHDR"),
        (chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0) + b"\x00"),
         "the first chunk is not IHDR"),
        (chunk(b"tEXt", b"a\x00b"), "the first chunk is not IHDR"),
    ],
)
def test_check_png_bad_ihdr(hdr, reason):
    assert check_png(png(hdr, idat(), IEND)) == reason


@pytest.mark.parametrize("color, depth", [(0, 1), (0, 16), (2, 16), (3, 1), (3, 8),
                                          (4, 8), (4, 16), (6, 8), (6, 16)])
def test_check_png_valid_ihdr_combinations(color, depth):
    plte = chunk(b"PLTE", bytes(3)) if color == 3 else b""
    assert check_png(png(ihdr(color=color, depth=depth, inter=1), plte, idat(), IEND)) is None


def test_check_png_follows_libpng_on_chunks():
    """A palette image needs its PLTE (libpng refuses it); a damaged ancillary
    chunk is dropped (libpng warns and decodes the rest); an unknown critical
    chunk refuses the file."""
    assert check_png(png(ihdr(color=3, depth=8), idat(), IEND)) == (
        "a palette image without a PLTE chunk before its IDAT")
    bad_gama = chunk(b"gAMA", struct.pack(">I", 45455), crc=1)
    data = png(ihdr(), bad_gama, idat(), IEND)
    assert check_png(data) is None
    assert prepare(data, "x.png") == GOOD
    assert check_png(png(ihdr(), chunk(b"ABCD", b""), idat(), IEND)) == (
        "unknown critical chunk 'ABCD'")


def test_check_png_first_chunk_must_be_ihdr_and_idat_required():
    assert check_png(png(idat(), ihdr(), IEND)) == "the first chunk is not IHDR"
    assert check_png(png(ihdr(), IEND)) == "no IDAT chunk"
    assert check_png(png(ihdr(), chunk(b"tEXt", b"k\x00v"), IEND)) == "no IDAT chunk"
    # Ancillary chunks and split IDATs are fine; bytes after IEND are ignored.
    split = zlib.compress(b"".join(b"\x00" + bytes(9) for _ in range(2)))
    ok = png(ihdr(), chunk(b"tEXt", b"k\x00v"), chunk(b"IDAT", split[:5]),
             chunk(b"IDAT", split[5:]), IEND)
    assert check_png(ok) is None
    assert check_png(ok + b"trailing junk") is None


# --- prepare --------------------------------------------------------------------------


def test_prepare_empty_file():
    with pytest.raises(CorruptImageError, match=r"Cannot load image file /d/empty\.png: "
                                                r"the file is empty") as ei:
        prepare(b"", "/d/empty.png")
    assert ei.value.path == "/d/empty.png"
    assert ei.value.reason == "the file is empty"
    assert ei.value.kind == "corrupt"
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, BadFileError)


def test_prepare_unknown_signature():
    with pytest.raises(CorruptImageError, match="unknown file signature") as ei:
        prepare(b"this is a text file, not an image", "gs://b/cats/notes.png")
    assert ei.value.path == "gs://b/cats/notes.png"
    assert "gs://b/cats/notes.png" in str(ei.value)


def test_prepare_truncated_jpeg():
    jpeg = encode(RGB, "JPEG")
    assert prepare(jpeg, "ok.jpg") is jpeg
    with pytest.raises(CorruptImageError, match="truncated JPEG") as ei:
        prepare(jpeg[:100], "cut.jpg")
    assert ei.value.path == "cut.jpg"
    assert "cut.jpg" in str(ei.value)


def test_prepare_png_problem_names_path_and_reason():
    with pytest.raises(CorruptImageError) as ei:
        prepare(GOOD[:-1], "a/b.png")
    assert ei.value.path == "a/b.png"
    assert ei.value.reason == "truncated inside the b'IEND' chunk"
    assert str(ei.value).startswith("Cannot load image file a/b.png: truncated inside")


def test_prepare_bmp_passes_through():
    bmp = encode(RGB, "BMP")
    assert prepare(bmp, "x.bmp") is bmp


def test_prepare_gif_becomes_png_of_the_first_frame():
    frames = [Image.fromarray(np.full((6, 7, 3), v, np.uint8)) for v in (40, 200)]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    gif = out.getvalue()
    assert sniff(gif) == "gif"
    got = prepare(gif, "anim.gif")
    assert sniff(got) == "png"
    assert check_png(got) is None
    with Image.open(io.BytesIO(got)) as im:
        assert im.format == "PNG" and im.mode == "RGB" and im.size == (7, 6)
        px = np.asarray(im)
    with Image.open(io.BytesIO(gif)) as ref:
        ref.seek(0)
        np.testing.assert_array_equal(px, np.asarray(ref.convert("RGB")))
    assert abs(int(px[0, 0, 0]) - 40) <= 8  # the first frame, not the second


def test_prepare_bad_gif():
    with pytest.raises(CorruptImageError, match="bad GIF") as ei:
        prepare(b"GIF89a" + b"\x00garbage" * 3, "bad.gif")
    assert ei.value.path == "bad.gif"


def test_prepare_rgba_expands_grey_and_palette_but_not_rgb():
    grey = encode(np.full((4, 5), 77, np.uint8), "PNG")
    got = prepare(grey, "g.png", rgba=True)
    with Image.open(io.BytesIO(got)) as im:
        assert im.mode == "RGBA"
        assert np.asarray(im)[0, 0].tolist() == [77, 77, 77, 255]
    assert prepare(grey, "g.png") is grey  # without rgba: untouched
    rgb = encode(RGB, "PNG")
    assert prepare(rgb, "c.png", rgba=True) is rgb


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP"])
def test_image_size_from_the_header(fmt):
    arr = np.zeros((7, 11, 3), np.uint8)
    assert image_size(encode(arr, fmt)) == (11, 7)


def test_max_pixels_refuses_a_huge_header_naming_the_file(monkeypatch):
    """A header claiming 2**37 pixels is refused before any decoder allocates
    them; a real image passes; None lifts the limit (up to what this machine's
    memory holds, where DALI's decoder is concerned)."""
    from dali_loader.feed import checks
    from support.mutate import huge_header_png

    monkeypatch.setattr(checks, "_physical_memory", lambda: 1 << 50)

    with pytest.raises(CorruptImageError, match=r"bomb\.png.*1048576x131072.*over the limit"):
        prepare(huge_header_png(1 << 20, 1 << 17), "bomb.png")
    with pytest.raises(CorruptImageError, match="over the limit of 5"):
        prepare(GOOD, "small.png", max_pixels=5)
    assert prepare(GOOD, "x.png", max_pixels=6) == GOOD
    assert prepare(huge_header_png(), "x.png", max_pixels=None)
    if checks._nvimgcodec() is not None:
        monkeypatch.setattr(checks, "_physical_memory", lambda: 1 << 30)
        with pytest.raises(CorruptImageError, match="more than this machine's memory"):
            prepare(huge_header_png(), "x.png", max_pixels=None)
    with pytest.raises(ValueError, match="Received: max_pixels=0"):
        check_max_pixels(0)


def test_png_chunk_type_letters_and_image_data_like_libpng():
    """libpng refuses a chunk type that is not four letters, image data that ends
    before the last row, and a row filter over 4 (Pillow lets the last two through)."""
    from dali_loader.feed.checks import png_data_problem

    assert check_png(png(ihdr(), chunk(b"gA\xe6A", b"1234"), idat(), IEND)) == (
        "invalid chunk type b'gA\\xe6A'")
    assert png_data_problem(GOOD) is None
    short = chunk(b"IDAT", zlib.compress(b"\x00" + bytes(9)))
    assert png_data_problem(png(ihdr(), short, IEND)) == "not enough image data"
    bad_filter = chunk(b"IDAT", zlib.compress(b"\x07" + bytes(9) + b"\x00" + bytes(9)))
    assert png_data_problem(png(ihdr(), bad_filter, IEND)) == "bad adaptive filter value"
    cut = chunk(b"IDAT", zlib.compress(b"\x00" + bytes(9) * 2 + b"\x00" * 50)[:-8])
    assert png_data_problem(png(ihdr(), cut, IEND)) in ("the image data stream ends early",
                                                        "not enough image data")


def test_decoder_header_problem_refuses_what_dalis_parser_cannot_take(pngs):
    """What DALI 2.4's decoder would fail on in its shared setup step (a segfault
    for batches of 32 or more) is refused by `prepare`, naming the file; sound
    files of every kind DALI gets pass unchanged."""
    pytest.importorskip("nvidia.nvimgcodec")
    from dali_loader.feed.checks import decoder_header_problem

    rng = np.random.default_rng(0)
    bad_jpeg = b"\xff\xd8\xff\xe0" + rng.integers(0, 256, 300, dtype=np.uint8).tobytes()
    bad_bmp = (b"BM" + struct.pack("<IHHI", 400, 0, 0, 54) + struct.pack("<IiiHH", 7, 32, 32, 1, 24)
               + rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    huge16 = (PNG_SIGNATURE + ihdr(32, (1 << 31) - 1, depth=16)
              + chunk(b"IDAT", zlib.compress(b"\0" * 97)) + chunk(b"IEND", b""))
    for data, words in ((bad_jpeg, "cannot read its header"), (bad_bmp, "cannot read its header"),
                        (huge16, "more than this machine's memory")):
        assert words in decoder_header_problem(data)
        with pytest.raises(CorruptImageError, match=words) as e:
            prepare(data, "x/bad.img", max_pixels=None)
        assert e.value.path == "x/bad.img"
    pixels = rng.integers(0, 256, (30, 40, 3), np.uint8)
    for fmt in ("JPEG", "BMP", "PNG", "GIF"):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format=fmt)
        out = prepare(buf.getvalue(), "x/good.img")
        assert decoder_header_problem(out) is None, fmt
        if fmt != "GIF":  # DALI gets a GIF as a PNG
            assert out == buf.getvalue()
    from support.helpers import valid_pngs

    for f in valid_pngs(pngs):
        assert decoder_header_problem(prepare(f.read_bytes(), str(f))) is None, f.name
