"""The native PNG core (png_core.cc through ctypes, `decode/png_native.py`): exactly
`tf.io.decode_png`'s outcome (the same pixels, or a fallback to TF) on PngSuite,
photos with every filter type and the seeded mutation corpus, in 1, 3 and 4 channels;
no allocation sized from a header over `max_pixels`; thread safety; and the
ASan + UBSan fuzz run of the core (slow)."""

from __future__ import annotations

import collections
import io
import resource
import shutil
import struct
import threading
import zlib

import numpy as np
import pytest

from dali_loader.decode import png_cpu, png_native
from dali_loader.decode.png_cpu import Fallback
from support.fuzz_png import mutation_bases, run_driver, sources, stacked_mutants
from support.mutate import MUTATIONS, corpus, huge_header_png, mutate
from support.pngs import chunk, encode_png, photo, photo_png
from support.helpers import png_outcome, refuses_flipped_idats, tf_outcome

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.skipif(not png_native.available(),
                                reason=f"{png_native.unavailable_reason()}")

MODES = (1, 3, 4)


def compare(data: bytes, channels: int) -> str:
    """'fast' (TF's pixels), 'fallback' (left to TF), 'fallback-rejected' (left to TF,
    which rejects it), or what went wrong."""
    return png_outcome(png_native.decode_png, data, channels)


def _check_all(named: list[tuple[str, bytes]]) -> collections.Counter:
    outcomes, wrong = collections.Counter(), []
    for name, data in named:
        for c in MODES:
            o = compare(data, c)
            outcomes[o] += 1
            if o not in ("fast", "fallback", "fallback-rejected"):
                wrong.append((name, c, o))
    assert not wrong, wrong[:20]
    return outcomes


def test_generated_corpus_every_mode():
    """Every colour type x bit depth x interlace (Adam7 too) x tRNS/gAMA/sRGB/iCCP
    variant (`tests/support/png_corpus`), and its corrupt files, in 1, 3 and 4 channels."""
    from support import png_corpus

    outcomes = _check_all(sorted(png_corpus.corpus().items()))
    # Most are the core's (every depth, both interlace methods, palettes with tRNS);
    # TF keeps tRNS colour keys and gamma greys; the corrupt files are TF's to reject.
    # 1,525 of 2,217 (739 files x 3) here: interlaced 1x1 files go to TF (one row high).
    assert outcomes["fast"] >= 1500, outcomes
    assert outcomes["fallback-rejected"] >= 19 * 3, outcomes


def test_pngsuite_every_file_every_mode(pngsuite):
    files = [(p.name, p.read_bytes()) for p in sorted(pngsuite.glob("*.png"))]
    outcomes = _check_all(files)
    # Every colour type, bit depth and interlacing is the core's; it leaves tRNS
    # colour keys and gamma-converted greys to TF, and TF rejects the corrupt x* files.
    assert outcomes["fast"] >= 440, outcomes
    assert outcomes["fallback-rejected"] >= 14 * 3, outcomes


def test_mutation_corpus_outcome_equals_tf():
    """3,000 damaged files x 3 colour modes: TF's pixels, or left to TF."""
    named = list(corpus(mutation_bases(), 3000, seed=21))
    outcomes = _check_all(named)
    assert {name.split("_", 1)[1][:-4] for name, _ in named} == set(MUTATIONS)
    assert outcomes["fast"] > 1500 and outcomes["fallback-rejected"] > 7000, outcomes


@pytest.mark.parametrize("filters", [(0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)])
@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_photos_every_filter_type(filters, c):
    data = photo_png(filters, c)
    for mode in MODES:
        assert compare(data, mode) == "fast", (filters, c, mode)


def test_same_decisions_as_the_python_front_end():
    """The core takes exactly the files png_cpu (pywuffs) takes, with the same pixels."""
    if not png_cpu.available():
        pytest.skip("pywuffs is not installed")
    from support import png_corpus

    bases = mutation_bases()
    for name, data in [*corpus(bases, 600, seed=5), *(("base", b) for b in bases),
                       *png_corpus.corpus().items()]:
        for c in MODES:
            ours, theirs = png_native.decode_png(data, c), png_cpu.decode_png(data, c)
            assert isinstance(ours, Fallback) == isinstance(theirs, Fallback), (name, c, ours)
            if not isinstance(ours, Fallback):
                np.testing.assert_array_equal(ours, theirs)


