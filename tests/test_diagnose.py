"""diagnose: the pure verdict on constructed rates, and the three constructed end-to-end cases."""

from __future__ import annotations

import argparse
import json
import os

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
    assert f"{cpu:,.0f} img/s with PNG decode" in text and "286 img/s with PNG decode" in text
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
    fakegcs = pytest.importorskip("dali_loader.testing.fakegcs")
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
    assert m.cached_object_bytes == 16 + 1200 * 1600 * 3  # raw entries: header + pixels
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


def test_cli_errors(tmp_path, capsys):
    args = _parse(["diagnose", str(tmp_path / "missing"), "--no-loader"])
    assert args.func(args) == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Received"):
        run_diagnose(str(tmp_path), step_time=-1)
