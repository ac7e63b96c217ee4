"""diagnose: the pure verdict on constructed rates, and the three constructed end-to-end cases."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re

import numpy as np
import pytest
from PIL import Image

from dali_loader.tools import cmd_diagnose
from dali_loader.tools.diagnose import Measurements, format_report, interp_rate, run_diagnose, to_json, verdict


def _m(**kw) -> Measurements:
    base = dict(source="gs://b/data", num_files=1000, listing_s=0.5, cores=2, sample=64,
                mean_object_bytes=300e3, latency_p50_s=0.048, latency_p90_s=0.06,
                fetch_rates={1: 20.8, 2: 41.0, 8: 160.0, 32: 600.0, 64: 1200.0, 128: 1500.0},
                decode_per_core=170.0, decode_all_cores=340.0, resize_per_core=900.0,
                resize_all_cores=1800.0, batch_size=32, step_time=0.0)
    base.update(kw)
    return Measurements(**base)


# ------------------------------------------------------------------ the pure verdict
def test_interp_rate():
    rates = {1: 10.0, 8: 80.0, 32: 200.0}
    assert interp_rate(rates, 1) == 10.0
    assert interp_rate(rates, 2) == pytest.approx(20.0)  # Little's law between 1 and 8
    assert interp_rate(rates, 20) == pytest.approx(140.0)
    assert interp_rate(rates, 500) == 200.0  # clamped: no extrapolation past saturation
    assert interp_rate(rates, 0.5) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="Received"):
        interp_rate({}, 4)
    with pytest.raises(ValueError, match="Received"):
        interp_rate(rates, 0)


def test_verdict_storage_quotes_numbers():
    v = verdict(_m())
    assert v["bottleneck"] == "storage"
    assert v["stage_rates"]["storage"] == pytest.approx(41.0)
    text = " ".join(v["advice"])
    assert "48 ms per object" in text and "~2 reads in flight" in text and "~41 img/s" in text
    assert "64 reads in flight" in text and "dali-loader prefetch gs://b/data" in text
    # With 64 in flight storage (1200/s) outruns the CPU: the loader is decode-bound.
    assert v["bottleneck_with_loader"] == "decode"
    assert v["expected_loader_img_s"] == pytest.approx(1 / (1 / 340 + 1 / 1800))


def test_verdict_decode():
    fast = {1: 3000.0, 2: 5000.0, 8: 8000.0, 64: 9000.0}
    v = verdict(_m(source="/data", fetch_rates=fast, latency_p50_s=0.0003))
    assert v["bottleneck"] == "decode" and v["bottleneck_with_loader"] == "decode"
    text = " ".join(v["advice"])
    assert "170 img/s per core" in text and "340 img/s on all 2 cores" in text
    assert "JPEG, not PNG" in text  # never claims GPU PNG decode


def test_verdict_decode_quotes_the_cached_epoch():
    fast = {1: 3000.0, 2: 5000.0, 8: 8000.0, 64: 9000.0}
    m = _m(source="/data", fetch_rates=fast, latency_p50_s=0.0003, cached_all_cores=1234.0,
           cached_object_bytes=450e3)
    v = verdict(m)
    assert v["bottleneck"] == "decode" and v["cache_lifts_decode"] is True
    cache = [a for a in v["advice"] if "GPU-ready cache" in a]
    assert len(cache) == 1, v["advice"]
    text = cache[0]
    assert "gpu_ready=True" in text
    assert "dali-loader prefetch /data --gpu-ready --cache-dir DIR" in text
    assert f"about {450e3 * m.num_files / 1e6:,.1f} MB for all {m.num_files:,} files" in text
    cpu = 1 / (1 / 340 + 1 / 1800)  # PNG decode + resize on all cores: 286 img/s
    assert f"{cpu:,.0f} img/s with decode" in text and "286 img/s with decode" in text
    assert "1,234 img/s for a cached epoch's decode+resize" in text
    assert "1.5x the source's bytes" in text  # 450 KB entries for 300 KB objects
    assert f"lifts the decode bound {1234 / cpu:.1f}x" in text
    assert "JPEG, not PNG" in " ".join(v["advice"])  # never claims GPU PNG decode
    # The consumer at 64 img/s would bound the cached pipeline.
    slow_step = verdict(_m(source="/data", fetch_rates=fast, cached_all_cores=1234.0,
                           step_time=0.25, batch_size=32))
    assert slow_step["bottleneck"] == "consumer" and slow_step["cache_lifts_decode"] is None
    assert not any("GPU-ready cache" in a for a in slow_step["advice"])
    # Not faster than decode+resize: the advice says it would not help.
    slow = verdict(_m(source="/data", fetch_rates=fast, cached_all_cores=200.0))
    assert slow["cache_lifts_decode"] is False
    assert "200 img/s for a cached epoch" in " ".join(slow["advice"])
    assert "would not lift the decode bound" in " ".join(slow["advice"])
    # Not measured: no cache sentence, and the verdict is unchanged.
    plain = verdict(_m(source="/data", fetch_rates=fast))
    assert plain["cache_lifts_decode"] is None
    assert not any("GPU-ready cache" in a for a in plain["advice"])
    assert plain["bottleneck"] == v["bottleneck"] and plain["stage_rates"] == v["stage_rates"]
    # The JSON and the report carry it.
    d = to_json(m)
    json.dumps(d, allow_nan=False)
    assert d["cached_all_cores"] == 1234.0 and d["cached_object_bytes"] == 450e3
    assert d["cache_lifts_decode"] is True
    assert to_json(_m())["cached_all_cores"] is None
    r = format_report(m)
    assert "cached decode+resize" in r and "1,234 img/s on 2 cores" in r and "450 KB" in r
    assert "cached decode+resize" not in format_report(_m())


def _flat(report: str) -> str:
    """The report with runs of spaces as one (its columns' widths vary)."""
    return re.sub(r" +", " ", report)


FAST_READS = {1: 3000.0, 2: 5000.0, 8: 8000.0, 64: 9000.0}


def test_verdict_uses_the_png_decoder_that_runs():
    libpng = 1 / (1 / 340 + 1 / 1800)  # decode+resize on all cores: 286 img/s
    wuffs = 1 / (1 / 680 + 1 / 1800)  # 494 img/s
    m = _m(source="/data", fetch_rates=FAST_READS, png_decoder="wuffs", wuffs_per_core=350.0,
           wuffs_all_cores=680.0, sample_pngs=64, png_fallbacks=2)
    v = verdict(m)
    # tf.data (the seed) decodes with libpng; this loader with Wuffs.
    assert v["bottleneck"] == "decode" and v["bottleneck_with_loader"] == "decode"
    assert v["stage_rates"]["decode"] == pytest.approx(libpng)
    assert v["stage_rates_with_loader"]["decode"] == pytest.approx(wuffs)
    assert v["expected_tfdata_img_s"] == pytest.approx(libpng)
    assert v["expected_loader_img_s"] == pytest.approx(wuffs)
    assert v["png_decoder"] == "wuffs" and v["wuffs_vs_libpng"] == pytest.approx(2.0)
    assert v["decode_bounds"] == {"libpng": pytest.approx(libpng), "wuffs": pytest.approx(wuffs)}
    text = " ".join(v["advice"])
    assert "This loader decodes PNGs with Wuffs (runs by default): 680 img/s on 2 cores" in text
    assert "2.0x libpng" in text and "2 of the 64 sampled PNGs to libpng" in text
    assert "This loader: expect ~494 img/s" in text and "JPEG, not PNG" in text
    d = to_json(m)
    json.dumps(d, allow_nan=False)
    assert d["png_decoder"] == "wuffs" and d["png_fallbacks"] == 2 and d["sample_pngs"] == 64
    assert d["decode_bounds"]["wuffs"] == pytest.approx(wuffs)
    r = _flat(format_report(m))
    assert "decode, libpng 170 img/s per core, 340 img/s on 2 cores" in r
    assert "decode, Wuffs 350 img/s per core, 680 img/s on 2 cores; leaves 2 of 64" in r
    assert (f"decode+resize libpng: 286 img/s; Wuffs (runs by default): 494 img/s "
            f"({wuffs / libpng:.2f}x)") in r
    assert "with this loader (64 in flight), Wuffs decode:" in r and "decode 494 img/s" in r
    assert "(with this loader: decode; PNG decoder: Wuffs)" in r

    # png_decoder="libpng" forced: Wuffs is timed and quoted, the loader's bound is libpng's.
    forced = dataclasses.replace(m, png_decoder="libpng", png_decoder_option="libpng")
    f = verdict(forced)
    assert f["png_decoder"] == "libpng" and f["decode_bounds"] == v["decode_bounds"]
    assert f["stage_rates_with_loader"]["decode"] == pytest.approx(libpng)
    assert f["expected_loader_img_s"] == pytest.approx(libpng)
    assert ('This loader decodes PNGs with libpng (runs: png_decoder="libpng"): Wuffs '
            '(png_decoder="wuffs"; the default for gpu_ready fills) decodes 680 img/s'
            ) in " ".join(f["advice"])
    r = _flat(format_report(forced))
    assert 'libpng (runs: png_decoder="libpng"): 286 img/s; Wuffs: 494 img/s' in r
    assert "PNG decoder: libpng)" in r and "(64 in flight), libpng decode" in r

    # Wuffs not built: libpng runs and the report says how to build it.
    plain = _m(source="/data", fetch_rates=FAST_READS)
    p = verdict(plain)
    assert p["png_decoder"] == "libpng" and p["decode_bounds"]["wuffs"] is None
    assert p["wuffs_vs_libpng"] is None
    assert ("Wuffs (exactly TF's pixels; the default for gpu_ready fills) is not built here; "
            "`pip install --no-build-isolation` (in a checkout, `make install`) builds the "
            "native PNG core") in " ".join(p["advice"])
    r = _flat(format_report(plain))
    assert ("decode, Wuffs not built (`pip install --no-build-isolation` (in a checkout, "
            "`make install`) builds the native PNG core)") in r
    assert "decode+resize libpng (runs by default): 286 img/s" in r

    with pytest.raises(ValueError, match="Received: wuffs_all_cores=None"):
        verdict(_m(png_decoder="wuffs"))
    with pytest.raises(ValueError, match="Received: png_decoder='gpu'"):
        verdict(_m(png_decoder="gpu"))


def test_cache_advice_compares_with_the_loader_decoder():
    # A cached epoch at 400 img/s beats libpng's 286 but not Wuffs' 494: the cache is the
    # loader's, so the advice compares it with the decoder the loader runs.
    m = _m(source="/data", fetch_rates=FAST_READS, cached_all_cores=400.0)
    assert verdict(m)["cache_lifts_decode"] is True
    w = verdict(dataclasses.replace(m, png_decoder="wuffs", wuffs_all_cores=680.0))
    assert w["cache_lifts_decode"] is False
    assert "against 494 img/s with decode by Wuffs" in " ".join(w["advice"])


def test_verdict_consumer():
    fast = {1: 3000.0, 2: 5000.0, 8: 8000.0, 64: 9000.0}
    v = verdict(_m(fetch_rates=fast, step_time=0.5, batch_size=32))
    assert v["bottleneck"] == "consumer" and v["stage_rates"]["consumer"] == pytest.approx(64.0)
    assert "500 ms step per batch of 32" in v["advice"][0]


def test_json_has_no_infinities_and_report_renders():
    m = _m(step_time=0.0, loader_rate=250.0, loader_device="cpu")
    d = to_json(m)
    json.dumps(d, allow_nan=False)
    assert d["stage_rates"]["consumer"] is None and d["consumer_img_s"] is None
    assert d["fetch_rates"]["128"] == 1500.0
    r = format_report(m)
    assert "bottleneck: storage" in r and "250 img/s (cpu)" in r and "reads, 32 in flight" in r


# --------------------------------------------------------- three constructed cases
def _pngs(root, n: int, size: tuple[int, int], noise: bool, classes: int = 2) -> str:
    rng = np.random.default_rng(0)
    for i in range(n):
        d = os.path.join(root, f"c{i % classes}")
        os.makedirs(d, exist_ok=True)
        if noise:
            arr = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        else:
            arr = np.full((*size, 3), (i * 37) % 256, np.uint8)
        Image.fromarray(arr).save(os.path.join(d, f"{i:04d}.png"), compress_level=1)
    return str(root)


FAST = dict(levels=(1, 8), loader_in_flight=16, measure_loader=False, budget_s=0.2)


def test_case_slow_gcs_is_storage(tmp_path, monkeypatch):
    fakegcs = pytest.importorskip("support.fakegcs")
    root = _pngs(tmp_path, 16, (32, 32), noise=False)
    with fakegcs.FakeGCS.from_directory(root, bucket="b", prefix="data",
                                        faults=fakegcs.Faults(latency=0.1)) as srv:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", srv.endpoint)
        m = run_diagnose("gs://b/data", sample=16, **FAST)
    assert m.num_files == 16 and m.latency_p50_s >= 0.1
    v = verdict(m)
    assert v["bottleneck"] == "storage", format_report(m)
    assert f"{m.latency_p50_s * 1000:.0f} ms per object" in v["advice"][0]


def test_case_big_pngs_no_step_is_decode(tmp_path):
    root = _pngs(tmp_path, 4, (1200, 1600), noise=True)
    m = run_diagnose(root, sample=4, **FAST)
    v = verdict(m)
    assert v["bottleneck"] == "decode", format_report(m)
    # Decode-bound: a cached epoch was timed too, and the advice quotes it.
    assert m.cached_all_cores is not None and m.cached_all_cores > 0
    # Compact entries (what gpu_ready=True writes): these noisy pixels barely compress.
    assert m.cached_form == "compact" and 0 < m.cached_object_bytes < 1.01 * 1200 * 1600 * 3
    assert "its compact entries take" in " ".join(v["advice"])
    assert f"{m.cached_all_cores:,.0f} img/s for a cached epoch" in " ".join(v["advice"])
    assert to_json(m)["cached_all_cores"] == m.cached_all_cores


def test_case_small_pngs_slow_step_is_consumer(tmp_path):
    root = _pngs(tmp_path, 16, (32, 32), noise=False)
    m = run_diagnose(root, sample=16, step_time=0.5, batch_size=32, **FAST)
    v = verdict(m)
    assert v["bottleneck"] == "consumer", format_report(m)
    assert v["stage_rates"]["consumer"] == pytest.approx(64.0)
    if v["bottleneck_with_loader"] != "decode":  # nothing for the cache to lift: not timed
        assert m.cached_all_cores is None and v["cache_lifts_decode"] is None


def test_run_measures_both_decoders(tmp_path, monkeypatch):
    from dali_loader.decode import png_cpu

    root = _pngs(tmp_path, 5, (24, 32), noise=True)
    # An RGB file with a tRNS colour key: Wuffs leaves it to libpng.
    Image.fromarray(np.zeros((24, 32, 3), np.uint8)).save(
        os.path.join(root, "c0", "key.png"), transparency=(0, 0, 0))
    from dali_loader import probes
    from dali_loader.decode import png_native

    if png_native.available() or png_cpu.available():
        m = run_diagnose(root, sample=6, png_decoder="wuffs", **FAST)
        assert m.png_decoder == "wuffs" and m.png_decoder_option == "wuffs"
        assert m.wuffs_per_core > 0 and m.wuffs_all_cores > 0
        assert (m.sample_pngs, m.png_fallbacks) == (6, 1)
        v = verdict(m)
        assert v["stage_rates_with_loader"]["decode"] == pytest.approx(v["decode_bounds"]["wuffs"])
        assert v["stage_rates"]["decode"] == pytest.approx(v["decode_bounds"]["libpng"])
        assert "leaves 1 of 6 sampled PNGs to libpng" in format_report(m)
        forced = run_diagnose(root, sample=6, png_decoder="libpng", **FAST)
        assert forced.png_decoder == "libpng" and forced.wuffs_all_cores > 0
        f = verdict(forced)
        assert f["stage_rates_with_loader"]["decode"] == pytest.approx(
            f["decode_bounds"]["libpng"])
    # Without Wuffs (pywuffs, nor the native core and its TF op): libpng runs, and asking
    # for Wuffs fails.
    monkeypatch.setattr(png_cpu, "available", lambda: False)
    monkeypatch.setattr(png_native, "available", lambda: False)
    monkeypatch.setattr(probes, "tf_png_op", lambda: False)
    m = run_diagnose(root, sample=6, **FAST)
    assert m.png_decoder == "libpng" and m.wuffs_all_cores is None and m.png_fallbacks is None
    v = verdict(m)
    assert v["decode_bounds"]["wuffs"] is None
    assert v["stage_rates_with_loader"]["decode"] == pytest.approx(v["decode_bounds"]["libpng"])
    with pytest.raises(ImportError, match="build_tf"):
        run_diagnose(root, sample=6, png_decoder="wuffs", **FAST)
    with pytest.raises(ValueError, match="Received: png_decoder='gpu'"):
        run_diagnose(root, png_decoder="gpu")


# ------------------------------------------------------------------------- the CLI
def _parse(argv):
    p = argparse.ArgumentParser()
    cmd_diagnose.add_parsers(p.add_subparsers(dest="cmd"))
    return p.parse_args(argv)


def test_cli_json(tmp_path, capsys):
    root = _pngs(tmp_path, 6, (24, 24), noise=False)
    args = _parse(["diagnose", root, "--json", "--no-loader", "--sample", "6", "--step-time",
                   "0.25", "--batch-size", "8", "--image-size", "16", "16"])
    assert args.func(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bottleneck"] in ("storage", "decode", "consumer")
    assert d["consumer_img_s"] == pytest.approx(32.0)
    assert set(d["fetch_rates"]) >= {"1", "8", "32", "128"} and d["advice"]
    assert d["png_decoder"] in ("wuffs", "libpng") and d["decode_bounds"]["libpng"] > 0
    args = _parse(["diagnose", root, "--json", "--no-loader", "--sample", "6",
                   "--png-decoder", "libpng"])
    assert args.func(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["png_decoder"] == "libpng" and d["png_decoder_option"] == "libpng"
    assert d["expected_loader_img_s"] == pytest.approx(min(
        d["stage_rates_with_loader"]["storage"], d["decode_bounds"]["libpng"]))


def test_cli_errors(tmp_path, capsys):
    args = _parse(["diagnose", str(tmp_path / "missing"), "--no-loader"])
    assert args.func(args) == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Received"):
        run_diagnose(str(tmp_path), step_time=-1)


# ---------------------------------------------------- the decoder named for the files present
def test_decoder_name_for_the_formats_present():
    from dali_loader.tools.decoders import decoder_name, format_counts

    assert decoder_name({"JPEG": 64}, "libpng") == "libjpeg-turbo (JPEG)"
    assert decoder_name({"PNG": 64}, "wuffs") == "Wuffs (PNG)"
    assert decoder_name({"PNG": 24, "JPEG": 40}, "libpng") == (
        "libpng (PNG, 24 of 64) + libjpeg-turbo (JPEG, 40 of 64)")
    assert decoder_name(None, "wuffs") == "Wuffs"  # formats not sampled: the PNG decoder
    assert format_counts([b"\xff\xd8\xff\xe0", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"BM", b"x"]) == {
        "PNG": 1, "JPEG": 1, "GIF": 1, "BMP": 1, "other": 1}


def _jpegs(root, n: int, start: int = 0) -> str:
    rng = np.random.default_rng(1)
    for i in range(start, start + n):
        d = os.path.join(root, f"c{i % 2}")
        os.makedirs(d, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(
            os.path.join(d, f"j{i:03d}.jpg"), quality=90)
    return str(root)


def test_jpeg_folder_names_the_jpeg_decoder_not_png_ones(tmp_path):
    """Issue 29: a JPEG folder's report named libpng and "Wuffs ... 0 of 0 sampled PNGs"."""
    root = _jpegs(tmp_path, 6)
    for png_decoder in (None, "libpng"):
        m = run_diagnose(root, sample=6, png_decoder=png_decoder, **FAST)
        assert m.sample_formats == {"JPEG": 6} and m.decode_by_format is None
        # The measurements and the verdict; the plan below them names the PNG decoder the
        # loader would run (png_epoch), whatever the files.
        r, plan = format_report(m).split("\nplan (")
        assert "png_epoch" in plan and re.search(r"engine +tf-kernels", plan), plan
        assert "decode, libjpeg-turbo (JPEG) " in r
        assert "libpng" not in r and "Wuffs" not in r and "PNG decoder" not in r, r
        assert "decoder: libjpeg-turbo (JPEG))" in r
        advice = " ".join(verdict(m)["advice"])
        assert "PNG" not in advice and "libpng" not in advice, advice


def test_mixed_folder_names_each_decoder_with_its_own_bound(tmp_path):
    root = _pngs(tmp_path, 4, (24, 32), noise=True)
    _jpegs(tmp_path, 4, start=10)
    m = run_diagnose(root, sample=8, **FAST)
    assert m.sample_formats == {"PNG": 4, "JPEG": 4}
    assert set(m.decode_by_format) == {"PNG", "JPEG"} and min(m.decode_by_format.values()) > 0
    r = format_report(m)
    assert "decode, libpng (PNG, 4 of 8) + libjpeg-turbo (JPEG, 4 of 8) " in r
    assert re.search(r"decode by format +PNG [\d,]+ img/s, JPEG [\d,]+ img/s", r), r