def test_checksums_are_on():
    """A flipped compressed IDAT byte with the chunk CRC fixed (zlib's Adler-32 or
    the deflate stream catches it), and a bad IDAT CRC: TF refuses, so must the core."""
    assert refuses_flipped_idats(png_native.decode_png) > 100
    good = encode_png(photo(np.random.default_rng(3), 40, 40), (4,))
    at = good.index(b"IDAT")
    n = struct.unpack(">I", good[at - 4:at])[0]
    crc = at + 4 + n
    bad_crc = good[:crc] + bytes([good[crc] ^ 1]) + good[crc + 1:]
    assert tf_outcome(bad_crc, 3) is None
    assert isinstance(png_native.decode_png(bad_crc, 3), Fallback)


def test_rgba_alpha_of_low_bit_depth_files_is_tfs():
    """TF's RGBA of a 1/2/4-bit grey or palette file without tRNS: alpha (1 << depth) - 1."""
    rng = np.random.default_rng(11)
    for depth in (1, 2, 4):
        for color in (0, 3):
            w, h = 13, 7
            row_bytes = (w * depth + 7) // 8
            raw = b"".join(b"\x00" + rng.integers(0, 256, row_bytes, dtype=np.uint8).tobytes()
                           for _ in range(h))
            parts = chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0))
            if color == 3:
                parts += chunk(b"PLTE", rng.integers(0, 256, 3 << depth, dtype=np.uint8).tobytes())
            data = (b"\x89PNG\r\n\x1a\n" + parts + chunk(b"IDAT", zlib.compress(raw))
                    + chunk(b"IEND", b""))
            got = png_native.decode_png(data, 4)
            assert not isinstance(got, Fallback), (depth, color, got)
            assert (got[:, :, 3] == (1 << depth) - 1).all(), (depth, color)
            assert compare(data, 4) == "fast"


def test_max_pixels_falls_back_before_allocating():
    """An image over `max_pixels` goes to TF from its header alone; headers claiming
    billions of pixels cost no memory."""
    data = encode_png(photo(np.random.default_rng(1), 40, 40), (1,))
    assert isinstance(png_native.decode_png(data, 3, max_pixels=1599), Fallback)
    assert png_native.decode_png(data, 3, max_pixels=1600).shape == (40, 40, 3)
    calls = []

    def alloc(nbytes):
        calls.append(nbytes)
        return np.empty(nbytes, np.uint8)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for w, h in ((1 << 20) - 1, (1 << 20) - 1), (1 << 16, 1 << 16), (60000, 50000):
        for c in MODES:
            got = png_native.decode_png(huge_header_png(w, h), c, alloc=alloc)
            assert isinstance(got, Fallback) and "larger" in got.reason, got
    # Mutants whose IHDR claims huge sizes: never planned over the limit.
    rng = np.random.default_rng(9)
    base = encode_png(photo(rng, 30, 30), (4,))
    for i in range(300):
        bad = mutate(base, "ihdr_edit", np.random.default_rng(i))
        for c in MODES:
            plan = png_native.plan_png(bad, c, max_pixels=1 << 20)
            if not isinstance(plan, Fallback):
                assert plan.shape[0] * plan.shape[1] <= 1 << 20
                png_native.decode_png(bad, c, max_pixels=1 << 20)
    assert calls == []
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, grown_mib


def test_decode_into_a_callers_buffer():
    data = encode_png(photo(np.random.default_rng(2), 30, 50), (4,))
    plan = png_native.plan_png(data, 3)
    assert plan.shape == (30, 50, 3) and plan.nbytes == 4500
    pool = np.full(8192, 7, np.uint8)
    got = png_native.decode_png_into(data, plan, pool)
    assert np.shares_memory(got, pool) and got.shape == (30, 50, 3)
    np.testing.assert_array_equal(got, tf_outcome(data, 3))
    assert (pool[4500:] == 7).all()  # nothing written past the image
    with pytest.raises(ValueError, match="at least 4500 bytes"):
        png_native.decode_png_into(data, plan, np.empty(4499, np.uint8))
    with pytest.raises(ValueError, match="Received: channels=2"):
        png_native.decode_png(data, 2)
    # Inputs other than bytes: a memoryview and a numpy array, no copy needed.
    np.testing.assert_array_equal(png_native.decode_png(memoryview(data), 3), got)
    np.testing.assert_array_equal(png_native.decode_png(np.frombuffer(data, np.uint8), 3), got)


def test_threads_decode_concurrently_and_exactly():
    """One decoder and work buffer per thread: 4 threads on mixed sizes and modes."""
    rng = np.random.default_rng(4)
    files = [encode_png(photo(rng, int(rng.integers(5, 200)), int(rng.integers(5, 200))), (4,))
             for _ in range(24)]
    want = {(i, c): tf_outcome(d, c) for i, d in enumerate(files) for c in MODES}
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(150):
            i, c = int(r.integers(0, len(files))), int(r.choice(MODES))
            got = png_native.decode_png(files[i], c)
            if isinstance(got, Fallback) or not np.array_equal(got, want[i, c]):
                errors.append((i, c))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:10]


