"""The formats layer (`dali_loader.formats`): the one PNG chunk reader, sniffing and
sizes, the raw-entry codec and the disk cache's entry header. No TF, no DALI."""

from __future__ import annotations

import json
import re
import struct
import zlib

import numpy as np
import pytest

from dali_loader.formats import cache_entry, limits, png, ready, sniff
from support.pngs import encode_png


def chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def ihdr_body(w=3, h=2, depth=8, color=2, comp=0, filt=0, interlace=0) -> bytes:
    return struct.pack(">IIBBBBB", w, h, depth, color, comp, filt, interlace)


def small_png(*extra: bytes, **ihdr) -> bytes:
    raw = b"".join(b"\x00" + bytes(9) for _ in range(2))  # 2 rows of 3 RGB pixels, filter 0
    return (png.SIGNATURE + chunk(b"IHDR", ihdr_body(**ihdr)) + b"".join(extra)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


GOOD = small_png(chunk(b"gAMA", struct.pack(">I", 45455)))


def types(data: bytes, pos: int = 8) -> list[bytes]:
    return [t for _, _, t, _ in png.chunks(data, pos)]


# -- IHDR ---------------------------------------------------------------------------


def test_read_ihdr_gives_the_fields_and_refuses_a_damaged_one():
    assert png.read_ihdr(GOOD) == png.Ihdr(3, 2, 8, 2, 0, 0, 0)
    assert png.ihdr(GOOD) == png.read_ihdr(GOOD)
    assert png.size(GOOD) == (3, 2)
    bad_crc = bytearray(GOOD)
    bad_crc[20] ^= 1  # inside IHDR's data: its CRC no longer holds
    assert png.read_ihdr(bytes(bad_crc)) is None
    assert png.read_ihdr(b"\x00" + GOOD[1:]) is None  # the signature
    assert png.read_ihdr(GOOD[:32]) is None  # cut inside IHDR's CRC
    long_ihdr = png.SIGNATURE + chunk(b"IHDR", ihdr_body() + b"\x00") + GOOD[33:]
    assert png.read_ihdr(long_ihdr) is None  # IHDR is 13 bytes long
    assert png.size(GOOD[:23]) is None and png.size(b"x" * 24) is None


@pytest.mark.parametrize("fields, problem", [
    ({}, None),
    ({"w": 0}, "zero image size 0x2"),
    ({"h": 2**31}, f"invalid image size 3x{2**31}"),
    ({"color": 1}, "invalid colour type 1"),
    ({"color": 2, "depth": 4}, "invalid bit depth 4 for colour type 2"),
    ({"color": 3, "depth": 16}, "invalid bit depth 16 for colour type 3"),
    ({"comp": 1}, "invalid compression, filter or interlace method"),
    ({"filt": 1}, "invalid compression, filter or interlace method"),
    ({"interlace": 2}, "invalid compression, filter or interlace method"),
])
def test_ihdr_problem_names_what_libpng_refuses(fields, problem):
    assert png.ihdr_problem(png.unpack_ihdr(ihdr_body(**fields))) == problem


def test_every_depth_table_entry_is_accepted_and_nothing_else():
    for color in range(8):
        for depth in range(33):
            ok = png.ihdr_problem(png.unpack_ihdr(ihdr_body(depth=depth, color=color))) is None
            assert ok == (depth in png.DEPTHS.get(color, ())), (color, depth)


# -- chunks and CRCs ----------------------------------------------------------------


def test_chunks_yield_every_whole_chunk_in_order_and_past_iend():
    assert types(GOOD) == [b"IHDR", b"gAMA", b"IDAT", b"IEND"]
    pos, length, ctype, end = next(png.chunks(GOOD))
    assert (pos, length, ctype, end) == (8, 13, b"IHDR", 33)
    assert bytes(png.body(GOOD, pos, end)) == ihdr_body()
    assert types(GOOD, png.IHDR_END) == [b"gAMA", b"IDAT", b"IEND"]
    trailing = GOOD + chunk(b"tEXt", b"k\x00v")  # stopping at IEND is the walker's
    assert types(trailing)[-2:] == [b"IEND", b"tEXt"]
    assert types(png.SIGNATURE) == []


def test_chunks_raise_where_a_chunk_is_cut_short():
    with pytest.raises(png.ChunkError) as e:
        list(png.chunks(GOOD + b"\x00\x00\x00"))  # 3 bytes: no length and type
    assert (e.value.pos, e.value.type) == (len(GOOD), None)
    assert "Received: type=None" in str(e.value)
    idat_at = GOOD.index(b"IDAT") - 4
    with pytest.raises(png.ChunkError) as e:
        list(png.chunks(GOOD[:idat_at + 10]))  # IDAT's length runs past the end
    assert (e.value.pos, e.value.type) == (idat_at, b"IDAT")
    huge = png.SIGNATURE + struct.pack(">I4s", 0x80000000, b"IDAT") + bytes(64)
    with pytest.raises(png.ChunkError):
        list(png.chunks(huge))  # a length over 2**31 - 1
    assert isinstance(e.value, ValueError)


def test_every_truncation_ends_or_raises_chunk_error_never_anything_else():
    whole = [end for _, _, _, end in png.chunks(GOOD)]
    for cut in range(8, len(GOOD) + 1):
        try:
            ends = [end for _, _, _, end in png.chunks(GOOD[:cut])]
        except png.ChunkError as e:
            assert cut not in whole and e.pos < cut
        else:
            assert cut in whole + [8] and ends == [e for e in whole if e <= cut]


def test_crc_ok_checks_type_and_data_and_copies_no_large_chunk():
    for pos, _, _, end in png.chunks(GOOD):
        assert png.crc_ok(GOOD, pos, end)
    for flip in (12, 14, 20, 29, 32):  # IHDR's type, data and stored CRC
        bad = bytearray(GOOD)
        bad[flip] ^= 0x10
        assert not png.crc_ok(bytes(bad), 8, 33), flip
    big = png.SIGNATURE + chunk(b"IDAT", bytes(range(256)) * 64)  # over 4096 bytes: a view
    assert png.crc_ok(big, 8, len(big)) and png.crc_ok(memoryview(big), 8, len(big))
    bad = bytearray(big)
    bad[5000] ^= 1
    assert not png.crc_ok(bad, 8, len(bad))


@pytest.mark.parametrize("ctype, body, significant", [
    (b"gAMA", struct.pack(">I", 100000), False),
    (b"gAMA", struct.pack(">I", 95000), False),  # 5% from 1.0: not significant
    (b"gAMA", struct.pack(">I", 94999), True),
    (b"gAMA", struct.pack(">I", 45455), True),
    (b"gAMA", b"\x00\x01\x86", True),  # not 4 bytes long
    (b"sRGB", b"\x00", True),
    (b"iCCP", b"x\x00\x00", True),
    (b"cHRM", bytes(32), False),
])
def test_gamma_significant_as_libpng(ctype, body, significant):
    data = png.SIGNATURE + chunk(ctype, body)
    assert png.gamma_significant(data, 8, len(body), ctype) is significant


def test_first_and_idat_read_a_walked_file():
    trns = small_png(chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03"))
    assert bytes(png.first(trns, b"tRNS")) == b"\x00\x01\x00\x02\x00\x03"
    assert png.first(GOOD, b"tRNS") is None
    after_idat = GOOD[:-12] + chunk(b"tRNS", b"\x00" * 6) + GOOD[-12:]
    assert png.first(after_idat, b"tRNS") is None  # only before IDAT
    split = zlib.compress(b"".join(b"\x00" + bytes(9) for _ in range(2)))
    two = (png.SIGNATURE + chunk(b"IHDR", ihdr_body()) + chunk(b"IDAT", split[:5])
           + chunk(b"IDAT", split[5:]) + chunk(b"IEND", b""))
    assert b"".join(png.idat(two)) == split
    assert png.idat(two[:-5]) == png.idat(two)  # a cut IEND: what came before


def test_critical_is_the_case_of_the_first_letter():
    assert png.critical(b"IDAT") and png.critical(b"ABCD")
    assert not png.critical(b"tEXt") and not png.critical(b"gAMA")


# -- PngSuite, every file -----------------------------------------------------------

# What the reader sees in each of PngSuite's corrupt files.
CORRUPT = {
    "xs1n0g01": "signature", "xs2n0g01": "signature", "xs4n0g01": "signature",
    "xs7n0g01": "signature", "xcrn0g04": "signature", "xlfn0g04": "signature",
    "xhdn0g08": "IHDR CRC",
    "xc1n0g08": "invalid colour type 1", "xc9n2c08": "invalid colour type 9",
    "xd0n2c08": "invalid bit depth 0 for colour type 2",
    "xd3n2c08": "invalid bit depth 3 for colour type 2",
    "xd9n2c08": "invalid bit depth 99 for colour type 2",
    "xdtn0g01": "no IDAT", "xcsn0g01": "IDAT CRC",
}
NAMED = re.compile(r"^[a-z0-9]{3}([in])([02346])[gcpa](\d\d)$")  # e.g. basi0g01: interlaced grey 1-bit


def test_every_pngsuite_file(pngsuite):
    files = sorted(pngsuite.glob("*.png"))
    assert len(files) >= 170
    assert {p.stem for p in files} >= set(CORRUPT)
    named = 0
    for p in files:
        data = p.read_bytes()
        what = CORRUPT.get(p.stem)
        if what == "signature":
            assert sniff.sniff(data) is None and png.read_ihdr(data) is None, p.name
            continue
        assert sniff.sniff(data) == "png", p.name
        chunks = list(png.chunks(data))  # every file here is whole: no ChunkError
        kinds = [t for _, _, t, _ in chunks]
        bad_crc = [t for pos, _, t, end in chunks if not png.crc_ok(data, pos, end)]
        assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND", p.name
        assert chunks[-1][3] == len(data), p.name  # nothing after IEND
        h = png.read_ihdr(data)
        if what == "IHDR CRC":
            assert h is None and bad_crc == [b"IHDR"], p.name
            continue
        assert h is not None and sniff.image_size(data) == (h.width, h.height), p.name
        if what == "IDAT CRC":
            assert bad_crc == [b"IDAT"], p.name
            continue
        assert bad_crc == [], p.name
        if what == "no IDAT":
            assert b"IDAT" not in kinds, p.name
            continue
        assert b"IDAT" in kinds, p.name
        assert png.ihdr_problem(h) == (what if what else None), p.name
        if what:
            continue
        match = NAMED.match(p.stem)
        if match:  # the name says interlace, colour type and bit depth
            named += 1
            assert (h.interlace, h.color_type, h.depth) == (
                match[1] == "i", int(match[2]), int(match[3])), p.name
    assert named >= 140


# -- sniffing and sizes -------------------------------------------------------------


def _jpeg(w: int, h: int, before_sof: bytes = b"") -> bytes:
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + before_sof + sof + b"\xff\xd9"


def test_sniff_and_image_size_of_each_format():
    assert sniff.sniff(GOOD) == "png" and sniff.image_size(GOOD) == (3, 2)
    assert sniff.sniff(memoryview(GOOD)) == "png"
    jpeg = _jpeg(640, 480)
    assert sniff.sniff(jpeg) == "jpeg" and sniff.image_size(jpeg) == (640, 480)
    app = b"\xff\xe0" + struct.pack(">H", 16) + bytes(14)
    assert sniff.image_size(_jpeg(7, 5, app)) == (7, 5)
    assert sniff.image_size(b"\xff\xd8\xff\xda\x00\x02") is None  # scan before a frame
    gif = b"GIF89a" + struct.pack("<HH", 10, 20) + bytes(8)
    assert sniff.sniff(gif) == "gif" and sniff.image_size(gif) == (10, 20)
    bmp = b"BM" + bytes(12) + struct.pack("<Iii", 40, 30, -40)
    assert sniff.sniff(bmp) == "bmp" and sniff.image_size(bmp) == (30, 40)
    os2 = b"BM" + bytes(12) + struct.pack("<IHH", 12, 8, 9) + bytes(4)
    assert sniff.image_size(os2) == (8, 9)
    assert sniff.sniff(b"hello") is None and sniff.image_size(b"hello") is None
    assert sniff.image_size(jpeg, "png") is None  # the caller's kind is taken


def test_read_head_reads_past_a_long_jpeg_prefix(tmp_path):
    long_app = b"\xff\xe1" + struct.pack(">H", 9000) + bytes(8998)
    jpeg = _jpeg(123, 45, long_app)
    path = tmp_path / "late_sof.jpg"
    path.write_bytes(b"junk" + jpeg)
    head = sniff.read_head(str(path), offset=4)
    assert head == jpeg and sniff.image_size(head) == (123, 45)
    path.write_bytes(GOOD)
    assert sniff.read_head(str(path)) == GOOD  # shorter than HEAD_BYTES: all of it


# -- limits -------------------------------------------------------------------------


def test_the_pixel_limits_are_ordered_and_memory_is_known():
    assert limits.DEFAULT_MAX_PIXELS == 1 << 30 and limits.CORE_MAX_PIXELS == 1 << 28
    assert limits.BIG_PNG_PIXELS == 1 << 26 and limits.WUFFS_SIDE_LIMIT == 1 << 20
    assert limits.BIG_PNG_PIXELS < limits.CORE_MAX_PIXELS < limits.DEFAULT_MAX_PIXELS
    assert limits.physical_memory() > 1 << 28


# -- the raw entry ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 3), (5, 4, 4), (300, 1, 3)])
def test_raw_entry_round_trip(shape):
    pixels = np.random.default_rng(0).integers(0, 256, shape, np.uint8)
    entry = ready.encode_raw(pixels)
    assert entry[:4] == ready.RAW_MAGIC and len(entry) == ready.RAW_HEADER + pixels.size
    assert ready.raw_header(shape) == entry[:ready.RAW_HEADER]
    assert ready.raw_shape(entry[:ready.RAW_HEADER]) == shape
    np.testing.assert_array_equal(ready.decode_raw(entry), pixels)
    assert bytes(ready.join_parts(ready.encode_parts(pixels, ready.ReadyForm.RAW))) == entry
    np.testing.assert_array_equal(ready.decode(entry, ready.ReadyForm.RAW), pixels)


def test_raw_entry_rejections():
    entry = ready.encode_raw(np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match="bad magic"):
        ready.raw_shape(b"XXXX" + entry[4:])
    with pytest.raises(ValueError, match="bad magic"):
        ready.raw_shape(entry[:15])
    with pytest.raises(ValueError, match="does not hold 2x2x3 pixels"):
        ready.decode_raw(entry[:-1])
    with pytest.raises(ValueError, match=r"Received: shape=\(2, 2\)"):
        ready.encode_raw(np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="dtype=float32"):
        ready.encode_raw(np.zeros((2, 2, 3), np.float32))


# -- the disk cache's entry header --------------------------------------------------


def test_entry_header_round_trip():
    fields = {"bucket": "b", "name": "a/b.png", "generation": "7", "size": 5,
              "crc32c": "AAAAAA==", "md5": None}
    head = cache_entry.pack_header(fields)
    assert head[:4] == cache_entry.MAGIC
    end = cache_entry.header_end(head)
    assert end == len(head) == cache_entry.PREFIX + len(json.dumps(fields))
    entry = head + b"12345"
    assert cache_entry.header_end(entry[:cache_entry.PREFIX]) == end  # the prefix says it
    assert cache_entry.read_header(entry, end) == fields
    assert entry[end:] == b"12345"
    assert cache_entry.read_header(memoryview(entry), end) == fields


def test_entry_header_rejections():
    head = cache_entry.pack_header({"name": "x"})
    assert cache_entry.header_end(b"DLC2" + head[4:]) is None  # another magic
    assert cache_entry.header_end(head[:7]) is None  # no length yet
    end = cache_entry.header_end(head)
    with pytest.raises(ValueError, match="cut short"):
        cache_entry.read_header(head[:-1], end)
    with pytest.raises(ValueError):  # not JSON
        cache_entry.read_header(head[:-2] + b"!}", end)
    listed = cache_entry.pack_header([1, 2])  # JSON, but not an object
    with pytest.raises(ValueError, match="not a JSON object"):
        cache_entry.read_header(listed, cache_entry.header_end(listed))


# -- the walkers on the reader: each keeps its own words ----------------------------


def test_each_walker_names_a_cut_file_in_its_own_words():
    from dali_loader.decode import png_cpu
    from experimental.png_gpu import parse
    from dali_loader.feed import checks

    data = encode_png(np.random.default_rng(1).integers(0, 256, (20, 20, 3), np.uint8))
    idat_at = data.index(b"IDAT") - 4
    cut = data[:idat_at + 20]
    assert checks.check_png(cut) == "truncated inside the b'IDAT' chunk"
    assert png_cpu.read_header(cut) == png.Fallback("a chunk runs past the end")
    assert parse.parse_png(cut) == png.Fallback("chunk b'IDAT' runs past the end of the file")
    short = data[:-3]  # inside IEND's CRC
    assert checks.check_png(short) == "truncated inside the b'IEND' chunk"
    assert png_cpu.read_header(short) == png.Fallback("no IEND chunk")
    assert parse.parse_png(short) == png.Fallback("truncated chunk")
    assert checks.check_png(data[:-12]) == "truncated (no IEND chunk)"
    assert parse.parse_png(data[:-12]) == png.Fallback("no IEND chunk")
    assert png_cpu.Fallback is parse.Fallback is png.Fallback
