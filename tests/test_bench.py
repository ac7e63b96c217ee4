"""bench: the three output files with sane content, the input-wait reading, the step harness."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("tensorflow")

from dali_loader.tools import cmd_bench  # noqa: E402
from dali_loader.tools.bench import (input_bound_class, png_decoder_list, results_markdown,  # noqa: E402
                                     run_bench, summarize, timed_epoch, write_results)


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    for i in range(24):
        d = root / f"c{i % 3}"
        d.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return str(root)


def test_input_bound_class():
    assert input_bound_class(0.0) == "not input-bound"
    assert input_bound_class(5.0) == "not input-bound"
    assert input_bound_class(12.0) == "moderately input-bound"
    assert input_bound_class(20.5) == "highly input-bound"


def _batches(n: int, delay: float):
    for _ in range(n):
        time.sleep(delay)
        yield np.zeros((4, 2, 2, 3), np.float32), np.zeros((4,), np.int32)


def test_timed_epoch_constructed_cases():
    # Input 10x slower than the step: almost all of the step time is waiting for input.
    slow_input = timed_epoch("a", _batches(5, 0.1), step_time=0.01)
    # Instant input, a 0.3 s step: the input wait is a sliver. (The steps are long so that
    # a loaded machine's few ms per `next()` stay far below the 5% line: 0.1 s failed at load 7.)
    slow_step = timed_epoch("b", _batches(5, 0.0), step_time=0.3)
    assert slow_input.images == slow_step.images == 20 and slow_input.batches == 5
    assert input_bound_class(slow_input.input_wait_pct) == "highly input-bound"
    assert input_bound_class(slow_step.input_wait_pct) == "not input-bound"
    assert timed_epoch("c", _batches(9, 0.0), 0.0, max_batches=3).batches == 3
    # Slow start-up only: the first batch waits, the steady state does not.
    def slow_start():
        time.sleep(0.5)
        yield from _batches(4, 0.0)
    start = timed_epoch("d", slow_start(), step_time=0.3)
    assert input_bound_class(start.input_wait_pct) == "highly input-bound"
    assert input_bound_class(start.steady_wait_pct) == "not input-bound"
    assert start.first_wait_s >= 0.5
    s = summarize([slow_input, slow_step])
    assert [r["pipeline"] for r in s] == ["a", "b"]
    with pytest.raises(ValueError, match="Received"):
        timed_epoch("x", [], step_time=-1)


def _loader_importable() -> bool:
    try:
        from dali_loader.api import open_loader  # noqa: F401
    except ImportError:
        return False
    return True


def test_bench_writes_three_files(tiny_tree, tmp_path, capsys):
    p = argparse.ArgumentParser()
    cmd_bench.add_parsers(p.add_subparsers(dest="cmd"))
    out, tb = tmp_path / "out", tmp_path / "tb"
    args = p.parse_args(["bench", tiny_tree, "--out", str(out), "--step-time", "0.01",
                         "--batch-size", "8", "--image-size", "32", "32", "--rounds", "2",
                         "--tensorboard", str(tb)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "| pipeline |" in printed and "results.json" in printed

    res = json.loads((out / "results.json").read_text())
    names = [s["pipeline"] for s in res["summary"]]
    assert names[:2] == ["seed", "tuned"]
    if _loader_importable():
        assert "loader-cpu" in names, res["skipped"]
    assert "loader-gpu" in names or "loader-gpu" in res["skipped"]
    assert len(res["runs"]) == 2 * len(names)
    for s in res["summary"]:
        assert s["img_s"] > 0 and s["step_ms"] > 0 and s["rounds"] == 2
        assert 0 <= s["input_wait_pct"] <= 100 and s["cpu_util_pct"] >= 0
    by = {s["pipeline"]: s for s in res["summary"]}
    assert by["seed"]["images"] == 24 - int(24 * 0.2)  # the seed trains on its 80% split
    assert by["tuned"]["images"] == 24
    # seed and tuned decode every image on the CPU, every epoch.
    assert by["seed"]["cpu_decodes_per_epoch"] == 24 - int(24 * 0.2)
    assert by["tuned"]["cpu_decodes_per_epoch"] == 24
    if _loader_importable():
        # The plain loader decodes every file each epoch; the cached row (filled by an
        # untimed epoch first) decodes none in its timed epochs.
        assert "loader-cpu-cached" in names, res["skipped"]
        assert names.index("loader-cpu-cached") == names.index("loader-cpu") + 1
        plain, cached = by["loader-cpu"], by["loader-cpu-cached"]
        assert plain["cpu_decodes_per_epoch"] == 24
        assert "cache_bytes_vs_source" not in plain and "fill_img_s" not in plain
        assert cached["images"] == 24 and cached["cpu_decodes_per_epoch"] == 0
        assert cached["fill_cpu_decodes"] == 24 and cached["fill_img_s"] > 0
        # A filling epoch timed per round, each in a fresh cache folder: their median.
        assert len(cached["fill_rounds_img_s"]) == 2
        assert cached["fill_img_s"] == pytest.approx(statistics.median(cached["fill_rounds_img_s"]))
        # Raw pixels (the CPU path's form) of 40x60 RGB noise: the PNG barely compresses it.
        assert cached["cache_bytes_per_image"] >= 40 * 60 * 3
        assert cached["source_bytes"] == sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tiny_tree) for f in fs)
        assert cached["cache_bytes_vs_source"] == pytest.approx(
            cached["cache_bytes"] / cached["source_bytes"])
        assert 0.5 < cached["cache_bytes_vs_source"] < 2.0
        # No fill epoch among the timed runs: two rounds for every row.
        assert [r["round"] for r in res["runs"] if r["pipeline"] == "loader-cpu-cached"] == [0, 1]
        assert all(r["cpu_decodes"] == 0 for r in res["runs"]
                   if r["pipeline"] == "loader-cpu-cached")
    assert res["command"].startswith("dali-loader bench")
    # Every row names its PNG decoder: libpng for tf.data, the resolved default for the loader.
    from dali_loader.decode import png_cpu

    assert by["seed"]["png_decoder"] == by["tuned"]["png_decoder"] == "libpng"
    # Each epoch the default (the plan's: the native op where built, else libpng); a cached
    # row names the decoder that filled it.
    from dali_loader import probes
    from dali_loader.plan import Options, resolve
    from dali_loader.storage.source import SourceKind

    fill = "wuffs" if png_cpu.available() else "libpng"
    each = resolve(Options(device="cpu"),
                   probes.environment(SourceKind.LOCAL_DISK, ["a.png"])).png_epoch.value
    assert all(by[n]["png_decoder"] == (fill if n.endswith("-cached") else each)
               for n in names if n.startswith("loader-cpu"))
    assert res["png_decoder"] is None

    md = (out / "results.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 1 + len(names)
    assert "input wait" in md and "CPU decodes/epoch" in md and "cache / source bytes" in md
    assert "| decoder |" in md
    # Named for the files present (issue 29): this folder holds PNGs only.
    assert res["formats"] == {"PNG": res["formats"]["PNG"]}
    assert by["seed"]["decoder"] == "libpng (PNG)" and "| seed | libpng (PNG) |" in md
    for n in names:
        assert f"| {n} |" in md
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
             if line.startswith("| ") and not line.startswith("| pipeline")]
    rows = {c[0]: c for c in cells}
    assert rows["tuned"][1] == rows["seed"][1] == "libpng (PNG)"
    assert rows["tuned"][10:] == ["24", "", ""]
    if _loader_importable():
        names_of = {"wuffs": "Wuffs", "libpng": "libpng"}
        assert rows["loader-cpu"][1] == names_of[each] + " (PNG)"
        assert rows["loader-cpu-cached"][1] == names_of[fill] + " (PNG)"
        assert f"the loader rows with {names_of[each]}" in md
        assert rows["loader-cpu"][10:] == ["24", "", ""]
        c = by["loader-cpu-cached"]
        assert rows["loader-cpu-cached"][10:] == [
            "0", f"{c['cache_bytes_per_image'] / 1024:.1f}", f"{c['cache_bytes_vs_source']:.2f}x"]
        assert (f"a filling epoch ran at {c['fill_img_s']:.1f} img/s (median of 2, one per "
                "round in a fresh cache folder;") in md

    with Image.open(out / "throughput.png") as im:
        assert im.format == "PNG" and im.size[0] >= 800 and im.size[1] >= 300
    assert sorted(os.listdir(tb)) == sorted(names)
    assert all(os.listdir(tb / n) for n in names)


def test_write_results_from_constructed_summary(tmp_path):
    run = {"pipeline": "seed", "round": 0, "img_s": 40.0, "step_ms": 3000.0,
           "input_wait_pct": 66.0, "cpu_util_pct": 20.0}
    res = {"source": "gs://b/x", "step_time": 1.0, "batch_size": 128, "image_size": [244, 244],
           "rounds": 1, "cores": 2, "runs": [run], "skipped": {"loader-gpu": "no GPU visible"},
           "summary": [{"pipeline": "seed", "rounds": 1, "images": 128, "img_s": 40.0,
                        "first_round_img_s": 40.0, "step_ms": 3000.0, "input_wait_pct": 66.0,
                        "cpu_util_pct": 20.0, "input_bound": "highly input-bound"}]}
    paths = write_results(res, str(tmp_path))
    assert set(paths) == {"json", "md", "png"}
    assert "| seed |  | 40.0 |" in open(paths["md"]).read()  # no png_decoder recorded: blank
    assert "loader-gpu not run: no GPU visible" in open(paths["md"]).read()


def test_png_decoder_list():
    assert png_decoder_list(None) == [None]
    assert png_decoder_list("libpng") == ["libpng"]
    assert png_decoder_list(["wuffs", "libpng", "wuffs"]) == ["wuffs", "libpng"]
    for bad in ("gpu", ["wuffs", "tf"], []):
        with pytest.raises(ValueError, match="Received: png_decoder="):
            png_decoder_list(bad)


@pytest.mark.skipif(not _loader_importable(), reason="the loader is not importable")
def test_bench_compares_png_decoders(tiny_tree, tmp_path, monkeypatch):
    from dali_loader.decode import png_cpu

    if png_cpu.available():
        p = argparse.ArgumentParser()
        cmd_bench.add_parsers(p.add_subparsers(dest="cmd"))
        args = p.parse_args(["bench", tiny_tree, "--out", str(tmp_path / "both"), "--batch-size",
                             "8", "--image-size", "32", "32", "--rounds", "1", "--only",
                             "loader-cpu", "--png-decoder", "wuffs", "libpng"])
        assert args.func(args) == 0
        res = json.loads((tmp_path / "both" / "results.json").read_text())
        by = {s["pipeline"]: s for s in res["summary"]}
        assert list(by) == ["loader-cpu-wuffs", "loader-cpu-libpng"], res["skipped"]
        assert [by[n]["png_decoder"] for n in by] == ["wuffs", "libpng"]
        assert all(by[n]["cpu_decodes_per_epoch"] == 24 for n in by)
        assert res["png_decoder"] == ["wuffs", "libpng"]
        md = (tmp_path / "both" / "results.md").read_text()
        assert ("| loader-cpu-wuffs | Wuffs (PNG) |" in md
                and "| loader-cpu-libpng | libpng (PNG) |" in md)
        assert "loader-cpu-wuffs/loader-cpu-libpng = " in md
        assert "(--png-decoder wuffs libpng)" in md
    # Without Wuffs (pywuffs, nor the native core's TF op) the default is libpng, and asking
    # for Wuffs skips the row with the reason.
    from dali_loader import probes

    monkeypatch.setattr(png_cpu, "available", lambda: False)
    monkeypatch.setattr(probes, "tf_png_op", lambda: False)
    res = run_bench(tiny_tree, batch_size=8, image_size=(32, 32), rounds=1, max_batches=1,
                    include=["loader-cpu"], progress=False)
    assert [(s["pipeline"], s["png_decoder"]) for s in res["summary"]] == [
        ("loader-cpu", "libpng")]
    assert "| loader-cpu | libpng (PNG) |" in results_markdown(res)
    res = run_bench(tiny_tree, batch_size=8, image_size=(32, 32), rounds=1, max_batches=1,
                    include=["loader-cpu"], progress=False, png_decoder="wuffs")
    assert res["summary"] == [] and "build_tf" in res["skipped"]["loader-cpu"]
    with pytest.raises(ValueError, match="Received: png_decoder='gpu'"):
        run_bench(tiny_tree, png_decoder="gpu")
