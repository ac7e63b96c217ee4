"""The batched PNG decoder (experimental/png_gpu, outside the package) without a GPU: its kernels under
numba-cuda's simulator, zlib standing in for nvCOMP behind the same interface.

Covered files must equal `tf.io.decode_png(channels=C)` (libpng, as Keras) bit for bit;
every other file must come back as a counted `Fallback` whose CPU decode equals TF's;
corrupt files must be named under on_error="raise" and recorded under "skip".
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from support.helpers import choose_cuda_simulator, fast_simulator

choose_cuda_simulator()
cuda = pytest.importorskip("numba.cuda")

from experimental.png_gpu import (  # noqa: E402
    PNG_GPU_VERIFIED, Fallback, PngDecodeStats, ZlibInflate, decode_pngs)
from experimental.png_gpu.cpu_fallback import finish  # noqa: E402
from dali_loader.errors import CorruptImageError  # noqa: E402
from dali_loader.feed.policy import EpochErrors, SkipReport  # noqa: E402
from support.pngs import broken_streams, chunk, encode_png, photo  # noqa: E402

from experimental.png_gpu import Launch  # noqa: E402

# Each simulated CUDA thread is a Python thread: small launches on the CPU.
SIM = Launch(adler_threads=16, unfilter_threads=8, expand_threads=1, expand_blocks=1)
MODES = (1, 3, 4)


@pytest.fixture(scope="module", autouse=True)
def simulator():
    yield from fast_simulator()


@pytest.fixture(scope="module")
def tf():
    from dali_loader.lazy import import_tf

    return import_tf()


def _ihdr(data: bytes) -> tuple[int, int]:
    """(bit depth, interlace) of a PNG with a sound IHDR."""
    return data[24], data[28]


def _suite(pngs):
    from support.helpers import valid_pngs

    files = valid_pngs(pngs)
    return [p.name for p in files], [p.read_bytes() for p in files]


def _gamma_to_grey(name: str, data: bytes) -> bool:
    """Whether the decoder leaves this file to libpng in grey (RGB -> grey through gamma
    tables): PngSuite's g* and ccwn2c08 files; the generated colour files with gAMA 1/2.2,
    sRGB or iCCP (an iCCP chunk: it steps aside too, though libpng ignores the corpus's
    too-short profile)."""
    if len(name) == 12 and name[0] == "g" and name[3] == "n":  # PngSuite's gNNn...: gAMA N/10
        return name[1:3] != "10"
    return name[0] in "cpr" and any(v in name for v in ("_gamma45_", "_srgb_", "_iccp_"))


def _raise(err):
    raise err


@pytest.mark.parametrize("channels", MODES)
def test_every_valid_png_bit_exact_or_fallback(pngs, tf, channels):
    """Every valid file of `pngs` (the generated corpus; PngSuite's too where present)."""
    names, blobs = _suite(pngs)
    stats = PngDecodeStats()
    got = decode_pngs(blobs, channels, backend=ZlibInflate(), launch=SIM, stats=stats)
    covered = [n for n, r in zip(names, got) if not isinstance(r, Fallback)]
    eight_bit_flat = {n for n, b in zip(names, blobs) if _ihdr(b) == (8, 0)}
    # Every 8-bit non-interlaced file is covered, except RGB -> grey with a gamma.
    gamma = {n for n, r in zip(names, got) if isinstance(r, Fallback) and "gamma" in r.reason}
    assert set(covered) == eight_bit_flat - gamma
    assert len(covered) >= 30  # not vacuous: 39 (grey) and 48 of the generated files
    if channels == 1:
        must = {n for n, b in zip(names, blobs) if n in eight_bit_flat and _gamma_to_grey(n, b)}
        assert must <= gamma & eight_bit_flat <= must | {"ccwn2c08.png"}  # PngSuite's cHRM file
    else:
        assert not gamma
    done = finish(got, blobs, names, channels, _raise)
    for name, data, img in zip(names, blobs, done):
        ref = tf.io.decode_png(data, channels=channels).numpy()
        assert img.shape == ref.shape and np.array_equal(np.asarray(img), ref), name
    assert stats.as_dict()["batched"] == len(covered)
    assert stats.as_dict()["fallback"] == len(names) - len(covered)


def _photo_pngs():
    """Photo-like PNGs with mixed filter rows, in every colour type, with tRNS keys."""
    rng = np.random.default_rng(7)
    rgb = photo(rng, 9, 13)
    grey = rgb[:, :, :1]
    alpha = rng.integers(0, 256, rgb.shape[:2] + (1,), dtype=np.uint8)
    pal = rng.integers(0, 256, (40, 3), dtype=np.uint8)
    idx = rng.integers(0, 40, rgb.shape[:2], dtype=np.uint8)
    key_rgb = struct.pack(">3H", *map(int, rgb[2, 3]))
    noise = rng.integers(0, 256, (6, 16, 3), dtype=np.uint8)  # every grey weight matters
    return {
        "rgb_noise": encode_png(noise, (0, 4)),
        "rgb_paeth": encode_png(rgb, (4,)),
        "rgb_mixed": encode_png(rgb, (0, 1, 2, 3, 4, 3, 2)),
        "rgb_trns": encode_png(rgb, (3, 1), trns=key_rgb),
        "rgba_mixed": encode_png(np.concatenate([rgb, alpha], 2), (2, 4, 1, 0, 3)),
        "grey_mixed": encode_png(grey, (1, 3, 4, 2)),
        "grey_trns": encode_png(grey, (4, 0), trns=struct.pack(">H", int(grey[0, 0, 0]))),
        "grey_alpha": encode_png(np.concatenate([grey, alpha], 2), (3, 4)),
        "palette_trns": encode_png(idx, (1, 4), palette=pal, trns=bytes(range(0, 250, 10))),
        "rgb_gamma_1": encode_png(rgb, (4, 2), extra_chunks=chunk(b"gAMA", struct.pack(">I", 100000))),
    }


@pytest.mark.parametrize("channels", MODES)
def test_photos_with_every_filter_bit_exact(tf, channels):
    pngs = _photo_pngs()
    with ThreadPoolExecutor(2) as pool:  # the host parse and packing in threads
        got = decode_pngs(list(pngs.values()), channels, backend=ZlibInflate(), launch=SIM,
                          executor=pool if channels == 3 else None)
    for name, data, img in zip(pngs, pngs.values(), got):
        assert not isinstance(img, Fallback), (name, img)
        ref = tf.io.decode_png(data, channels=channels).numpy()
        assert np.array_equal(img, ref), name


def test_significant_gamma_rgb_to_grey_differs_in_libpng_so_falls_back(tf):
    """The one libpng transform not reproduced: RGB -> grey through gamma tables."""
    rgb = photo(np.random.default_rng(3), 16, 16)
    plain = encode_png(rgb, (0,))
    gamma = encode_png(rgb, (0,), extra_chunks=chunk(b"gAMA", struct.pack(">I", 45455)))
    assert not np.array_equal(tf.io.decode_png(plain, channels=1).numpy(),
                              tf.io.decode_png(gamma, channels=1).numpy())
    got = decode_pngs([gamma], 1, backend=ZlibInflate(), launch=SIM)
    assert isinstance(got[0], Fallback) and "gamma" in got[0].reason
    got = decode_pngs([gamma], 3, backend=ZlibInflate(), launch=SIM)  # no gamma for RGB out
    assert np.array_equal(got[0], tf.io.decode_png(gamma, channels=3).numpy())


def test_device_side_checks_catch_bad_streams(tf):
    files = broken_streams(photo(np.random.default_rng(5), 12, 10))
    stats = PngDecodeStats()
    got = decode_pngs(list(files.values()), 3, backend=ZlibInflate(), launch=SIM, stats=stats)
    reasons = {n: r.reason for n, r in zip(files, got) if isinstance(r, Fallback)}
    assert set(reasons) == set(files)
    assert "Adler-32" in reasons["bad_adler.png"]
    assert "size" in reasons["short.png"]
    assert reasons["bad_filter.png"] == "bad filter type"
    assert stats.as_dict() == {"batched": 0, "fallback": 4, "fallback_reasons": {
        r: list(reasons.values()).count(r) for r in reasons.values()}}


def _bad_files(pngs) -> dict[str, bytes]:
    from support.helpers import corrupt_pngs

    files = {p.name: p.read_bytes() for p in corrupt_pngs(pngs)}
    assert len(files) >= 19
    return {**files, "scrambled.png": broken_streams(photo(np.random.default_rng(5), 12, 10))["scrambled.png"]}


def test_corrupt_files_named_under_raise(pngs, tf):
    files = _bad_files(pngs)
    got = decode_pngs(list(files.values()), 3, backend=ZlibInflate(), launch=SIM)
    assert all(isinstance(r, Fallback) for r in got)
    for (name, data), r in zip(files.items(), got):
        with pytest.raises(CorruptImageError) as e:
            finish([r], [data], [f"/data/{name}"], 3, EpochErrors("raise", SkipReport()))
        assert e.value.path == f"/data/{name}" and name in str(e.value)


def test_corrupt_files_left_out_and_recorded_under_skip(pngs, tf):
    files = _bad_files(pngs)
    good = encode_png(photo(np.random.default_rng(1), 6, 5), (2,))
    names = ["good_a.png", *files, "good_b.png"]
    blobs = [good, *files.values(), good]
    got = decode_pngs(blobs, 4, backend=ZlibInflate(), launch=SIM)
    report = SkipReport()
    errors = EpochErrors("skip", report)
    done = finish(got, blobs, names, 4, errors)
    assert [n for n, r in zip(names, done) if r is not None] == ["good_a.png", "good_b.png"]
    assert set(errors.skipped) == set(files) and set(report.of_kind("corrupt")) == set(files)
    assert np.array_equal(done[0], tf.io.decode_png(good, channels=4).numpy())


def test_verified_on_a_gpu_and_channels_checked():
    """The H200 run (docs/png_gpu.md) verified it; the loader's plan no longer offers it
    (tests/test_plan.py: png_decoder="gpu" is refused, naming experimental/png_gpu)."""
    assert PNG_GPU_VERIFIED is True
    with pytest.raises(ValueError, match="Received: channels=2"):
        decode_pngs([b""], 2, backend=ZlibInflate())


def test_large_batches_run_in_parts(tf, monkeypatch):
    from experimental.png_gpu import decoder

    monkeypatch.setattr(decoder, "MAX_BATCH", 3)
    pngs = list(_photo_pngs().values())
    got = decode_pngs(pngs, 3, backend=ZlibInflate(), launch=SIM)
    for data, img in zip(pngs, got):
        assert np.array_equal(img, tf.io.decode_png(data, channels=3).numpy())


def _tf_or_error(tf, data: bytes, channels: int):
    try:
        return tf.io.decode_png(data, channels=channels).numpy()
    except tf.errors.OpError:
        return "error"


def test_unusual_files_fall_back_and_match_tf(tf):
    rng = np.random.default_rng(11)
    rgb = photo(rng, 5, 6)
    idx = np.array([[0, 1, 2, 3, 5, 6]] * 4, np.uint8)  # 5 and 6 are past PLTE's 4 entries
    pal = rng.integers(0, 256, (4, 3), dtype=np.uint8)
    ok = encode_png(rgb, (1,))
    iend = ok.index(b"IEND") - 4
    files = {
        "index_past_plte": (encode_png(idx, (0,), palette=pal), "palette index out of range"),
        "trns_after_idat": (ok[:iend] + chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03") + ok[iend:],
                            "tRNS after IDAT"),
        "trns_16bit_key": (encode_png(rgb, (1,), trns=struct.pack(">3H", 300, 1, 2)),
                           "tRNS key out of 8-bit range"),
        "no_iend": (ok[:iend], "no IEND chunk"),
    }
    stats = PngDecodeStats()
    got = decode_pngs([d for d, _ in files.values()], 3, backend=ZlibInflate(), launch=SIM,
                      stats=stats)
    assert [r.reason for r in got] == [why for _, why in files.values()]
    seen = {}
    done = finish(got, [d for d, _ in files.values()], list(files), 3,
                  lambda err: seen.setdefault(err.path, err))
    for (name, (data, _)), img in zip(files.items(), done):
        want = _tf_or_error(tf, data, 3)
        if isinstance(want, str):
            assert img is None and name in seen
        else:
            assert np.array_equal(img, want), name
    assert stats.as_dict()["fallback"] == 4
