"""The compact GPU-ready entry form (issue 38): `formats.compact` and the native core's
entry decode (`entry_core.cc`), exact on sound entries, refusing hostile ones."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from dali_loader.formats import compact
from support import fuzz_entry
from support.pngs import photo

pytestmark = pytest.mark.skipif(not compact.available(), reason=compact.BUILD_HINT)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _pixels(rng, h: int, w: int, c: int) -> np.ndarray:
    px = photo(rng, h, w)
    if c == 1:
        return np.ascontiguousarray(px[:, :, :1])
    if c == 4:
        return np.concatenate([px, rng.integers(0, 256, (h, w, 1), dtype=np.uint8)], 2)
    return px


def _chunks(entry: bytes) -> list[bytes]:
    head = compact.read_header(entry)
    sizes = struct.unpack_from(f"<{head.chunks}I", entry, compact.FIXED_HEADER)
    at, out = compact.FIXED_HEADER + 4 * head.chunks, []
    for n in sizes:
        out.append(entry[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("shape", [(1, 1, 1), (375, 500, 3), (32, 32, 3), (7, 300, 4),
                                   (1000, 33, 1), (2, 40000, 3)])
@pytest.mark.parametrize("filt", [compact.FILTER_NONE, compact.FILTER_UP, compact.FILTER_SUB])
def test_round_trip_native_and_reference(shape, filt):
    """Every filter, 1/3/4 channels, one chunk to hundreds, rows longer than a chunk:
    the core and numpy's reference both give the pixels back; the header says it all."""
    px = _pixels(np.random.default_rng(sum(shape) + filt), *shape)
    for chunk in (compact.CHUNK_BYTES, 100):
        entry = compact.encode(px, filt, 1, chunk)
        head = compact.info(entry)
        assert head.shape == shape and head.filter == filt and head.chunk_bytes == chunk
        assert head.chunks == -(-px.size // chunk)
        assert head.crc32 == zlib.crc32(px.tobytes())
        np.testing.assert_array_equal(compact.decode(entry), px)
        np.testing.assert_array_equal(compact.decode_reference(entry), px)


def test_chunks_are_standard_zstd_frames_of_the_filtered_rows():
    """Each chunk is one zstd frame (its magic; libzstd alone decompresses it) of the
    row-delta bytes, split every 64 KiB: what a GPU's batched Zstd and a prefix sum undo."""
    px = _pixels(np.random.default_rng(1), 375, 500, 3)
    entry = compact.encode(px)
    filtered = compact.filter_pixels(px, compact.FILTER_UP).reshape(-1)
    chunks = _chunks(entry)
    assert len(chunks) == 9
    got = b"".join(compact.zstd_frame(f, min(compact.CHUNK_BYTES, filtered.size - k * 65536))
                   for k, f in enumerate(chunks))
    assert all(f[:4] == ZSTD_MAGIC for f in chunks)
    assert got == filtered.tobytes()
    try:
        import zstandard
    except ImportError:
        return
    d = zstandard.ZstdDecompressor()
    assert b"".join(d.decompress(f) for f in chunks) == filtered.tobytes()


def test_default_form_is_smaller_than_raw_pixels():
    """Photo-like pixels: the default (row delta, zstd-1) under the raw size, and
    under the unfiltered pixels' zstd."""
    px = _pixels(np.random.default_rng(2), 375, 500, 3)
    assert len(compact.encode(px)) < 0.7 * px.size
    assert len(compact.encode(px)) < 0.9 * len(compact.encode(px, compact.FILTER_NONE))
    assert compact.read_header(compact.encode(px)).filter == compact.FILTER_UP


def test_decode_into_the_callers_memory():
    px = _pixels(np.random.default_rng(3), 30, 20, 3)
    entry = compact.encode(px)
    out = np.zeros(px.size + 10, np.uint8)
    compact.decode_into(entry, out)
    np.testing.assert_array_equal(out[:px.size].reshape(px.shape), px)
    given = []
    got = compact.decode(entry, alloc=lambda n: given.append(np.empty(n + 5, np.uint8)) or given[0])
    assert np.shares_memory(got, given[0])
    with pytest.raises(compact.EntryError, match="smaller than the entry's pixels"):
        compact.decode_into(entry, np.empty(px.size - 1, np.uint8))


def test_bad_arguments_say_what_was_received():
    with pytest.raises(ValueError, match=r"Received: shape=\(3, 3\)"):
        compact.encode(np.zeros((3, 3), np.uint8))
    with pytest.raises(ValueError, match="Received: shape=.*chunk_bytes=8"):
        compact.encode(np.zeros((3, 3, 3), np.uint8), chunk_bytes=8)
    with pytest.raises(compact.EntryError, match="no DLZ1 magic.*Received: 3 bytes"):
        compact.info(b"abc")
    with pytest.raises(compact.EntryError, match="more pixels than max_pixels"):
        compact.info(compact.encode(np.zeros((10, 10, 3), np.uint8)), max_pixels=99)


def test_every_cut_and_every_bit_flip_is_refused():
    """Torn and bit-flipped entries: every truncation and every single-bit flip of a
    two-chunk entry is refused by the core (its checks or the pixels' CRC-32) and by
    numpy's reference; none decodes to other pixels."""
    px = _pixels(np.random.default_rng(4), 9, 13, 3)
    entry = compact.encode(px, compact.FILTER_UP, 1, 256)
    assert compact.info(entry).chunks == 2
    for n in range(len(entry)):
        with pytest.raises(compact.EntryError):
            compact.decode(entry[:n])
    refused = 0
    for i in range(len(entry) * 8):
        bad = bytearray(entry)
        bad[i // 8] ^= 1 << (i % 8)
        try:
            got = compact.decode(bytes(bad))
        except compact.EntryError:
            refused += 1
            continue
        np.testing.assert_array_equal(got, px)  # a flip that changes nothing decoded
    assert refused >= len(entry) * 8 - 8, refused
    with pytest.raises(compact.EntryError, match="bytes after the last chunk"):
        compact.info(bytes(entry) + b"\0")


def test_mutants_are_refused_or_exact():
    """5,000 stacked mutants (torn, flipped, foreign headers and chunks, boundary
    fields): each refused by the core, or decoded to exactly its source's pixels."""
    decoded = 0
    for data, px in fuzz_entry.mutants(5000, seed=7):
        try:
            got = compact.decode(data)
        except compact.EntryError:
            continue
        decoded += 1
        np.testing.assert_array_equal(got, px)
    assert decoded < 250, decoded  # the mutations hit: most are refused


@pytest.mark.slow
def test_sanitizer_over_mutated_entries():
    """The entry decoder under ASan + UBSan (`fuzz_driver ... entry`): 20,000 mutants
    and the sound entries, no finding; what it decodes is the source's pixels. The same
    run from the command line: `PYTHONPATH=tests python -m support.fuzz_entry`."""
    from support.helpers import sanitizer_driver

    from support.fuzz_png import run_driver

    driver = sanitizer_driver()
    bases = fuzz_entry.entry_bases()
    result, lines = run_driver(driver, [e for e, _ in bases], verbose=True, entries=True)
    assert result.ok == len(bases)
    assert lines == [f"ok {zlib.crc32(px.tobytes()):08x}" for _, px in bases]
    pairs = list(fuzz_entry.mutants(20_000, seed=11))
    result, lines = run_driver(driver, [d for d, _ in pairs], verbose=True, entries=True)
    assert result.files == 20_000 and result.fallback > 18_000, result
    for line, (_, px) in zip(lines, pairs):
        if line.startswith("ok"):
            assert line == f"ok {zlib.crc32(px.tobytes()):08x}"
    # Raw entries (the TF op copies them for files the feed decoded), through the same
    # `dl_entry_decode_as`: the sound ones exact; of 5,000 mutants each refused, or copied
    # byte for byte when its header and size still agree (the raw form has no checksum:
    # the op copies raw entries only from memory, decoded by the feed).
    raw = fuzz_entry.raw_bases()
    result, lines = run_driver(driver, [e for e, _ in raw], verbose=True, entries=True)
    assert lines == [f"ok {zlib.crc32(px.tobytes()):08x}" for _, px in raw]
    pairs = list(fuzz_entry.mutants(5_000, seed=12, bases=raw))
    result, lines = run_driver(driver, [d for d, _ in pairs], verbose=True, entries=True)
    assert result.files == 5_000 and result.fallback > 4_000, result
    for line, (data, px) in zip(lines, pairs):
        if line.startswith("ok"):
            assert line == f"ok {zlib.crc32(data[16:]):08x}"


def test_zstd_source_is_the_sdists_amalgamation(monkeypatch, tmp_path):
    """build.py takes zstd.c/zstd.h from the zstandard sdist (DL_ZSTD_SOURCE names a local
    copy); anything else is refused, saying what it received."""
    import tarfile

    from dali_loader.native import build

    monkeypatch.setattr(build, "_ZSTD_DIR", tmp_path / "zstd")
    monkeypatch.setenv("DL_ZSTD_SOURCE", str(tmp_path / "zstd.c"))
    with pytest.raises(FileNotFoundError, match="Received: DL_ZSTD_SOURCE="):
        build.zstd_source()
    fake = tmp_path / "zstandard-0.0.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        for name in build.ZSTD_FILES:
            (tmp_path / name).write_text(f"/* {name} */\n")
            tar.add(tmp_path / name, arcname=f"zstandard-0.0/zstd/{name}")
    monkeypatch.setenv("DL_ZSTD_SOURCE", str(fake))
    got = build.zstd_source()
    assert got == tmp_path / "zstd" / "zstd.c" and got.read_text() == "/* zstd.c */\n"