@pytest.mark.slow
def test_sanitizer_fuzz_slice(pngsuite_if_present):
    """The core under ASan + UBSan (`build.py --sanitize`): the 3,000-file mutation corpus
    and 100,000 stacked mutants of more sources (each decoded in 3 modes into exact-size
    buffers) with no finding; the driver's pixels equal the optimised build's. The same
    run from the command line: `PYTHONPATH=tests python -m support.fuzz_png` (docs/png_cpu.md)."""
    from support.helpers import sanitizer_driver

    driver = sanitizer_driver()
    files = [d for _, d in corpus(mutation_bases(), 3000, seed=21)]
    result, lines = run_driver(driver, files, verbose=True)
    assert result.files == 3000 and result.ok > 1500, result
    # The sanitizer build decodes what the optimised one decodes, to the same pixels.
    for k, data in enumerate(files):
        for j, c in enumerate(MODES):
            line = lines[3 * k + j]
            got = png_native.decode_png(data, c, max_pixels=1 << 22)
            assert line.startswith("ok") != isinstance(got, Fallback), (k, c, line)
            if line.startswith("ok"):
                assert line == f"ok {zlib.crc32(got.tobytes()):08x}", (k, c)
    # 100,000 more (issue 27's fuzz run), in batches of 25,000 files per driver process.
    gen, done, ok = stacked_mutants(sources(pngsuite_if_present), 100_000, seed=1234), 0, 0
    while batch := [d for _, d in zip(range(25_000), gen)]:
        result, _ = run_driver(driver, batch)
        done, ok = done + result.files, ok + result.ok
    assert done == 100_000 and ok > 10_000, (done, ok)


@pytest.fixture
def pngsuite_if_present(request):
    try:
        return request.getfixturevalue("pngsuite")
    except pytest.skip.Exception:
        return None


def test_keras_pixels_decode_with_the_core_into_pooled_buffers():
    """The GPU-ready fill's decoder (`png_stage.KerasPixels`) runs the core where it is
    built, decoding into the buffers its `alloc` gives (TF's pooled ones by default);
    what the core leaves and other formats are TF's; a file TF rejects is named."""
    from PIL import Image

    from dali_loader.decode.png_stage import KerasPixels
    from dali_loader.errors import CorruptImageError

    rng = np.random.default_rng(5)
    px = photo(rng, 30, 40)
    jpeg = io.BytesIO()
    Image.fromarray(px).save(jpeg, format="JPEG")
    good = encode_png(px, (4,))
    keyed = encode_png(px, (4,), trns=b"\x00\x01\x00\x02\x00\x03")  # a tRNS key: TF's
    given = []

    def alloc(nbytes):
        given.append(np.empty(nbytes + 64, np.uint8))
        return given[-1]

    for stage in (KerasPixels(3, num_threads=2), KerasPixels(3, num_threads=2, alloc=alloc)):
        assert stage.decoder == "native"
        tally = collections.Counter()

        class Tally:
            def add(self, what, n=1):
                tally[what] += n

        for data in (good, jpeg.getvalue(), keyed):
            ref = tf.image.decode_image(data, channels=3, expand_animations=False).numpy()
            np.testing.assert_array_equal(stage(data, "x", Tally()), ref)
        assert tally == {"png_fast": 1, "png_fallbacks": 1}
        with pytest.raises(CorruptImageError, match="broken.png"):
            stage(good[:-20], "broken.png", Tally())
    # One buffer asked for (the fast PNG; the truncated one falls back from its chunks),
    # and the pixels returned are in it.
    assert len(given) == 1
    out = KerasPixels(3, 1, alloc=lambda n: given[0])(good, "x")
    assert np.shares_memory(out, given[0])


def test_build_is_idempotent_and_exports_the_c_api(monkeypatch):
    """`python -m dali_loader.native.build`: nothing rebuilt when up to date; the
    library exports png_core.h's three functions; no g++ is a clear error."""
    from dali_loader.native import build

    if not shutil.which("g++"):
        pytest.skip("no g++")
    lib = build.build()
    before = lib.stat().st_mtime_ns
    assert build.build() == lib and lib.stat().st_mtime_ns == before
    import ctypes

    handle = ctypes.CDLL(str(lib))
    for name in ("dl_png_plan_decode", "dl_png_output_size", "dl_png_decode_into"):
        assert hasattr(handle, name), name
    flags = build.link_flags()
    assert "-l:libdlpng.so" in flags and "-Wl,-rpath,$ORIGIN" in flags
    assert all(p.exists() for p in build.core_objects())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(RuntimeError, match="needs (gcc|g\\+\\+).*apt-get install g\\+\\+"):
        build.build()
